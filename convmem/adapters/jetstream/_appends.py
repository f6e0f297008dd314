"""What the JetStream writer's two paths share: the append on its way, the session's last message, acks.

`PendingAppend` is one append on its way: what to store and whom to settle.
`Last` is what the writer keeps of a session: its last event seq and the
subject's last message (for the server's conditional publish). `parse_ack`
reads the server's acknowledgement; a refusal of a conditional publish is
`Refused`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import nats.js.errors

from convmem.actors import Settle
from convmem.events import Event, MemoryKey

__all__ = ["EMPTY", "EXPECTED", "Last", "PendingAppend", "Refused", "parse_ack"]

EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_REFUSED = frozenset({10071, 10164, 10201})  # wrong last sequence (two forms); duplicate id in a batch


class Last(NamedTuple):
    """What an append must know of a session: its last event seq and the subject's last message."""

    seq: int
    stream_seq: int
    event_id: str | None


EMPTY = Last(0, 0, None)


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
        raise ValueError(f"not a JetStream acknowledgement: {exc}") from None
    error = ack.get("error")
    if error is None:
        return ack
    if error.get("err_code") in _REFUSED:
        raise Refused(error.get("description"))
    raise nats.js.errors.APIError(
        code=error.get("code"), description=error.get("description"), err_code=error.get("err_code")
    )
