"""The pure core with PenguiFlow's zero settings, and the events of a move and an import."""

from __future__ import annotations

import pytest
from strategies import SESSION_KEY as KEY
from strategies import Session, rolling, turn

from convmem.errors import InvalidInput, MemoryBudgetExceeded
from convmem.events import (
    BacklogTrimmed,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    SessionCleared,
    SessionRestored,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnsAdopted,
)
from convmem.projections import (
    AddTurn,
    AdoptTurns,
    Clear,
    Restore,
    llm_context,
    next_due_at,
    replay,
    summary_due,
)

OTHER = MemoryKey("penguiflow:unbound", "penguiflow:unbound", "f00d")


def shown(session: Session) -> dict[str, object]:
    patch = llm_context(session.state)
    memory = patch["conversation_memory"]
    assert isinstance(memory, dict)
    return memory


def test_a_full_zone_of_zero_turns_sends_every_turn_to_the_pending_zone() -> None:
    """full_zone_turns=0 under rolling_summary: no recent turn, every unsummarized turn pending."""
    session = Session(rolling(budget=MemoryBudget(full_zone_turns=0)))
    session.add(1, 2)
    assert shown(session)["recent_turns"] == []
    assert [t["user"] for t in shown(session)["pending_turns"]] == ["question 1", "question 2"]  # type: ignore[index]
    request = session.request()
    assert (request.covers_from, request.covers_through) == (1, 2)


def test_a_full_zone_of_zero_turns_under_truncation_shows_nothing() -> None:
    """full_zone_turns=0 under truncation keeps no turn in view (PenguiFlow drops them all)."""
    session = Session(ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=0)))
    session.add(1, 2)
    assert llm_context(session.state) == {"conversation_memory": {"recent_turns": []}}
    assert [r.index for r in session.state.turns] == [1, 2]  # the history itself is kept


def test_a_summary_allowance_of_zero_stores_the_summary_empty_and_covers_its_turns() -> None:
    """summary_max_tokens=0: any summary text is accepted, stored empty, and its turns leave pending."""
    session = Session(rolling(budget=MemoryBudget(full_zone_turns=1, summary_max_tokens=0)))
    session.add(1, 2)
    events = session.succeed(session.request(), "a summary PenguiFlow would throw away")
    produced = [e for e in events if isinstance(e, SummaryProduced)]
    assert [(p.summary, p.covers_through) for p in produced] == [("", 1)]
    assert "pending_turns" not in shown(session)
    assert "summary" not in shown(session)
    assert session.health == (MemoryHealth.HEALTHY, 0)


def test_a_total_budget_of_zero_sets_no_budget() -> None:
    """total_max_tokens=0: the error policy refuses nothing and views are never cut."""
    config = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(full_zone_turns=3, total_max_tokens=0, overflow_policy="error"),
    )
    session = Session(config)
    session.do(AddTurn(turn=turn(1, answer="x" * 50_000)))
    assert len(shown(session)["recent_turns"]) == 1  # type: ignore[arg-type]


def test_a_positive_total_budget_still_refuses_under_the_error_policy() -> None:
    """The relaxation changes nothing for budgets above zero (every stored config has one)."""
    config = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(
            full_zone_turns=3, summary_max_tokens=0, total_max_tokens=1, overflow_policy="error"
        ),
    )
    with pytest.raises(MemoryBudgetExceeded):
        Session(config).add(1)


def test_a_zero_back_off_retries_at_once() -> None:
    """retry_backoff_seconds of 0: the retry is due at the failure's own time."""
    session = Session(rolling(health=HealthPolicy(retry_backoff_seconds=(0.0,)), retry_attempts=2))
    session.add(1, 2, 3)
    session.fail(session.request())
    assert session.health == (MemoryHealth.RETRY, 1)
    assert next_due_at(session.state) == session.now
    assert session.due() is not None


def test_a_degraded_session_with_no_probe_interval_probes_only_when_a_turn_arrives() -> None:
    """degraded_retry_seconds=0: no timer at all (it would spin), a probe on each new turn."""
    session = Session(rolling(health=HealthPolicy(degraded_retry_seconds=0.0), retry_attempts=0))
    session.add(1, 2, 3)
    session.fail(session.request())
    assert session.health == (MemoryHealth.DEGRADED, 1)
    session.now += 10_000
    assert next_due_at(session.state) is None
    assert summary_due(session.state, session.now) is None
    session.add(4)
    probe = summary_due(session.state, session.now, turn_added=True)
    assert probe is not None
    assert probe.health is MemoryHealth.DEGRADED
    events = session.succeed(probe, "<session_summary>back</session_summary>")
    assert session.state.health is MemoryHealth.HEALTHY, events


def test_a_backlog_limit_of_zero_keeps_no_degraded_backlog() -> None:
    """recovery_backlog_limit=0: a DEGRADED session drops every evicted turn from the context."""
    session = Session(rolling(recovery_backlog_limit=0, retry_attempts=0))
    session.add(1, 2, 3)
    session.fail(session.request())
    events = session.add(4)
    assert any(isinstance(e, BacklogTrimmed) for e in events)
    assert session.pending() == []


# Moves and imports -------------------------------------------------------------------


def test_adopted_turns_follow_the_sessions_own_and_are_summarized_there() -> None:
    """AdoptTurns appends the moved turns after the session's own, unsummarized, numbered on."""
    session = Session()
    session.add(1, 2)
    events = session.do(AdoptTurns(source=OTHER, source_seq=5, turns=(turn("a"), turn("b"))))
    adopted = events[0]
    assert isinstance(adopted, TurnsAdopted)
    assert (adopted.source, adopted.source_seq, adopted.first_index) == (OTHER, 5, 3)
    assert [r.turn.user_message for r in session.state.turns] == [
        "question 1",
        "question 2",
        "question a",
        "question b",
    ]
    assert session.pending() == [1, 2]
    assert replay(session.log) == session.state


def test_a_session_cannot_adopt_its_own_turns() -> None:
    """Adopting from the session itself is refused (it would duplicate every turn)."""
    with pytest.raises(InvalidInput, match="source"):
        Session().do(AdoptTurns(source=KEY, source_seq=1, turns=(turn(1),)))


def test_the_clear_that_ends_a_move_names_the_key_and_refuses_late_turns() -> None:
    """Clear(moved_to, through) records where the turns went; a turn after `through` refuses it."""
    session = Session()
    session.add(1, 2)
    with pytest.raises(InvalidInput, match="through"):
        session.do(Clear(moved_to=KEY, through=1))
    (cleared,) = session.do(Clear(moved_to=OTHER, through=2))
    assert isinstance(cleared, SessionCleared)
    assert cleared.moved_to == OTHER
    assert session.state.turns == ()


def test_an_import_records_its_origin() -> None:
    """Restore(origin=...) records where the imported state came from."""
    session = Session()
    events = session.do(Restore(summary="s", turns=(turn(1),), origin="penguiflow-state:sha256:ab"))
    restored = [e for e in events if isinstance(e, SessionRestored)]
    assert [r.origin for r in restored] == ["penguiflow-state:sha256:ab"]
