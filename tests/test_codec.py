"""The event codec: stable tags, golden bytes, clear decode errors, unknown tags skippable."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from golden.make_golden import EXAMPLES, GOLDEN_DIR

from convmem.errors import EventDecodeError, InvalidTurn, UnknownEventType
from convmem.events import (
    EVENT_TYPES,
    ConversationTurn,
    Event,
    HealthChanged,
    MemoryHealth,
    SessionErased,
    TurnAdded,
    decode_event,
    decode_event_json,
    encode_event,
    encode_event_json,
    event_tag,
)
from convmem.events import _codec as codec_module

TAGS = {
    "SessionStarted": "session.started",
    "TurnAdded": "turn.added",
    "SummaryProduced": "summary.produced",
    "HealthChanged": "health.changed",
    "BacklogTrimmed": "backlog.trimmed",
    "SessionCleared": "session.cleared",
    "SessionRestored": "session.restored",
    "SessionErased": "session.erased",
    "ItemsAdded": "items.added",
    "ItemPopped": "item.popped",
    "TurnsAdopted": "turns.adopted",
    "HistoryCompacted": "history.compacted",
    "SessionRepaired": "session.repaired",
}

TURN = ConversationTurn(user_message="hi", assistant_response="hello", ts=5.0)


def turn_added(**fields: object) -> dict[str, object]:
    """A plain TurnAdded mapping, to corrupt field by field."""
    base: dict[str, object] = {
        "type": "turn.added",
        "seq": 3,
        "event_id": "c/1",
        "at": 10.0,
        "index": 1,
        "turn": {"user_message": "hi", "assistant_response": "hello"},
    }
    base.update(fields)
    return base


def test_every_event_type_has_its_stable_domain_tag() -> None:
    """Each event's tag is a domain name fixed forever, never a Python path."""
    assert {t.__name__: str(t.__struct_config__.tag) for t in EVENT_TYPES} == TAGS


def test_the_codec_knows_every_event_subclass() -> None:
    """EVENT_TYPES lists every Event subclass, so none is written that cannot be read."""
    assert set(Event.__subclasses__()) == set(EVENT_TYPES)


def test_encoded_events_carry_the_tag_in_a_type_field() -> None:
    """The JSON form names the event by its tag in "type"."""
    for name, event in EXAMPLES.items():
        tag = name.split("+")[0]
        assert json.loads(encode_event_json(event))["type"] == tag
        assert event_tag(event) == tag


def test_every_event_type_has_golden_files() -> None:
    """Golden msgpack and JSON bytes exist for every event tag."""
    for tag in TAGS.values():
        assert (GOLDEN_DIR / f"{tag}.msgpack").is_file(), tag
        assert (GOLDEN_DIR / f"{tag}.json").is_file(), tag
    assert {name.split("+")[0] for name in EXAMPLES} == set(TAGS.values())


def _golden_files() -> list[Path]:
    return sorted(GOLDEN_DIR.glob("*.msgpack")) + sorted(GOLDEN_DIR.glob("*.json"))


@pytest.mark.parametrize("path", _golden_files(), ids=lambda p: p.name)
def test_golden_bytes_still_decode_to_their_example(path: Path) -> None:
    """Bytes written by an earlier version decode to the same event today."""
    tag = path.name.removesuffix(path.suffix)
    data = path.read_bytes()
    decoded = decode_event(data) if path.suffix == ".msgpack" else decode_event_json(data)
    assert decoded == EXAMPLES[tag]
    assert type(decoded).__name__ in TAGS


def test_int_timestamps_encode_like_the_equal_float() -> None:
    """at=5 and at=5.0 are one event with one encoding."""
    a = SessionErased(seq=1, event_id="e", at=5)
    b = SessionErased(seq=1, event_id="e", at=5.0)
    assert a == b
    assert encode_event(a) == encode_event(b)
    assert encode_event_json(a) == encode_event_json(b)


