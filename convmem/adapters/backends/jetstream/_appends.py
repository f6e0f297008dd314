"""What the JetStream writer's two paths share: the append on its way, the session's last message, acks.

`PendingAppend` is one append on its way: what to store and whom to settle.
`Last` is what the writer keeps of a session: its last event seq and the
subject's last message (for the server's conditional publish). `parse_ack`
reads the server's acknowledgement; a refusal of a conditional publish is
`Refused`. `too_large` is the permanent error of an event that the server's
``max_payload`` (less `HEADER_ROOM` for headers) cannot hold, raised before
anything is sent.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import nats.js.errors

from convmem.actors import Settle
from convmem.errors import InvalidInput, InvalidTurn, LogUnavailable
from convmem.events import Event, ItemsAdded, MemoryKey, TurnAdded, TurnsAdopted

__all__ = [
    "EMPTY",
    "EXPECTED",
    "HEADER_ROOM",
    "RECENT_SESSIONS",
    "Last",
    "PendingAppend",
    "Refused",
    "parse_ack",
    "too_large",
]

EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_REFUSED = frozenset({10071, 10164, 10201})  # wrong last sequence (two forms); duplicate id in a batch


class Last(NamedTuple):
    """What an append must know of a session: its last event seq and the subject's last message."""

    seq: int
    stream_seq: int
    event_id: str | None


EMPTY = Last(0, 0, None)

RECENT_SESSIONS = 65_536
"""Sessions written most recently whose `Last` (and subject) a log keeps: a write to one of them
publishes at once; a write to an older one first asks the stream's leader for the session's last
message (one request more). Sized for a service that writes to tens of thousands of sessions in
turn (the peers measure at 10,000 sessions wrote to each in round robin, and 8,192 made every
write pay the request), at about 0.4 KiB a session (some 28 MiB when full). Shared fairly between
tenants (`FairCache`): past the bound the tenant holding the most gives up its least recently
stored session, so one tenant's many sessions never make another's writes pay the request."""


class PendingAppend(NamedTuple):
    """One append handed to the loop: what to store, and whom to tell."""

    key: MemoryKey
    subject: str
    events: tuple[Event, ...]
    payloads: tuple[bytes, ...]
    expected: int
    """The session seq the events follow."""
    done: Settle[int]
    """Settled with the session's last seq, or the log error."""
    what: str
    """How errors name the append ("append to <key>")."""


class Refused(Exception):
    """The server refused a conditional publish (the subject moved on, or an id is a duplicate)."""


_ACKS = msgspec.json.Decoder(dict[str, Any])


def parse_ack(data: bytes) -> dict[str, Any]:
    try:
        ack = _ACKS.decode(data)
    except msgspec.DecodeError as exc:
        raise LogUnavailable(f"the NATS server's answer is not a JetStream acknowledgement: {exc}") from None
    error = ack.get("error")
    if error is None:
        return ack
    if error.get("err_code") in _REFUSED:
        raise Refused(error.get("description"))
    raise nats.js.errors.APIError(
        code=error.get("code"), description=error.get("description"), err_code=error.get("err_code")
    )


HEADER_ROOM = 1024
"""Bytes of the server's ``max_payload`` kept for an event's headers; the encoded event gets the rest."""


def too_large(event: Event, offset: int, size: int, max_payload: int) -> InvalidInput:
    """The permanent error of an event too large for the server (a turn's is `InvalidTurn`)."""
    problem = (
        f"encodes to {size:,} bytes, over the {max_payload - HEADER_ROOM:,} an event may take on this "
        f"NATS server (its max_payload, {max_payload:,} bytes, less {HEADER_ROOM} for headers); "
        "nothing was stored: shorten it, keep large artifacts outside the turn, or raise max_payload"
    )
    if isinstance(event, TurnAdded | TurnsAdopted):
        return InvalidTurn("turn", problem)
    if isinstance(event, ItemsAdded):
        return InvalidTurn("items", problem)
    return InvalidInput(f"events[{offset}] ({type(event).__name__})", problem)
