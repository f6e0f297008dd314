"""`rendered_turn_length` is the length of the canonical JSON rendering, measured without json.dumps.

For a plain turn it measures the two texts with msgspec's JSON encoder. That
holds only because msgspec escapes exactly the characters `json.dumps`
escapes, with escapes of the same length, and writes every other character as
its UTF-8 bytes; these tests pin that for every code point and for whole turns.
"""

from __future__ import annotations

import json

import msgspec
from hypothesis import given
from hypothesis import strategies as st
from strategies import turns

from convmem.events import ConversationTurn, TrajectoryDigest
from convmem.projections import rendered_turn_length
from convmem.projections._state import _json_encode


def canonical_length(turn: ConversationTurn, *, include_digest: bool, include_date: bool = False) -> int:
    rendering = turn.to_llm(include_digest=include_digest, include_date=include_date)
    return len(json.dumps(rendering, ensure_ascii=False, sort_keys=True))


def test_msgspec_measures_every_code_point_as_json_dumps_does() -> None:
    """Encoded size less the UTF-8 bytes plus one character is json.dumps's length, for every code point."""
    wrong = [
        hex(code)
        for code in range(0x110000)
        if not 0xD800 <= code <= 0xDFFF
        and len(_json_encode(chr(code))) - len(chr(code).encode()) + 1
        != len(json.dumps(chr(code), ensure_ascii=False))
    ]
    assert wrong == []


_any_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=60)
_escapes = st.text(st.sampled_from('ab "\\\n\t\r\x01\x1f\x7f\u2028é🙂</'), max_size=30)


@given(user=_any_text | _escapes, answer=_any_text | _escapes, include_digest=st.booleans())
def test_a_plain_turn_has_its_canonical_length(user: str, answer: str, include_digest: bool) -> None:
    """Any two texts, ASCII or not, with or without characters to escape."""
    turn = ConversationTurn(user_message=user or "q", assistant_response=answer)
    assert rendered_turn_length(turn, include_digest=include_digest) == canonical_length(
        turn, include_digest=include_digest
    )


@given(turn=turns, include_digest=st.booleans(), include_date=st.booleans())
def test_any_turn_has_its_canonical_length(
    turn: ConversationTurn, include_digest: bool, include_date: bool
) -> None:
    """Digests, artifacts, items and dates included: the fast measure and json.dumps agree."""
    assert rendered_turn_length(
        turn, include_digest=include_digest, include_date=include_date
    ) == canonical_length(turn, include_digest=include_digest, include_date=include_date)


@given(ts=st.floats(0, 253402300799) | st.sampled_from([0.0, 1.0, 1e10, 253402300799.0, 253402300800.0]))
def test_a_dated_turn_counts_its_date(ts: float) -> None:
    """A shown date is measured, from 1 January 1970 to 31 December 9999; an unknown one is not shown."""
    turn = ConversationTurn(user_message="q", assistant_response="a", ts=ts)
    length = rendered_turn_length(turn, include_digest=True, include_date=True)
    assert length == canonical_length(turn, include_digest=True, include_date=True)
    shown = turn.to_llm(include_digest=True, include_date=True)
    assert ("date" in shown) == (0 < ts < 253402300800.0)


def test_a_digest_left_out_is_not_measured() -> None:
    """With the digest left out of the rendering, a turn with a digest measures as a plain turn."""
    turn = ConversationTurn(
        user_message="q", assistant_response="a", trajectory_digest=TrajectoryDigest(tools_invoked=("t",))
    )
    assert rendered_turn_length(turn, include_digest=False) == len('{"assistant": "a", "user": "q"}')


def test_a_text_msgspec_cannot_encode_is_measured_by_json_dumps() -> None:
    """A lone surrogate (no stored turn has one) falls back to json.dumps instead of raising."""
    turn = ConversationTurn(user_message="q", assistant_response="a")
    msgspec.structs.force_setattr(turn, "user_message", "x\ud800y")
    assert rendered_turn_length(turn, include_digest=True) == canonical_length(turn, include_digest=True)
