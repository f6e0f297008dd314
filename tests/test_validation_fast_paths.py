"""The fast paths of event, turn and key validation accept and refuse exactly what the full checks do.

A replay decodes every stored event, so `Event.__post_init__`,
`ConversationTurn.__post_init__` and the key's id check accept the common
case inline and hand everything else to the full check. These tests hold them
to the checks as they were written before the fast paths (kept here as
references), on generated and hand-picked bad input, built in process and
decoded from bytes.
"""

from __future__ import annotations

import math
import re
from enum import IntEnum
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convmem.errors import EventDecodeError, InvalidInput, InvalidKey, InvalidTurn
from convmem.events import (
    ConversationTurn,
    HealthChanged,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    TurnAdded,
    decode_event,
    encode_event,
)
from convmem.events._checks import MAX_TEXT_LENGTH, has_lone_surrogate, kind_of
from convmem.events._turn import _check_turn

_SURROGATE = re.compile("[\ud800-\udfff]")

# References: the checks as they were before the fast paths ------------------------------


def _reference_strings(field: str, value: object) -> None:
    if isinstance(value, str):
        if not value.isascii() and _SURROGATE.search(value):
            raise InvalidTurn(field, "contains a lone surrogate, which cannot be stored as UTF-8")
    elif isinstance(value, dict):
        for key, inner in value.items():
            _reference_strings(field, key)
            _reference_strings(f"{field}.{key}", inner)
    elif isinstance(value, list | tuple):
        for i, inner in enumerate(value):
            _reference_strings(f"{field}[{i}]", inner)


def _reference_text(field: str, value: Any) -> None:
    if not isinstance(value, str):  # issue 15: a wrong type is InvalidTurn, no longer a bare TypeError
        raise InvalidTurn(field, f"must be a string, got {kind_of(value)}")
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidTurn(field, f"is {len(value)} characters long, over {MAX_TEXT_LENGTH}")
    if "\x00" in value:
        raise InvalidTurn(field, "contains a NUL character")
    _reference_strings(field, value)


def reference_turn(fields: dict[str, Any]) -> object:
    """The turn's rules as first written: the normalised `ts`, or the error they raise."""
    user, answer = fields["user_message"], fields["assistant_response"]
    shown, hidden = fields.get("artifacts_shown", {}), fields.get("artifacts_hidden_refs", ())
    ts = fields.get("ts", 0.0)
    try:
        _reference_text("user_message", user)
        _reference_text("assistant_response", answer)
        if not user and not answer:
            raise InvalidTurn("turn", "has no user message, no assistant response and no items")
        if shown:
            _reference_strings("artifacts_shown", shown)
        _reference_strings("artifacts_hidden_refs", hidden)
        if not isinstance(ts, int | float) or isinstance(ts, bool):  # issue 15: True is not a time
            raise InvalidTurn("ts", f"must be an epoch time in seconds (a float), got {kind_of(ts)}")
        if isinstance(ts, int):
            ts = float(ts)
        if not math.isfinite(ts) or ts < 0:
            raise InvalidTurn("ts", f"must be a finite epoch time >= 0, got {ts!r}")
    except Exception as exc:
        return (type(exc), str(exc))
    return ("ok", type(ts), ts)


def outcome_of_turn(fields: dict[str, Any]) -> object:
    try:
        turn = ConversationTurn(**fields)
    except Exception as exc:
        return (type(exc), str(exc))
    return ("ok", type(turn.ts), turn.ts)


def reference_event(seq: Any, at: Any) -> object:
    """The event's rules as first written."""
    try:
        if isinstance(seq, bool) or seq < 1:
            raise InvalidInput("seq", f"must be an integer >= 1, got {seq!r}")
        if isinstance(at, int):
            at = float(at)
        if not math.isfinite(at):
            raise InvalidInput("at", f"must be a finite epoch time, got {at!r}")
    except Exception as exc:
        return (type(exc), str(exc))
    return ("ok", type(at), at)


def outcome_of_event(seq: Any, at: Any) -> object:
    try:
        event = HealthChanged(
            seq=seq, event_id="e", at=at, old=MemoryHealth.HEALTHY, new=MemoryHealth.RETRY, reason="r"
        )
    except Exception as exc:
        return (type(exc), str(exc))
    return ("ok", type(event.at), event.at)


# Strategies ---------------------------------------------------------------------------

_any_char = st.characters(exclude_categories=())  # every code point, lone surrogates and NUL too
_nasty_texts = st.one_of(
    st.text(_any_char, max_size=30),
    st.text(st.sampled_from('ab \x00\ud800\udfff\ud83d\ude00é🙂\x1f"\\'), max_size=12),
    st.sampled_from(["", "plain ascii", "café", "\ud800", "ok\x00", "a" * (MAX_TEXT_LENGTH + 1)]),
)
_not_texts = st.sampled_from([None, 5, 1.5, b"bytes", ["a"], ("a",)])
_times = st.one_of(
    st.floats(),
    st.integers(-(10**12), 10**12),
    st.booleans(),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0, -1, 1.7e9]),
)


