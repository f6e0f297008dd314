"""One codec for events: msgpack for the log, JSON for humans.

Versioning rules (msgspec's, applied to stored events):

1. A new field gets a default, so old bytes still decode.
2. A field is never renamed, retyped or removed; tags never change.
3. A breaking change is a new tag plus a pure upcaster in `UPCASTERS` that
   turns the old event's plain mapping into the new one's.
4. Every schema change is marked in CHANGELOG.md, and the golden bytes of
   every version stay under tests/golden/ and must keep decoding.

Sealed bytes (encrypted at rest) begin with ``0xC1``, the one byte msgpack
never uses; the log opens them before anyone decodes, so the codec meets
them only when they could not be opened, and says so (`SealBroken`).

A reader meeting a tag it does not know gets `UnknownEventType` carrying the
event's own `seq`, so a replay may skip it and go on without a gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from convmem.errors import EventDecodeError, SealBroken, UnknownEventType
from convmem.events._checks import as_stored
from convmem.events._events import (
    BacklogTrimmed,
    Event,
    HealthChanged,
    HistoryCompacted,
    ItemPopped,
    ItemsAdded,
    SessionCleared,
    SessionErased,
    SessionRepaired,
    SessionRestored,
    SessionStarted,
    SummaryProduced,
    TurnAdded,
    TurnsAdopted,
)

__all__ = [
    "EVENT_TYPES",
    "UPCASTERS",
    "AnyEvent",
    "decode_event",
    "decode_event_json",
    "encode_event",
    "encode_event_json",
    "event_tag",
]

AnyEvent = (
    SessionStarted
    | TurnAdded
    | SummaryProduced
    | HealthChanged
    | BacklogTrimmed
    | SessionCleared
    | SessionRestored
    | SessionErased
    | ItemsAdded
    | ItemPopped
    | TurnsAdopted
    | HistoryCompacted
    | SessionRepaired
)
EVENT_TYPES: tuple[type[Event], ...] = (
    SessionStarted,
    TurnAdded,
    SummaryProduced,
    HealthChanged,
    BacklogTrimmed,
    SessionCleared,
    SessionRestored,
    SessionErased,
    ItemsAdded,
    ItemPopped,
    TurnsAdopted,
    HistoryCompacted,
    SessionRepaired,
)
_TAGS = frozenset(str(t.__struct_config__.tag) for t in EVENT_TYPES)

UPCASTERS: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""Old tag -> pure function from the old event's mapping to a current one. None yet."""


class _Envelope(msgspec.Struct):
    """What any event, known or not, must carry: its tag and its session sequence."""

    type: str
    seq: int | None = None


_msgpack_encoder = msgspec.msgpack.Encoder()
_msgpack_decoder: msgspec.msgpack.Decoder[AnyEvent] = msgspec.msgpack.Decoder(AnyEvent)
_msgpack_decode = _msgpack_decoder.decode
_msgpack_envelope = msgspec.msgpack.Decoder(_Envelope)
_msgpack_raw = msgspec.msgpack.Decoder(dict[str, Any])
_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(AnyEvent)
_json_envelope = msgspec.json.Decoder(_Envelope)
_json_raw = msgspec.json.Decoder(dict[str, Any])
_SEALED = b"\xc1"
"""The first byte of sealed (encrypted) bytes, never a msgpack one (see `convmem.adapters.backends.keys`)."""
_PATH = re.compile(r"- at `([^`]*)`$")


def event_tag(event: Event) -> str:
    """The stable domain tag of an event (``"turn.added"``)."""
    return str(event.__struct_config__.tag)


def encode_event(event: Event) -> bytes:
    """Encode an event for the log (msgpack)."""
    return _msgpack_encoder.encode(event)


def encode_event_json(event: Event) -> bytes:
    """Encode an event as JSON, for people and exports."""
    return _json_encoder.encode(event)


def decode_event(data: bytes, *, seq: int | None = None) -> AnyEvent:
    """Decode log bytes; raises `EventDecodeError` / `UnknownEventType` with the bad path."""
    try:  # a replay decodes every stored event here: a valid one returns without another call
        return _msgpack_decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, ValueError, OverflowError, RecursionError):
        pass  # `_decode` decodes it again to say why, or to upcast it
    if data[:1] == _SEALED:  # no msgpack value starts so: sealed bytes its log could not open
        raise SealBroken("an encrypted event", seq=seq)
    return _decode(data, seq, _msgpack_decoder, _msgpack_envelope, _msgpack_raw)


def decode_event_json(data: bytes | str, *, seq: int | None = None) -> AnyEvent:
    """Decode a JSON event (an export line)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _decode(raw, seq, _json_decoder, _json_envelope, _json_raw)


def _decode(
    data: bytes,
    seq: int | None,
    decoder: msgspec.msgpack.Decoder[AnyEvent] | msgspec.json.Decoder[AnyEvent],
    envelope: msgspec.msgpack.Decoder[_Envelope] | msgspec.json.Decoder[_Envelope],
    raw: msgspec.msgpack.Decoder[dict[str, Any]] | msgspec.json.Decoder[dict[str, Any]],
) -> AnyEvent:
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        error: msgspec.MsgspecError = exc
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, OverflowError, RecursionError) as exc:
        # Malformed bytes: msgspec reports bad UTF-8 inside a string as UnicodeDecodeError,
        # and a value nested deeper than it can read as RecursionError.
        raise EventDecodeError(f"not a valid encoded event ({exc})", path="$", seq=seq) from None
    try:  # stored before a rule on new values existed (a NaN artifact): it still decodes
        with as_stored():
            return decoder.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, ValueError, OverflowError, RecursionError):
        pass
    try:
        head = envelope.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, ValueError, OverflowError, RecursionError):
        raise _validation_error(error, seq) from None
    if head.type in UPCASTERS:
        mapping = UPCASTERS[head.type](raw.decode(data))
        try:
            upcast: AnyEvent = msgspec.convert(mapping, AnyEvent)
            return upcast
        except msgspec.ValidationError as exc:
            raise _validation_error(exc, seq) from None
    if head.type not in _TAGS:
        raise UnknownEventType(head.type, event_seq=head.seq, seq=seq) from None
    raise _validation_error(error, seq) from None


def _validation_error(exc: msgspec.MsgspecError, seq: int | None) -> EventDecodeError:
    message = str(exc)
    match = _PATH.search(message)
    path = match.group(1) if match else "$"
    return EventDecodeError(message, path=path, seq=seq)