def test_json_decoding_accepts_text_and_bytes() -> None:
    """decode_event_json takes an export line as str or bytes."""
    event = TurnAdded(seq=1, event_id="c/1", at=1.0, index=1, turn=TURN)
    line = encode_event_json(event)
    assert decode_event_json(line) == decode_event_json(line.decode()) == event


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01"], ids=["empty", "invalid", "truncated"])
def test_bad_bytes_raise_a_decode_error_at_the_root(data: bytes) -> None:
    """Bytes that are not msgpack raise EventDecodeError at path '$'."""
    with pytest.raises(EventDecodeError) as info:
        decode_event(data, seq=17)
    assert info.value.path == "$"
    assert info.value.seq == 17
    assert "sequence 17" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_json_raises_a_decode_error() -> None:
    """Text that is not JSON raises EventDecodeError."""
    with pytest.raises(EventDecodeError) as info:
        decode_event_json(b"{not json")
    assert info.value.path == "$"


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"at": "yesterday"}, "$.at"),
        ({"index": "one"}, "$.index"),
        ({"turn": {"user_message": "hi", "assistant_response": "x", "ts": "noon"}}, "$.turn.ts"),
        ({"turn": {"user_message": "hi\x00", "assistant_response": "x"}}, "$.turn"),
        ({"turn": {"assistant_response": "x"}}, "$.turn"),
        ({"seq": None}, "$.seq"),
    ],
)
def test_a_wrong_field_raises_an_error_with_its_path(fields: dict[str, object], path: str) -> None:
    """A badly typed or invalid field is reported with the path of that field."""
    for data, decode in (
        (msgspec.msgpack.encode(turn_added(**fields)), decode_event),
        (msgspec.json.encode(turn_added(**fields)), decode_event_json),
    ):
        with pytest.raises(EventDecodeError) as info:
            decode(data)
        assert not isinstance(info.value, UnknownEventType)
        assert info.value.path == path


def test_a_missing_field_is_named() -> None:
    """A required field that is absent is named in the error."""
    data = turn_added()
    del data["index"]
    with pytest.raises(EventDecodeError, match="index"):
        decode_event(msgspec.msgpack.encode(data))


def test_an_unknown_tag_is_reported_with_its_seq() -> None:
    """An event from a newer version raises UnknownEventType carrying its tag and seq."""
    data = msgspec.msgpack.encode({"type": "turn.edited", "seq": 9, "event_id": "x", "at": 1.0, "new": 1})
    with pytest.raises(UnknownEventType) as info:
        decode_event(data, seq=42)
    assert info.value.tag == "turn.edited"
    assert info.value.event_seq == 9
    assert info.value.seq == 42
    assert info.value.path == "$.type"
    assert isinstance(info.value, EventDecodeError)


def test_an_unknown_tag_without_a_seq_is_still_reported() -> None:
    """An unknown event with no seq is UnknownEventType with event_seq None."""
    with pytest.raises(UnknownEventType) as info:
        decode_event_json(b'{"type": "from.the.future"}')
    assert info.value.event_seq is None


def test_a_mapping_without_a_type_is_a_decode_error() -> None:
    """An object with no tag is not an event."""
    with pytest.raises(EventDecodeError) as info:
        decode_event_json(b'{"seq": 1}')
    assert not isinstance(info.value, UnknownEventType)


def test_fields_added_later_have_defaults_so_old_bytes_decode() -> None:
    """An event written before a defaulted field existed decodes with the default."""
    data = msgspec.json.encode(
        {
            "type": "health.changed",
            "seq": 2,
            "event_id": "c/1",
            "at": 1.0,
            "old": "healthy",
            "new": "retry",
            "reason": "boom",
        }
    )
    assert decode_event_json(data) == HealthChanged(
        seq=2, event_id="c/1", at=1.0, old=MemoryHealth.HEALTHY, new=MemoryHealth.RETRY, reason="boom"
    )