class _Seq(IntEnum):
    ONE = 1
    ZERO = 0


# The turn ------------------------------------------------------------------------------


@given(
    user=_nasty_texts | _not_texts,
    answer=_nasty_texts,
    ts=_times,
    hidden=st.lists(_nasty_texts, max_size=2).map(tuple),
    shown=st.dictionaries(_nasty_texts, _nasty_texts | st.lists(_nasty_texts, max_size=2), max_size=2),
)
def test_a_turn_is_accepted_or_refused_as_the_full_check_does(
    user: Any, answer: str, ts: Any, hidden: tuple[str, ...], shown: dict[str, Any]
) -> None:
    """Texts, times and artifacts: the fast path gives the old outcome, error type and message included."""
    fields = {"user_message": user, "assistant_response": answer, "ts": ts}
    for extra in ({}, {"artifacts_hidden_refs": hidden}, {"artifacts_shown": shown}):
        both = {**fields, **extra}
        assert outcome_of_turn(both) == reference_turn(both)


@pytest.mark.parametrize("value", [None, 5, 1.5, b"bytes", b"a\x00", ["a"], ("a",), {"a": "b"}])
@pytest.mark.parametrize("field", ["user_message", "assistant_response"])
def test_a_text_that_is_not_a_str_meets_the_full_check(field: str, value: object) -> None:
    """A non-string text (only a Python caller can pass one) is InvalidTurn naming the field."""
    fields = {"user_message": "q", "assistant_response": "a", field: value}
    assert outcome_of_turn(fields) == reference_turn(fields)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"user_message": "\ud800"}, "user_message: contains a lone surrogate"),
        ({"assistant_response": "caf\udfffé"}, "assistant_response: contains a lone surrogate"),
        ({"user_message": "a\x00b"}, "user_message: contains a NUL character"),
        ({"assistant_response": "é\x00"}, "assistant_response: contains a NUL character"),
        ({"user_message": "a" * (MAX_TEXT_LENGTH + 1)}, "user_message: is 1000001 characters long"),
        ({"user_message": "", "assistant_response": ""}, "turn: has no user message"),
        ({"ts": math.nan}, "ts: must be a finite epoch time"),
        ({"ts": math.inf}, "ts: must be a finite epoch time"),
        ({"ts": -1.0}, "ts: must be a finite epoch time"),
        ({"artifacts_hidden_refs": ("ok", "\ud800")}, "artifacts_hidden_refs[1]: contains a lone surrogate"),
        ({"artifacts_shown": {"k": "\udc00"}}, "artifacts_shown.k: contains a lone surrogate"),
    ],
)
def test_a_bad_turn_still_raises_invalid_turn_naming_the_field(fields: dict[str, Any], error: str) -> None:
    """Each rule the fast path skips for a plain turn still refuses a bad one, by field."""
    with pytest.raises(InvalidTurn, match=re.escape(error)):
        ConversationTurn(**{"user_message": "q", "assistant_response": "a", **fields})


def test_a_turn_with_items_or_an_int_time_takes_the_full_check() -> None:
    """Items are paired and an int time becomes a float, as before."""
    assert ConversationTurn(user_message="q", assistant_response="a", ts=5).ts == 5.0
    assert type(ConversationTurn(user_message="q", assistant_response="a", ts=5).ts) is float
    unpaired = MessageItem(kind="function_call", call_id="c", name="t")
    with pytest.raises(InvalidTurn, match=re.escape("items[0].call_id")):
        ConversationTurn(user_message="q", assistant_response="a", items=(unpaired,))


def test_a_plain_turn_passes_the_full_check_too() -> None:
    """What the fast path accepts, `_check_turn` accepts (it is the same rule set, spelt out)."""
    turn = ConversationTurn(user_message="héllo 🙂", assistant_response='quote " and \\ and \n')
    _check_turn(turn)


def _turn_added_bytes(turn: dict[str, Any], *, seq: Any = 2, at: Any = 1.0) -> bytes:
    event = {"type": "turn.added", "seq": seq, "event_id": "e", "at": at, "index": 1, "turn": turn}
    return msgspec.msgpack.encode(event)


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        ({"user_message": "a\x00", "assistant_response": "b"}, "user_message: contains a NUL character"),
        ({"user_message": "", "assistant_response": ""}, "turn: has no user message"),
        ({"user_message": "q", "assistant_response": "a", "ts": -3.0}, "ts: must be a finite epoch time"),
        ({"user_message": "q", "assistant_response": "a", "ts": math.nan}, "ts: must be a finite epoch time"),
        (
            {"user_message": "q", "assistant_response": "a" * (MAX_TEXT_LENGTH + 1)},
            "assistant_response: is 1000001 characters long",
        ),
    ],
)
def test_a_bad_turn_in_the_log_is_refused_with_its_path(turn: dict[str, Any], error: str) -> None:
    """Decoding runs the same rules: EventDecodeError at `$.turn`, with the rule's message."""
    with pytest.raises(EventDecodeError, match=re.escape(error)) as info:
        decode_event(_turn_added_bytes(turn), seq=7)
    assert (info.value.path, info.value.seq) == ("$.turn", 7)


