"""`convmem.recommended(total_tokens)`: the offline configuration that uses the whole budget, in one call."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import (
    ExtractiveSummarizer,
    InMemoryEventLog,
    MemorySetup,
    ProcessSummarizer,
    recommended,
)
from convmem.adapters.frontends.cli._common import CliError
from convmem.adapters.frontends.cli._serve import load_config
from convmem.errors import InvalidConfig
from convmem.events import ConversationTurn, MemoryKey
from convmem.projections import default_token_estimator, render

DAY = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()


def test_the_setup_is_a_rolling_summary_whose_summary_takes_what_recent_turns_leave() -> None:
    """A few recent turns, a summary allowance of the budget less a small reserve, dated turns, and an
    overflow policy that trims the summary's view before it drops a recent turn."""
    setup = recommended(total_tokens=4000)
    budget = setup.config.budget
    assert setup.config.strategy == "rolling_summary"
    assert setup.config.include_turn_dates
    assert budget.total_max_tokens == 4000
    assert budget.full_zone_turns == 2
    assert budget.summary_max_tokens == 3900
    assert budget.overflow_policy == "truncate_summary"
    assert isinstance(setup.summarizer, ProcessSummarizer)  # issue 15: off this process's interpreter
    assert setup.summarizer.target == "convmem.adapters.backends.summarizers:ExtractiveSummarizer"
    assert setup.summarizer.kwargs == {"max_tokens": budget.summary_max_tokens}
    assert setup.summarizer.pid is None  # started by the first summary, not by recommended()
    here = recommended(total_tokens=4000, worker_process=False).summarizer
    assert isinstance(here, ExtractiveSummarizer)
    assert here.max_tokens == budget.summary_max_tokens
    assert dict(setup) == {"config": setup.config, "summarizer": setup.summarizer}
    assert convmem.recommended is recommended
    assert "total_max_tokens=4000" in repr(setup)


def test_a_custom_estimator_sizes_the_summarizer() -> None:
    """The summarizer measures with the estimator the memory system will use."""

    def by_bytes(text: str) -> int:
        return len(text.encode()) // 3 + 1

    setup = recommended(total_tokens=1000, estimator=by_bytes)
    assert isinstance(setup.summarizer, ExtractiveSummarizer)  # a callable cannot travel to a process
    with pytest.raises(InvalidConfig, match="worker_process"):
        recommended(total_tokens=1000, estimator=by_bytes, worker_process=True)
    summary = setup.summarizer({"previous_summary": "", "turns": [{"user": "Zoë " * 2000, "assistant": ""}]})
    assert by_bytes(summary["summary"]) <= setup.config.budget.summary_max_tokens


@pytest.mark.parametrize("total", [199, 0, -1, 2.5, True, "4000"])
def test_a_budget_too_small_or_not_a_number_is_refused(total: object) -> None:
    with pytest.raises(InvalidConfig, match="total_tokens"):
        recommended(total_tokens=total)  # type: ignore[arg-type]


def test_one_line_gives_a_memory_whose_context_uses_its_budget_and_keeps_the_newest_turns() -> None:
    """MemorySystem(**setup, log=...): the context fits, shows a dated summary and the newest turns whole."""
    setup = recommended(total_tokens=600)
    key = MemoryKey("acme", "alice", "chat-1")
    facts = [f"My locker number {n} is at the Porto gym, level {n % 4}." for n in range(30)]
    with MemorySystem(**setup, log=InMemoryEventLog()) as memory:
        session = memory.session(key)
        for n, fact in enumerate(facts):
            turn = ConversationTurn(user_message=fact, assistant_response="Noted. " * 20, ts=DAY + 86400 * n)
            session.add_turn(turn, timeout=5)
        session.flush(timeout=10)
        context = session.get_llm_context()["conversation_memory"]
        tokens = session.estimate_tokens()
    assert tokens <= 600
    assert tokens == default_token_estimator(render(context))
    assert [t["user"] for t in context["recent_turns"]] == facts[-2:]
    assert context["recent_turns"][-1]["date"] == "30 March 2024"
    assert "1 March 2024:" in context["summary"]
    assert tokens > 450, "the summary grows into what the recent turns leave"


def test_serve_without_a_config_file_uses_the_recommended_configuration(tmp_path: Path) -> None:
    """`convmem serve` with no --config serves recommended(--total-tokens); a config file still wins."""
    assert load_config(None, 2000) == recommended(total_tokens=2000).config
    with pytest.raises(CliError, match="total-tokens"):
        load_config(None, 10)
    path = tmp_path / "config.json"
    path.write_text('{"strategy": "truncation"}', encoding="utf-8")
    assert load_config(path, 2000).strategy == "truncation"


def test_the_setup_type_is_exported() -> None:
    assert isinstance(recommended(), MemorySetup)
    assert recommended().config.budget.total_max_tokens == 4000
