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
from bench._grounding import Grounding, index_of
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
    # grounded: Pixel's line shares "name"; Ben's move is his line; the kayak's caption shares no word
    grounded = figures["grounded recall of the full history (dated turns, the ceiling), all questions"]
    assert grounded.value == pytest.approx((1 / 3 + 2 / 4) / 2)
    for budget in SMOKE.q_budgets:
        for label in (quality.RECOMMENDED, quality.WRITTEN, *quality.CONTROLS):
            assert f"{label}: grounded recall / ceiling @ {budget} tokens, all questions" in figures
        assert result.details["grounded"][f"{quality.WORD_LIST} @ {budget}"]["all"]["checkpoints"] == 2
    (tmp_path / "99.json").unlink()
    monkeypatch.setenv("CONVMEM_LOCOMO", str(tmp_path))
    monkeypatch.setattr(locomo, "locomo_dir", lambda: None)
    assert quality.run(SMOKE).skipped


# -- grounded recall (issue 25, item 4): the metric a word list cannot win ---------------------

ANA_BEN = Grounding(("Ana", "Ben"), {"user": "Ana", "assistant": "Ben"})


def grounds(context: object, question: str, answer: str) -> bool:
    units = ANA_BEN.units(context)
    return ANA_BEN.grounded(ANA_BEN.question(question, answer), units, index_of(units))


def summary(text: str) -> dict[str, object]:
    return {"conversation_memory": {"summary": text, "recent_turns": []}}


def test_a_correct_attributed_line_grounds_its_answer() -> None:
    """One line holds the answer, shares a word with the question and is the named person's."""
    question = "What is the name of the greyhound Ana adopted?"
    assert grounds(summary("8 May 2023:\n- Ana: I adopted a greyhound named Pixel."), question, "Pixel")
    assert grounds(summary("- User: I adopted a greyhound named Pixel."), question, "Pixel")  # her role
    assert grounds(summary("Ana adopted a greyhound; she named it Pixel."), question, "Pixel")  # names her
    turn = {"user": "I adopted a greyhound named Pixel!", "assistant": "Lovely!", "date": "8 May 2023"}
    assert grounds({"conversation_memory": {"recent_turns": [turn]}}, question, "Pixel")
    # the date of a turn or of a heading over a line is read with the line
    assert grounds({"conversation_memory": {"recent_turns": [turn]}}, "When did Ana adopt?", "8 May 2023")
    assert grounds(summary("8 May 2023:\n- Ana: I adopted a greyhound."), "When did Ana adopt?", "8 May 2023")
    # a list's items may sit in different lines, each related and attributed
    two = summary("- Ana: My hobbies: pottery every week.\n- Ana: Also hobbies like camping.")
    assert grounds(two, "What hobbies does Ana have?", "pottery, camping")
    assert not grounds(two, "What hobbies does Ana have?", "pottery, camping, chess")


def test_a_line_about_the_wrong_person_or_the_question_does_not_ground() -> None:
    question = "What is the name of the greyhound Ana adopted?"
    assert not grounds(summary("- Ben: I adopted a greyhound named Pixel."), question, "Pixel")
    assert not grounds(summary("- Assistant: I adopted a greyhound named Pixel."), question, "Pixel")
    turn = {"user": "Lovely!", "assistant": "I adopted a greyhound named Pixel!"}
    assert not grounds({"conversation_memory": {"recent_turns": [turn]}}, question, "Pixel")
    # the answer's words in one line, the question's in another: not stated together
    assert not grounds(
        summary("- Ana: Pixel.\n- Ana: Lovely weather.\n- Ana: I adopted a greyhound."), question, "Pixel"
    )
    # ... but the line just before may be the question the line answers
    asked = summary("- Ben: What did you name the greyhound?\n- Ana: Pixel, after the screen.")
    assert grounds(asked, question, "Pixel")
    # with no person named, any related line grounds the answer
    assert grounds(
        summary("- Ben: I adopted a greyhound named Pixel."), "What is the greyhound's name?", "Pixel"
    )


def test_a_word_list_grounds_nothing_that_its_words_recall() -> None:
    """The control: the history's distinct words, rarest first, hold every answer's words (the
    bag of words scores it 1.0) but no answer in a related, attributed line (0.0); the whole
    history as dated turns grounds every answer."""
    played, asked = word_list_history(60)
    whole = {
        "conversation_memory": {
            "recent_turns": [t.to_llm(include_digest=False, include_date=True) for t in played]
        }
    }
    words = locomo.history_words(played)
    assert quality._scores(asked, words, ANA_BEN, whole)[("grounded", "all")] == 1.0
    for months_first in (False, True):
        context, tokens = quality._word_list(played, 2000, months_first=months_first)
        assert tokens <= 2000
        scores = quality._scores(asked, locomo.context_words(context), ANA_BEN, context)
        assert scores[("words", "all")] == 1.0
        assert scores[("grounded", "all")] == 0.0, months_first


def made_up_word(i: int, tail: str) -> str:
    """A word of its own (distinct first five letters) for index `i`."""
    letters = "bcdfghjklmnpqrstvwxz"
    return letters[i % 20] + "aeiou"[i // 20 % 5] + letters[i // 100 % 20] + tail


def word_list_history(n: int) -> tuple[list[ConversationTurn], list[quality._Asked]]:
    """`n` turns, each stating one fact of Ana's (two words seen once), Ben's reply reusing a
    pool of words; every question names Ana, who is named in every reply."""
    played, asked = [], []
    for i in range(n):
        thing, colour = made_up_word(i, "ump"), made_up_word(i, "ish")
        pool = " ".join(made_up_word(200 + (i * 2 + k) % 40, "ed") for k in range(2))
        played.append(
            ConversationTurn(
                user_message=f"My {thing} turned {colour} today.",
                assistant_response=f"Nice, Ana! {pool}.",
                ts=1683554160.0 + 86400 * i,
            )
        )
        item = locomo.QAItem(frozenset({colour}), 1, 4, f"What colour is Ana's {thing}?", colour)
        asked.append(quality._Asked(item, ANA_BEN.question(item.question, item.answer)))
    return played, asked
