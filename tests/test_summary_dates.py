"""Dates: a turn's day, relative words made absolute around month, year and leap-day ends, and
dated turns in the context (a configuration choice, off by default)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convmem.adapters.backends.summarizers._dates import day_of, format_day, parse_day, resolve
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import AddTurn, SessionState, decide, estimate_tokens, evolve, llm_context, render


def day(year: int, month: int, day_: int) -> int:
    return date(year, month, day_).toordinal()


@pytest.mark.parametrize(
    ("said_on", "sentence", "resolved"),
    [
        # month and year ends, leap days
        ((2024, 3, 1), "I went yesterday.", "I went yesterday (29 February 2024)."),
        ((2023, 3, 1), "I went yesterday.", "I went yesterday (28 February 2023)."),
        ((2100, 3, 1), "Yesterday was odd.", "Yesterday (28 February 2100) was odd."),
        ((2000, 3, 1), "It rained last night.", "It rained last night (29 February 2000)."),
        ((2023, 12, 31), "We fly tomorrow.", "We fly tomorrow (1 January 2024)."),
        (
            (2024, 1, 1),
            "We met the day before yesterday.",
            "We met the day before yesterday (30 December 2023).",
        ),
        ((2023, 12, 30), "Due the day after tomorrow.", "Due the day after tomorrow (1 January 2024)."),
        ((2024, 1, 2), "It broke two days ago.", "It broke two days ago (31 December 2023)."),
        ((2024, 1, 15), "I moved 3 months ago.", "I moved 3 months ago (October 2023)."),
        ((2024, 1, 15), "I quit 14 months ago.", "I quit 14 months ago (November 2022)."),
        ((2024, 2, 29), "We married 4 years ago.", "We married 4 years ago (2020)."),
        ((2024, 1, 31), "It opens a week from now.", "It opens a week from now (week of 5 February 2024)."),
        ((2024, 1, 10), "I started last month.", "I started last month (December 2023)."),
        ((2023, 12, 10), "I start next month.", "I start next month (January 2024)."),
        ((2024, 1, 10), "I graduated last year.", "I graduated last year (2023)."),
        ((2023, 12, 31), "See you next year.", "See you next year (2024)."),
        # weeks and weekdays (1 January 2024 is a Monday)
        ((2024, 1, 1), "I was ill last week.", "I was ill last week (week of 25 December 2023)."),
        ((2024, 1, 7), "I was ill last week.", "I was ill last week (week of 25 December 2023)."),
        ((2023, 12, 28), "We ship next week.", "We ship next week (week of 1 January 2024)."),
        ((2024, 1, 5), "It happened last Friday.", "It happened last Friday (29 December 2023)."),
        ((2024, 1, 6), "It happened last Friday.", "It happened last Friday (5 January 2024)."),
        ((2024, 1, 1), "Last Sunday was calm.", "Last Sunday (31 December 2023) was calm."),
        ((2024, 1, 3), "I ran this past Mon.", "I ran this past Mon (1 January 2024)."),
        ((2024, 1, 1), "We hiked last weekend.", "We hiked last weekend (weekend of 30 December 2023)."),
        ((2024, 1, 6), "We hiked last weekend.", "We hiked last weekend (weekend of 30 December 2023)."),
        ((2024, 1, 7), "We hiked last weekend.", "We hiked last weekend (weekend of 30 December 2023)."),
        # what the date does not fix stays as said
        ((2024, 1, 3), "See you next Friday.", "See you next Friday."),
        ((2024, 1, 3), "The last week of June is busy.", "The last week of June is busy."),
        ((2024, 1, 3), "It was my last year at school.", "It was my last year at school."),
        ((2024, 1, 3), "On Friday I swam.", "On Friday I swam."),
        ((2024, 1, 3), "It lasted 0 days ago.", "It lasted 0 days ago."),
        ((2024, 1, 3), "Yesterday (2 January 2024) I swam.", "Yesterday (2 January 2024) I swam."),
        ((1, 1, 1), "I was born yesterday.", "I was born yesterday."),
        ((9999, 12, 31), "See you next year.", "See you next year."),
    ],
)
def test_relative_words_get_the_absolute_date_the_turns_day_fixes(
    said_on: tuple[int, int, int], sentence: str, resolved: str
) -> None:
    """Yesterday, tomorrow, N units ago, last/next week, month, year, weekday and weekend."""
    assert resolve(sentence, day(*said_on)) == resolved


def test_a_turns_day_is_its_utc_day_and_unknown_times_have_none() -> None:
    """ts 0, negative, not a number or beyond year 9999 has no day; a late-evening time is its UTC day."""
    assert day_of(datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC).timestamp()) == day(2024, 2, 29)
    assert day_of(datetime(2024, 3, 1, tzinfo=UTC).timestamp()) == day(2024, 3, 1)
    for unknown in (0, 0.0, -1.0, True, "2024-01-01", None, float("nan"), float("inf"), 1e300):
        assert day_of(unknown) is None


@given(st.integers(day(1, 1, 1), day(9999, 12, 31)))
def test_a_written_day_reads_back(ordinal: int) -> None:
    """format_day and parse_day are inverse over every representable day."""
    assert parse_day(format_day(ordinal)) == ordinal


def test_day_headers_that_are_no_date_are_not_read_as_one() -> None:
    for text in ("30 February 2024", "8 Mai 2023", "8 may 2023", "May 2023", "8 May 10000"):
        assert parse_day(text) is None


@given(
    st.integers(day(1970, 1, 2), day(9999, 12, 1)), st.sampled_from(["yesterday", "tomorrow", "2 days ago"])
)
def test_day_words_land_on_neighbouring_days(ordinal: int, word: str) -> None:
    """Checked against datetime's own arithmetic on any day."""
    shift = {"yesterday": -1, "tomorrow": 1, "2 days ago": -2}[word]
    expected = date.fromordinal(ordinal) + timedelta(days=shift)
    assert resolve(f"It was {word}.", ordinal) == f"It was {word} ({format_day(expected.toordinal())})."