def test_an_upcaster_turns_an_old_tag_into_a_current_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """A breaking change is a new tag plus a pure upcaster; old bytes then decode as the new event."""

    def upcast(old: dict[str, object]) -> dict[str, object]:
        return {**turn_added(seq=old["seq"], index=old["number"]), "turn": old["turn"]}

    monkeypatch.setattr(codec_module, "UPCASTERS", {"turn.added.v0": upcast})
    old = {
        "type": "turn.added.v0",
        "seq": 4,
        "number": 2,
        "turn": {"user_message": "hi", "assistant_response": "hello", "ts": 5.0},
    }
    for data, decode in (
        (msgspec.msgpack.encode(old), decode_event),
        (msgspec.json.encode(old), decode_event_json),
    ):
        assert decode(data) == TurnAdded(seq=4, event_id="c/1", at=10.0, index=2, turn=TURN)


def test_no_upcasters_exist_yet() -> None:
    """Version 1 has no old tags to upcast (add golden files when one appears)."""
    assert dict(codec_module.UPCASTERS) == {}


@pytest.mark.parametrize("at", [float("nan"), float("inf"), -float("inf")])
def test_an_event_time_must_be_finite(at: float) -> None:
    """A NaN or infinite timestamp is refused: JSON could not carry it back."""
    with pytest.raises(ValueError, match="at"):
        SessionErased(seq=1, event_id="e", at=at)


@pytest.mark.parametrize("seq", [0, -1])
def test_an_event_seq_starts_at_one(seq: int) -> None:
    """A seq below 1 is refused: the fold would silently take it as already applied."""
    with pytest.raises(ValueError, match="seq"):
        SessionErased(seq=seq, event_id="e", at=1.0)


# Turns: only what can be stored -------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"user_message": "a\ud800"}, "user_message"),
        ({"assistant_response": "\udfff"}, "assistant_response"),
        ({"user_message": "a\x00"}, "user_message"),
        ({"artifacts_shown": {"k": ["ok", {"deep": "\ud83d"}]}}, "artifacts_shown.k[1].deep"),
        ({"artifacts_hidden_refs": ("ok", "\ud800")}, "artifacts_hidden_refs[1]"),
        ({"trajectory_digest": {"tools_invoked": ("\ud800",)}}, "trajectory_digest.tools_invoked[0]"),
        ({"trajectory_digest": {"observations_summary": "\ud800"}}, "trajectory_digest.observations_summary"),
        ({"items": ({"kind": "reasoning", "content": "\ud800"},)}, "content"),
        (
            {"items": ({"kind": "function_call", "call_id": "c", "name": "t", "arguments": "\ud800"},)},
            "arguments",
        ),
        ({"entities": ({"name": "Ann", "attributes": {"role": "\ud800"}},)}, "entities.attributes.role"),
        ({"user_message": "", "assistant_response": ""}, "turn"),
        ({"ts": -1.0}, "ts"),
        ({"ts": float("nan")}, "ts"),
    ],
)
def test_a_turn_that_cannot_be_stored_is_refused_naming_the_field(
    fields: dict[str, object], field: str
) -> None:
    """A lone surrogate (not UTF-8 encodable), a NUL, an empty turn or a bad time raise InvalidTurn."""
    payload: dict[str, object] = {"user_message": "q", "assistant_response": "a", **fields}
    with pytest.raises((InvalidTurn, msgspec.ValidationError)) as info:
        msgspec.convert(payload, ConversationTurn)
    assert field in str(info.value)


def test_every_storable_turn_encodes() -> None:
    """A turn that constructs also encodes, in both codecs."""
    event = TurnAdded(seq=1, event_id="e", at=1.0, index=1, turn=EXAMPLES["turn.added"].turn)  # type: ignore[attr-defined]
    assert decode_event(encode_event(event)) == event
    assert decode_event_json(encode_event_json(event)) == event


def test_a_field_from_a_newer_version_is_ignored() -> None:
    """An old reader decodes an event that a newer writer extended with a defaulted field."""
    data = msgspec.json.encode({**turn_added(), "mood": "cheerful"})
    assert decode_event_json(data) == TurnAdded(
        seq=3,
        event_id="c/1",
        at=10.0,
        index=1,
        turn=ConversationTurn(user_message="hi", assistant_response="hello"),
    )
