"""bench.quality_loss: each loss is put under the cause that fits it (written-here contexts, no LoCoMo)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import _locomo as locomo
from bench._grounding import Grounding, index_of
from bench.quality_loss import CAUSES, _cause

GROUNDING = Grounding(("Ana", "Ben"), {"user": "Ana", "assistant": "Ben"})
QUESTION = GROUNDING.question("What breed is the dog Ana adopted?", "a greyhound")


def cause(context: Any) -> str:
    units = GROUNDING.units(context)
    return _cause(GROUNDING, QUESTION, units, index_of(units), locomo.context_words(context))


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        ("- Ana: I adopted a puppy.", CAUSES[0]),  # "greyhound" nowhere
        ("- Ana: My grey coat.\n- Ana: The hound barked.", CAUSES[0]),  # not the answer's word either
        ("- Ana: I saw a greyhound race.", CAUSES[2]),  # holds it, shares no word with the question
        ("- Ben: I adopted a dog, a greyhound.", CAUSES[3]),  # related, but Ben's line, not Ana's
    ],
)
def test_each_loss_goes_under_its_cause(summary: str, expected: str) -> None:
    assert cause({"conversation_memory": {"summary": summary, "recent_turns": []}}) == expected


def test_a_grounded_answer_is_no_loss() -> None:
    with pytest.raises(AssertionError):
        cause(
            {"conversation_memory": {"summary": "- Ana: I adopted a dog, a greyhound.", "recent_turns": []}}
        )


def test_words_scattered_over_lines() -> None:
    question = GROUNDING.question("Where did Ana travel?", "Porto Alegre")
    context = {
        "conversation_memory": {
            "summary": "- Ana: I went to Porto.\n- Ana: Alegre is far.",
            "recent_turns": [],
        }
    }
    units = GROUNDING.units(context)
    assert _cause(GROUNDING, question, units, index_of(units), locomo.context_words(context)) == CAUSES[1]