# Dated turns in the context --------------------------------------------------------------------

KEY = MemoryKey("t", "u", "s")
TS = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()


def played(config: ShortTermMemoryConfig, turns: list[ConversationTurn]) -> SessionState:
    state = SessionState()
    for n, turn in enumerate(turns):
        for event in decide(
            state, AddTurn(turn=turn), now=float(n), command_id=f"c{n}", key=KEY, config=config
        ):
            state = evolve(state, event)
    return state


def test_by_default_a_context_shows_no_date_even_when_turns_have_one() -> None:
    """PenguiFlow sets ts on every turn and compares contexts exactly: the default adds nothing."""
    state = played(
        ShortTermMemoryConfig(strategy="truncation"),
        [ConversationTurn(user_message="q", assistant_response="a", ts=TS)],
    )
    assert llm_context(state) == {"conversation_memory": {"recent_turns": [{"user": "q", "assistant": "a"}]}}


def test_with_include_turn_dates_a_turn_shows_its_day_and_the_budget_counts_it() -> None:
    """ "date": "8 May 2023" on turns whose time is known; estimate_tokens measures the real rendering."""
    config = ShortTermMemoryConfig(strategy="truncation", include_turn_dates=True)
    state = played(
        config,
        [
            ConversationTurn(user_message="q", assistant_response="a", ts=TS),
            ConversationTurn(user_message="r", assistant_response="b"),
        ],
    )
    memory = llm_context(state)["conversation_memory"]
    assert memory["recent_turns"] == [
        {"user": "q", "assistant": "a", "date": "8 May 2023"},
        {"user": "r", "assistant": "b"},
    ]
    assert estimate_tokens(state) == len(render(memory)) // 4 + 1


def test_a_budget_holds_with_dated_turns() -> None:
    """Truncation to a budget counts the dates: the view fits, one more turn would not."""
    budget = MemoryBudget(full_zone_turns=50, summary_max_tokens=40, total_max_tokens=60)
    config = ShortTermMemoryConfig(strategy="truncation", include_turn_dates=True, budget=budget)
    turns = [
        ConversationTurn(user_message=f"question {n}", assistant_response="ok", ts=TS + n) for n in range(20)
    ]
    state = played(config, turns)
    memory = llm_context(state)["conversation_memory"]
    assert len(render(memory)) // 4 + 1 <= 60
    shown = len(memory["recent_turns"])
    one_more = {
        "recent_turns": [
            turns[-shown - 1].to_llm(include_digest=True, include_date=True),
            *memory["recent_turns"],
        ]
    }
    assert len(render(one_more)) // 4 + 1 > 60
    assert json.dumps(memory).count("8 May 2023") == shown


@pytest.mark.parametrize(
    "sentence",
    ["I moved YESTERDAY.", "I moved Yesterday.", "Café opened yesterday.", "Na café, 2 weeks AGO."],
)
def test_relative_words_are_found_in_any_case_with_or_without_non_ascii_letters(sentence: str) -> None:
    """The quick test for ASCII text (plain substrings of the lower-cased sentence) and the regex for
    the rest find the same relative words."""
    assert resolve(sentence, date(2023, 5, 8).toordinal()) != sentence
