"""`token_counter`: every budget in the planner's tokens (a callable, or a tiktoken encoding by name).

The real cl100k_base tokenizer is loaded offline from TIKTOKEN_CACHE_DIR (tests/conftest.py points it
at the copy in the repository's shared data when the environment does not).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.actors import MemorySystem, encoding_counter
from convmem.adapters import ExtractiveSummarizer, InMemoryEventLog, recommended
from convmem.errors import InvalidConfig, MemoryBudgetExceeded
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    decode_event,
)
from convmem.projections import default_token_estimator, render

KEY = MemoryKey("acme", "alice", "chat-1")
DAY = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()
CL100K = encoding_counter("cl100k_base")

# Texts a tokenizer and the length estimate disagree on: words, digits, punctuation runs, CJK, emoji,
# escapes that JSON lengthens, whitespace runs.
_PIECES = st.sampled_from(
    [
        "hello",
        " world",
        "Porto",
        "1234567",
        "!!!",
        "...",
        "\u4f60\u597d",
        "\U0001f600",
        '"',
        "\\",
        "\n",
        "   ",
        "\t",
        "naïve",
        "Zoë",
        "<|endoftext|>",
        "_",
        "ā",
    ]
)
TEXTS = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=300),
    st.lists(_PIECES, max_size=120).map("".join),
)


def _context_tokens(context: dict[str, object]) -> int:
    memory = context.get("conversation_memory")
    return CL100K(render(memory)) if memory is not None else 0


@settings(max_examples=25)
@given(
    turns=st.lists(st.tuples(TEXTS.map(lambda t: t or "hi"), TEXTS), min_size=1, max_size=10),
    total=st.sampled_from([250, 400, 600]),
)
def test_with_the_real_tokenizer_the_context_never_exceeds_the_budget_by_one_token(
    turns: list[tuple[str, str]], total: int
) -> None:
    """recommended(token_counter="cl100k_base"): after every turn, cl100k counts the context within budget
    (read with no query, and with a query: recall is on in `recommended`)."""
    setup = recommended(total, token_counter="cl100k_base", worker_process=False)
    assert setup.config.token_counter == "cl100k_base"
    with MemorySystem(**setup, log=InMemoryEventLog()) as memory:
        session = memory.session(KEY)
        for n, (user, assistant) in enumerate(turns):
            session.add_turn(
                ConversationTurn(user_message=user, assistant_response=assistant, ts=DAY + n * 3600),
                timeout=5,
            )
            context = session.get_llm_context()
            assert _context_tokens(context) <= total
            # with the planner's message as the query, the lines recalled for it stay within too
            assert _context_tokens(session.get_llm_context(query=user + assistant)) <= total
        session.flush(timeout=10)
        context = session.get_llm_context()
        assert _context_tokens(context) <= total
        assert session.estimate_tokens() == _context_tokens(context)  # settled: the same state
        summary = context.get("conversation_memory", {}).get("summary", "")
        assert CL100K(summary) <= setup.config.budget.summary_max_tokens


@settings(max_examples=20)
@given(turns=st.lists(st.tuples(TEXTS.map(lambda t: t or "hi"), TEXTS), min_size=1, max_size=8))
def test_truncate_oldest_and_error_policies_hold_in_real_tokens(turns: list[tuple[str, str]]) -> None:
    """The overflow decisions count in the same tokens: `error` refuses what cl100k puts over budget."""
    for policy in ("truncate_oldest", "error"):
        config = ShortTermMemoryConfig(
            strategy="truncation",
            budget=MemoryBudget(
                full_zone_turns=4, summary_max_tokens=100, total_max_tokens=150, overflow_policy=policy
            ),
            token_counter="cl100k_base",
        )
        with MemorySystem(config, log=InMemoryEventLog()) as memory:
            session = memory.session(KEY)
            for user, assistant in turns:
                turn = ConversationTurn(user_message=user, assistant_response=assistant)
                try:
                    session.add_turn(turn, timeout=5)
                except MemoryBudgetExceeded as exc:
                    refused = exc
                    assert policy == "error"
                    assert refused.tokens > 150  # counted by cl100k
                assert _context_tokens(session.get_llm_context()) <= 150


def test_the_encoding_name_is_recorded_so_a_replay_measures_the_same() -> None:
    """A system given no counter, reading the log, measures the session with the encoding it recorded."""
    log = InMemoryEventLog()
    text = "\u4f60\u597d\u4e16\u754c " * 60  # the estimate and cl100k differ widely on CJK
    config = ShortTermMemoryConfig(strategy="truncation")
    with MemorySystem(config, log=log, token_counter="cl100k_base") as memory:
        session = memory.session(KEY)
        session.add_turn(ConversationTurn(user_message=text, assistant_response="ok"), timeout=5)
        written = session.estimate_tokens()
    started = [e for e in (decode_event(r.data) for r in log.read(KEY)) if isinstance(e, SessionStarted)]
    assert started
    assert started[0].config.token_counter == "cl100k_base"
    with MemorySystem(log=log) as replayed:
        again = replayed.session(KEY)
        assert (
            again.estimate_tokens()
            == written
            == CL100K(render(again.get_llm_context()["conversation_memory"]))
        )
        assert written != default_token_estimator(render(again.get_llm_context()["conversation_memory"]))


def test_a_callable_counter_measures_every_budget_and_is_not_recorded() -> None:
    calls: list[str] = []

    def words(text: str) -> int:
        calls.append(text)
        return len(text.split()) + 1

    config = ShortTermMemoryConfig(
        strategy="truncation", budget=MemoryBudget(summary_max_tokens=40, total_max_tokens=40)
    )
    with MemorySystem(config, log=InMemoryEventLog(), token_counter=words) as memory:
        session = memory.session(KEY)
        for n in range(10):
            session.add_turn(
                ConversationTurn(user_message=f"fact {n} " * 5, assistant_response="ok"), timeout=5
            )
        context = session.get_llm_context()["conversation_memory"]
        assert words(render(context)) <= 40 < words(render({"recent_turns": [{"user": "x " * 60}]}))
        assert session.estimate_tokens() == words(render(context))
        assert session.snapshot_state().config.token_counter is None
    assert calls
    with pytest.raises(InvalidConfig, match="not both"):
        MemorySystem(log=InMemoryEventLog(), token_counter=words, token_estimator=words)


def test_the_worker_process_summarizer_loads_the_named_encoding() -> None:
    """The encoding name travels to the summarizer's process, which sizes summaries with it."""
    setup = recommended(300, token_counter="cl100k_base")
    try:
        assert setup.summarizer.kwargs == {"max_tokens": 200, "estimator": "cl100k_base"}
        text = "\u4f60\u597d\u4e16\u754c\u3002" * 400
        summary = setup.summarizer({"previous_summary": "", "turns": [{"user": text, "assistant": "ok"}]})
        assert CL100K(summary["summary"]) <= 200
    finally:
        setup.summarizer.close()


@pytest.mark.parametrize("name", ["", "cl100k base", "../etc/passwd", 7, "x" * 65])
def test_a_malformed_encoding_name_is_refused_by_the_config(name: object) -> None:
    with pytest.raises(InvalidConfig, match="token_counter"):
        ShortTermMemoryConfig(token_counter=name)  # type: ignore[arg-type]


def test_an_unknown_encoding_is_refused_when_configured_not_at_the_first_view() -> None:
    config = ShortTermMemoryConfig(token_counter="no_such_base")
    with pytest.raises(InvalidConfig, match="no_such_base"):
        MemorySystem(config, log=InMemoryEventLog())
    with pytest.raises(InvalidConfig, match="no_such_base"):
        recommended(2000, token_counter="no_such_base")
    with pytest.raises(InvalidConfig, match="token_counter"):
        MemorySystem(log=InMemoryEventLog(), token_counter=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="differs"):
        MemorySystem(
            ShortTermMemoryConfig(token_counter="o200k_base"),
            log=InMemoryEventLog(),
            token_counter="cl100k_base",
        )
    assert ExtractiveSummarizer(estimator="cl100k_base").max_tokens == 1000