def test_a_lone_surrogate_cannot_arrive_in_a_msgpack_string() -> None:
    """msgpack strings must be UTF-8: a surrogate's three bytes (CESU) fail to decode, naming no field."""
    data = _turn_added_bytes({"user_message": "aXYZ", "assistant_response": "b"})
    for surrogate in (b"\xed\xa0\x80", b"\xed\xbf\xbf"):
        with pytest.raises(EventDecodeError, match="not a valid encoded event"):
            decode_event(data.replace(b"XYZ", surrogate))


def test_a_valid_turn_from_the_log_decodes_unchanged() -> None:
    """The fast path changes no field: a decoded plain turn equals the one encoded."""
    turn = ConversationTurn(user_message="héllo", assistant_response="ok", ts=12.5)
    event = TurnAdded(seq=2, event_id="e", at=3.0, index=1, turn=turn)
    assert decode_event(encode_event(event)) == event


# The lone-surrogate test ---------------------------------------------------------------


def test_the_surrogate_test_agrees_with_the_scan_on_every_code_point() -> None:
    """Strict UTF-8 encoding fails on exactly U+D800..U+DFFF, each alone or beside any other."""
    for code in range(0x110000):
        char = chr(code)
        assert has_lone_surrogate(char) == (0xD800 <= code <= 0xDFFF), hex(code)
    assert has_lone_surrogate("é" * 50 + "\ud83d\ude00")  # a surrogate pair in a str is two lone ones
    assert not has_lone_surrogate("é" * 50 + "\U0001f600")


@given(st.text(_any_char, max_size=40))
def test_the_surrogate_test_agrees_with_the_scan(text: str) -> None:
    """Any text: a lone surrogate is found by the encoding exactly when the scan finds one."""
    assert has_lone_surrogate(text) == (_SURROGATE.search(text) is not None)


# The event -----------------------------------------------------------------------------


@given(
    seq=st.one_of(st.integers(-5, 2**70), st.booleans(), st.sampled_from([_Seq.ONE, _Seq.ZERO])),
    at=_times,
)
def test_an_event_is_accepted_or_refused_as_the_full_check_does(seq: Any, at: Any) -> None:
    """seq >= 1 (no bool) and a finite time (an int made float): the old outcome, error included."""
    assert outcome_of_event(seq, at) == reference_event(seq, at)


@pytest.mark.parametrize(
    ("seq", "at", "path"),
    [(0, 1.0, "seq"), (-1, 1.0, "seq"), (2, math.nan, "at"), (2, math.inf, "at"), (2, -math.inf, "at")],
)
def test_a_bad_event_in_the_log_is_refused_with_its_field(seq: int, at: float, path: str) -> None:
    """Decoding refuses a bad seq or time with EventDecodeError naming the field."""
    with pytest.raises(EventDecodeError, match=f"{path}: must be"):
        decode_event(_turn_added_bytes({"user_message": "q", "assistant_response": "a"}, seq=seq, at=at))


def test_an_int_time_in_the_log_decodes_as_the_equal_float() -> None:
    """msgspec turns an int time into a float before the check; the event equals the float one."""
    event = decode_event(_turn_added_bytes({"user_message": "q", "assistant_response": "a"}, at=7))
    assert type(event.at) is float
    assert event.at == 7.0


# The key -------------------------------------------------------------------------------


def _reference_id(value: str) -> object:
    """The id rule as first written: the first control or surrogate character refuses the id."""
    for position, char in enumerate(value):
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code <= 0xDFFF:
            return (
                InvalidKey,
                f"user_id: has a control or surrogate character U+{code:04X} at position {position}",
            )
    return "ok"


def _outcome_of_id(value: str) -> object:
    try:
        MemoryKey("t", value, "s")
    except InvalidKey as exc:
        return (InvalidKey, str(exc))
    return "ok"


def test_every_ascii_character_in_an_id_meets_the_full_check() -> None:
    """Printable ASCII passes at once; each control character (and DEL) is still refused by position."""
    for code in range(128):
        value = f"a{chr(code)}b"
        assert _outcome_of_id(value) == _reference_id(value), hex(code)


@given(st.text(_any_char, min_size=1, max_size=20))
def test_an_id_is_accepted_or_refused_as_the_full_check_does(value: str) -> None:
    """Any id: the ASCII fast path gives the old outcome, position and code point included."""
    assert _outcome_of_id(value) == _reference_id(value)
