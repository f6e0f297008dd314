"""Whatever bytes the log holds, decoding fails only with EventDecodeError."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convmem.errors import EventDecodeError
from convmem.events import decode_event, decode_event_json
from convmem.projections import SessionState, decode_state, encode_state

# Integers as msgpack and JSON can carry them (msgspec refuses to encode others, so such a map
# could never be in the log); hypothesis reaches for -2**63 - 1 once other modules' constants join its pool.
_INTEGERS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
_values = st.recursive(
    st.none() | st.booleans() | _INTEGERS | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_event_decode_error(data: bytes) -> None:
    """Arbitrary bytes either decode to an event or raise EventDecodeError, never anything else."""
    try:
        decode_event(data, seq=7)
    except EventDecodeError as exc:
        assert exc.seq == 7  # noqa: PT017 - most inputs decode to nothing; pytest.raises cannot say 'if it raises'


@given(
    st.dictionaries(st.sampled_from(["type", "seq", "event_id", "at", "index", "turn", "summary"]), _values)
)
def test_event_shaped_maps_raise_only_event_decode_error(fields: dict[str, object]) -> None:
    """Maps with event-like keys and wrong values are refused with the bad field's path."""
    for encoded, decode in (
        (msgspec.msgpack.encode(fields), decode_event),
        (msgspec.json.encode(fields), decode_event_json),
    ):
        try:
            decode(encoded)
        except EventDecodeError as exc:
            assert exc.path is None or exc.path.startswith("$")  # noqa: PT017 - raising is optional here
        except msgspec.EncodeError:
            pass


def test_a_value_nested_too_deep_to_read_is_event_decode_error() -> None:
    """Stored bytes nesting deeper than the decoder can read, even in a field it skips: EventDecodeError."""
    deep_json = b'{"type": "turn.added", "extra": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"
    deep_msgpack = b"\x82\xa4type\xaaturn.added\xa5extra" + b"\x91" * 5_000 + b"\x90"
    for decode, data in ((decode_event_json, deep_json), (decode_event, deep_msgpack)):
        with pytest.raises(EventDecodeError) as raised:
            decode(data, seq=3)
        assert raised.value.seq == 3


def test_snapshot_bytes_that_cannot_be_read_are_event_decode_error() -> None:
    """A snapshot with bad UTF-8 or nesting too deep is EventDecodeError (then rebuilt from the log)."""
    good = encode_state(SessionState())
    for data in (good.replace(b"healthy", b"health\xff"), b"\x81\xa4junk" + b"\x91" * 5_000 + b"\x90"):
        with pytest.raises(EventDecodeError):
            decode_state(data)
