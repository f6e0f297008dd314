"""The quality measure itself, on a small LoCoMo-shaped dialogue written here (CI has no LoCoMo data).

It pins what "answer recall" counts: QA items of categories 1-4 whose evidence
sessions have all been played, an answer counted when all its content words
are in the context, the ceiling being the whole history as plain lines.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import _locomo as locomo
from bench import quality
from bench._common import SMOKE
from convmem.events import ConversationTurn


def dialogue() -> dict[str, object]:
    return {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "Hi Ben!"},
            {"speaker": "Ana", "dia_id": "D1:2", "text": "I adopted a greyhound named Pixel yesterday."},
            {"speaker": "Ben", "dia_id": "D1:3", "text": "Lovely!", "blip_caption": "a photo of a kayak"},
        ],
        "session_1_summary": "Ana adopted Pixel, a greyhound, on 7 May 2023.",
        "session_2_date_time": "9:00 am on 1 June, 2023",
        "session_2": [
            {"speaker": "Ben", "dia_id": "D2:1", "text": "I moved to Porto last week."},
            {"speaker": "Ana", "dia_id": "D2:2", "text": "Nice, send photos."},
        ],
        "session_2_summary": "Ben moved to Porto.",
        "qa": [
            {"question": "What is the dog's name?", "answer": "Pixel", "evidence": ["D1:2"], "category": 1},
            {"question": "When?", "answer": "7 May 2023", "evidence": ["D1:2"], "category": 2},
            {"question": "Where did Ben move?", "answer": "Porto", "evidence": ["D2:1"], "category": 4},
            {"question": "What did Ben show?", "answer": "a kayak", "evidence": ["D1:3"], "category": 1},
            {"question": "Trick?", "answer": "Lisbon", "evidence": ["D1:2"], "category": 5},
            {"question": "Only stop words", "answer": "yes", "evidence": ["D1:2"], "category": 1},
            {"question": "No evidence", "answer": "Pixel", "evidence": [], "category": 1},
        ],
    }


def test_a_dialogue_becomes_dated_turns_and_questions() -> None:
    """Runs of one speaker join, captions are appended, a session's date is every turn's ts."""
    data = dialogue()
    sessions = locomo.sessions(data)
    assert [s.number for s in sessions] == [1, 2]
    first = locomo.turns(sessions[0], "Ana")
    assert first == [
        ConversationTurn(
            user_message="Hi Ben!\nI adopted a greyhound named Pixel yesterday.",
            assistant_response="Lovely! [image: a photo of a kayak]",
            ts=1683554160.0,
        )
    ]
    assert locomo.turns(sessions[1], "Ana")[0].user_message == ""  # the assistant spoke first
    items, left_out = locomo.qa_items(data)
    assert [(sorted(i.words), i.needs, i.category) for i in items] == [
        (["pixel"], 1, 1),
        (["2023", "may"], 1, 2),
        (["porto"], 2, 4),
        (["kayak"], 1, 1),
    ]
    assert left_out == {"category 5": 1, "no evidence id": 1, "no content word in the answer": 1}


def test_recall_counts_answers_whose_words_are_all_in_the_context() -> None:
    """Words come from keys and values with JSON escapes undone; questions wait for their evidence."""
    items, _ = locomo.qa_items(dialogue())
    context = {"conversation_memory": {"summary": "x\nPixel came on 7 May\n2023", "recent_turns": []}}
    words = locomo.context_words(context)
    assert {"pixel", "may", "2023", "conversation", "memory", "recent", "turns"} <= words
    assert quality._recall(items, 1, words) == (2 / 3, 1 / 2)  # 3 asked after session 1; kayak is missing
    assert quality._recall(items, 2, words) == (2 / 4, 1 / 3)  # and Porto
    assert quality._recall(items, 0, words) is None


def test_the_measure_runs_every_configuration_within_its_budgets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full history recalls all it can; every context stays within its budget; the summarizer's
    speed is reported; a folder with no dialogue is a clean skip."""
    (tmp_path / "99.json").write_text(json.dumps(dialogue()), encoding="utf-8")
    monkeypatch.setenv("CONVMEM_LOCOMO", str(tmp_path))
    result = quality.run(dataclasses.replace(SMOKE, q_dialogues=None, q_sessions=None))
    figures = {f.name: f for f in result.figures}
    ceiling = (2 / 3 + 3 / 4) / 2  # plain lines hold no date: "when" is not answered
    assert figures["answer recall of the full history (the ceiling)"].value == pytest.approx(ceiling)
    for budget in SMOKE.q_budgets:
        for label in (quality.TRUNCATION, quality.WRITTEN, quality.OLD_ROLLING, quality.RECOMMENDED):
            assert figures[f"{label}: max context tokens @ {budget}"].met, (label, budget)
        recommended = figures[f"recommended: answer recall / ceiling @ {budget} tokens, vs truncation"]
        assert recommended.value == pytest.approx(1 / ceiling)  # dated turns also answer "when"
    assert result.details["checkpoints"] == 2
    (tmp_path / "99.json").unlink()
    monkeypatch.setenv("CONVMEM_LOCOMO", str(tmp_path))
    monkeypatch.setattr(locomo, "locomo_dir", lambda: None)
    assert quality.run(SMOKE).skipped
