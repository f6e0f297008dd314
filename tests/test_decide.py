"""Decisions, given/when/then: turns, summaries, the RFC's health machine, budgets, clear and restore."""

from __future__ import annotations

import pytest
from strategies import SESSION_KEY as KEY
from strategies import Session, degraded, rolling, turn, words

from convmem.errors import InvalidInput, MemoryBudgetExceeded
from convmem.events import (
    AgentsMemoryConfig,
    AnyEvent,
    BacklogTrimmed,
    HealthChanged,
    HealthPolicy,
    ItemPopped,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionErased,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnAdded,
    decode_event,
    encode_event,
)
from convmem.projections import (
    AddItems,
    AddTurn,
    Clear,
    PopItem,
    Restore,
    SessionState,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    decide,
    default_token_estimator,
    evolve,
    full_tokens,
    next_due_at,
    summary_problem,
)

HEALTHY, RETRY, DEGRADED, RECOVERING = (
    MemoryHealth.HEALTHY,
    MemoryHealth.RETRY,
    MemoryHealth.DEGRADED,
    MemoryHealth.RECOVERING,
)


def transitions(events: list[AnyEvent]) -> list[tuple[MemoryHealth, MemoryHealth, int]]:
    return [(e.old, e.new, e.attempt) for e in events if isinstance(e, HealthChanged)]


# Opening and turns ------------------------------------------------------------------


def test_the_first_command_opens_the_session() -> None:
    """A command on a new session first emits SessionStarted with the key and config."""
    session = Session()
    events = session.add(1)
    assert [type(e) for e in events] == [SessionStarted, TurnAdded]
    started, added = events
    assert isinstance(started, SessionStarted)
    assert isinstance(added, TurnAdded)
    assert (started.key, started.config, started.at) == (KEY, session.config, 1000.0)
    assert [(e.seq, e.event_id) for e in events] == [(1, "cmd1/session.started/1"), (2, "cmd1/turn.added/1")]
    assert (added.index, added.turn) == (1, turn(1))


def test_an_explicit_start_records_the_injected_summary() -> None:
    """StartSession carries the cross-session summary into SessionStarted."""
    other = MemoryKey("acme.corp", "alice@example.com", "chat 0")
    command = StartSession(key=KEY, config=rolling(), injected_summary="before", injected_from=other)
    (started,) = Session().do(command)
    assert isinstance(started, SessionStarted)
    assert (started.injected_summary, started.injected_from) == ("before", other)


def test_starting_a_started_session_does_nothing() -> None:
    """StartSession on an open session emits nothing."""
    session = Session()
    session.add(1)
    assert session.do(StartSession(key=KEY, config=rolling())) == []


def test_a_new_session_needs_a_key_and_a_config() -> None:
    """Without key and config a session cannot be opened."""
    with pytest.raises(InvalidInput, match="key"):
        decide(SessionState(), AddTurn(turn=turn(1)), now=1.0, command_id="c")


def test_a_command_needs_an_id() -> None:
    """Event ids derive from the command id, so it must not be empty."""
    with pytest.raises(InvalidInput, match="command_id"):
        decide(SessionState(), Clear(), now=1.0, command_id="", key=KEY, config=rolling())


def test_turns_get_consecutive_numbers_and_seqs() -> None:
    """Each AddTurn stores one TurnAdded with the next turn number and seq."""
    session = Session()
    session.add(1, 2, 3)
    added = [e for e in session.log if isinstance(e, TurnAdded)]
    assert [(e.index, e.seq) for e in added] == [(1, 2), (2, 3), (3, 4)]


def test_a_decision_does_not_change_the_state_it_was_given() -> None:
    """decide is pure: the input state is untouched and a second call gives the same events."""
    session = Session()
    session.add(1, 2)
    before = session.state
    first = decide(before, AddTurn(turn=turn(3)), now=5.0, command_id="x")
    second = decide(before, AddTurn(turn=turn(3)), now=5.0, command_id="x")
    assert first == second
    assert session.state is before


# Summaries --------------------------------------------------------------------------


def test_no_summary_is_due_until_a_turn_leaves_the_full_zone() -> None:
    """rolling_summary asks for a summary only once a turn is pending."""
    session = Session()
    session.add(1, 2)
    assert session.due() is None
    assert next_due_at(session.state) is None
    session.add(3)
    assert session.pending() == [1]
    assert session.due() is not None


@pytest.mark.parametrize("strategy", ["none", "truncation"])
def test_strategies_without_a_summarizer_never_ask_for_one(strategy: str) -> None:
    """none and truncation never make a summary request."""
    session = Session(ShortTermMemoryConfig(strategy=strategy, budget=MemoryBudget(full_zone_turns=1)))  # type: ignore[arg-type]
    session.add(1, 2, 3, 4)
    assert session.due() is None
    assert next_due_at(session.state) is None


def test_a_request_covers_exactly_the_pending_turns() -> None:
    """The request names the pending range and carries the previous summary."""
    session = Session()
    session.add(1, 2, 3, 4)
    request = session.request()
    assert (request.covers_from, request.covers_through) == (1, 2)
    assert request.turns == (turn(1), turn(2))
    assert (request.key, request.previous_summary, request.health, request.attempt) == (KEY, "", HEALTHY, 0)
    assert request.payload() == {
        "previous_summary": "",
        "turns": [
            {"user": "question 1", "assistant": "answer 1"},
            {"user": "question 2", "assistant": "answer 2"},
        ],
        "max_tokens": 1000,  # the room beside turns 3-4 is far larger: summary_max_tokens bounds it
    }


def test_a_request_tells_the_summarizer_the_smaller_of_its_room_and_summary_max_tokens() -> None:
    """``max_tokens`` is the one bound a summarizer keeps: the view's room for the summary when the
    turns shown beside it leave less than ``summary_max_tokens``, else ``summary_max_tokens``."""
    tight = Session(
        rolling(budget=MemoryBudget(total_max_tokens=60, full_zone_turns=2, summary_max_tokens=50))
    )
    tight.add(1, 2, 3, 4)
    room = tight.request().max_tokens
    assert 1 <= room < 50  # turns 3 and 4 take part of the 60
    roomy = Session(
        rolling(budget=MemoryBudget(total_max_tokens=6000, full_zone_turns=2, summary_max_tokens=50))
    )
    roomy.add(1, 2, 3, 4)
    assert roomy.request().max_tokens == 50


def test_a_summary_result_stores_the_summary_of_its_range() -> None:
    """Success emits SummaryProduced with the text and the covered range, and no health change."""
    session = Session()
    session.add(1, 2, 3)
    events = session.succeed(session.request(), "<session_summary>one</session_summary>")
    assert len(events) == 1
    (produced,) = events
    assert isinstance(produced, SummaryProduced)
    assert (produced.summary, produced.covers_from, produced.covers_through) == (
        "<session_summary>one</session_summary>",
        1,
        1,
    )
    assert session.pending() == []
    assert session.state.summary == "<session_summary>one</session_summary>"


def test_summary_removes_only_its_covered_range() -> None:
    """Turns added while a summary is in flight stay pending (PenguiFlow's default loses them)."""
    session = Session()
    session.add(1, 2, 3)
    in_flight = session.request()
    session.add(4, 5)
    assert session.pending() == [1, 2, 3]
    session.succeed(in_flight, "covers one")
    assert session.pending() == [2, 3]
    assert session.recent() == [4, 5]
    assert [r.index for r in session.state.turns] == [1, 2, 3, 4, 5]
    follow_up = session.request()
    assert (follow_up.covers_from, follow_up.covers_through, follow_up.previous_summary) == (
        2,
        3,
        "covers one",
    )


def test_the_next_request_folds_the_previous_summary() -> None:
    """Each request starts from the summary the last one produced."""
    session = Session()
    session.add(1, 2, 3)
    session.succeed(session.request(), "first")
    session.add(4)
    assert session.request().previous_summary == "first"


def test_a_stale_result_after_a_clear_is_ignored() -> None:
    """A summary or failure for a request made before a clear changes nothing."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    session.do(Clear())
    session.add(4, 5, 6)
    before = session.state
    assert session.succeed(request) == []
    assert session.fail(request) == []
    assert session.state is before


def test_a_stale_result_after_a_restore_is_ignored() -> None:
    """A result for a request made before a restore changes nothing."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    session.do(Restore(summary="", turns=(turn("a"), turn("b"), turn("c"))))
    assert session.succeed(request) == []
    assert session.fail(request) == []


def test_a_result_that_another_summary_overtook_is_ignored() -> None:
    """Once a newer summary landed, an older request's result is stale."""
    session = Session()
    session.add(1, 2, 3)
    old = session.request()
    session.succeed(old, "newer")
    session.add(4)
    assert session.succeed(old, "older") == []
    assert session.state.summary == "newer"


def test_a_duplicate_failure_counts_once() -> None:
    """A failure delivered twice moves the health machine one step, not two."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    session.fail(request)
    assert session.fail(request) == []
    assert session.health == (RETRY, 1)


def test_a_result_for_another_session_is_ignored() -> None:
    """A request that names another key does not touch this session."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    foreign = SummaryRequest(
        key=MemoryKey("acme.corp", "mallory", "chat 1"),
        previous_summary=request.previous_summary,
        covers_from=request.covers_from,
        covers_through=request.covers_through,
        turns=request.turns,
        health=request.health,
        attempt=request.attempt,
    )
    assert session.succeed(foreign) == []
    assert session.fail(foreign) == []


def test_a_result_for_a_session_that_does_not_summarize_is_ignored() -> None:
    """Summary results sent to a truncation session change nothing."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    truncating = Session(ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=2)))
    truncating.add(1, 2, 3)
    assert truncating.succeed(request) == []
    assert truncating.fail(request) == []
    assert truncating.health == (HEALTHY, 0)


def test_a_result_for_an_erased_session_is_ignored() -> None:
    """After the tombstone nothing of the old session exists to summarize."""
    session = Session()
    session.add(1, 2, 3)
    request = session.request()
    session.state = evolve(session.state, SessionErased(seq=session.state.version + 1, event_id="x", at=1.0))
    assert session.succeed(request) == []
    assert session.fail(request) == []


@pytest.mark.parametrize(
    ("summary", "problem"),
    [
        ("", "empty"),
        (" \n\t", "empty"),
        ("ok\x00", "NUL"),
        ("ok\ud800", "surrogate"),
        ("x" * 4000, "over summary_max_tokens=20"),
        (None, "not a string"),
    ],
    ids=["empty", "blank", "nul", "surrogate", "too-long", "not-a-string"],
)
def test_a_bad_summary_is_a_failure(summary: object, problem: str) -> None:
    """An empty, NUL, lone-surrogate, non-string or oversized summary is not stored; it fails."""
    session = Session(rolling(budget=MemoryBudget(full_zone_turns=2, summary_max_tokens=20)))
    session.add(1, 2, 3)
    events = session.succeed(session.request(), summary)  # type: ignore[arg-type]
    assert [type(e) for e in events] == [HealthChanged]
    assert transitions(events) == [(HEALTHY, RETRY, 1)]
    (changed,) = events
    assert isinstance(changed, HealthChanged)
    assert problem in changed.reason
    assert session.state.summary == ""
    assert session.pending() == [1]


def test_summary_size_is_measured_with_the_sessions_estimator() -> None:
    """summary_max_tokens is counted by the estimator the decision is given."""
    config = rolling(budget=MemoryBudget(full_zone_turns=2, summary_max_tokens=3))
    long_words = "abcdefghijklmnopqrstuvwxyz " * 2
    assert summary_problem(long_words, config, words) is None
    assert summary_problem(long_words, config, default_token_estimator) is not None
    session = Session(config, estimator=words)
    session.add(1, 2, 3)
    assert [type(e) for e in session.succeed(session.request(), long_words)] == [SummaryProduced]


# The health machine -----------------------------------------------------------------


def test_failures_walk_retry_attempts_then_degrade() -> None:
    """HEALTHY -> RETRY(1) -> RETRY(2) -> RETRY(3) -> DEGRADED, one HealthChanged each."""
    session = Session()
    session.add(1, 2, 3)
    seen = []
    for _ in range(4):
        request = session.due()
        while request is None:
            session.now += 0.5
            request = session.due()
        seen += transitions(session.fail(request, "timeout"))
    assert seen == [
        (HEALTHY, RETRY, 1),
        (RETRY, RETRY, 2),
        (RETRY, RETRY, 3),
        (RETRY, DEGRADED, 1),
    ]
    reasons = {e.reason for e in session.log if isinstance(e, HealthChanged)}
    assert reasons == {"timeout"}


def test_retries_back_off_2_4_8_seconds_by_default() -> None:
    """Retry n is due retry_backoff_seconds[n-1] after the failure before it, not earlier."""
    session = Session()
    session.add(1, 2, 3)
    session.fail(session.request())
    for attempt, wait in ((1, 2.0), (2, 4.0), (3, 8.0)):
        failed_at = session.now
        assert next_due_at(session.state) == failed_at + wait
        session.now = failed_at + wait - 0.001
        assert session.due() is None
        session.now = failed_at + wait
        request = session.request()
        assert (request.health, request.attempt) == (RETRY, attempt)
        session.fail(request)
    assert session.health == (DEGRADED, 1)


def test_back_off_intervals_are_settings() -> None:
    """Operators and tests can shorten every interval."""
    policy = HealthPolicy(retry_backoff_seconds=(0.25,), degraded_retry_seconds=1.5)
    session = Session(rolling(health=policy, retry_attempts=2))
    session.add(1, 2, 3)
    session.fail(session.request())
    assert next_due_at(session.state) == session.now + 0.25
    session.now += 0.25
    session.fail(session.request())
    assert next_due_at(session.state) == session.now + 0.25  # the last interval repeats
    session.now += 0.25
    session.fail(session.request())
    assert session.health == (DEGRADED, 1)
    assert next_due_at(session.state) == session.now + 1.5


def test_zero_retry_attempts_degrade_on_the_first_failure() -> None:
    """With retry_attempts=0 a failure goes straight to DEGRADED."""
    session = Session(rolling(retry_attempts=0))
    session.add(1, 2, 3)
    assert transitions(session.fail(session.request())) == [(HEALTHY, DEGRADED, 1)]


def test_a_retry_that_succeeds_heals() -> None:
    """RETRY -> HEALTHY when the retried summary lands."""
    session = Session()
    session.add(1, 2, 3)
    session.fail(session.request())
    session.now += 2
    events = session.succeed(session.request(), "s")
    assert [type(e) for e in events] == [SummaryProduced, HealthChanged]
    assert transitions(events) == [(RETRY, HEALTHY, 0)]


def test_degraded_probes_every_degraded_retry_seconds() -> None:
    """A DEGRADED session probes every 30s by default; a failed probe is recorded and re-arms it."""
    session = degraded()
    degraded_at = session.now
    session.now = degraded_at + 29.9
    assert session.due() is None
    session.now = degraded_at + 30
    probe = session.request()
    assert (probe.health, probe.attempt) == (DEGRADED, 1)
    assert transitions(session.fail(probe)) == [(DEGRADED, DEGRADED, 2)]
    assert next_due_at(session.state) == session.now + 30


def test_a_successful_probe_recovers_then_heals_when_the_backlog_is_summarized() -> None:
    """DEGRADED -> RECOVERING -> HEALTHY, when the probe's summary covers the whole backlog."""
    session = degraded()
    session.now += 30
    events = session.succeed(session.request(), "rebuilt")
    assert transitions(events) == [(DEGRADED, RECOVERING, 0), (RECOVERING, HEALTHY, 0)]
    assert session.pending() == []


def test_recovering_stays_until_the_backlog_is_drained() -> None:
    """Turns that arrived during the probe keep the session RECOVERING, due at once."""
    session = degraded()
    session.now += 30
    probe = session.request()
    session.add(4)
    events = session.succeed(probe, "partial")
    assert transitions(events) == [(DEGRADED, RECOVERING, 0)]
    assert session.pending() == [2]
    follow_up = session.request()
    assert follow_up.health is RECOVERING
    assert transitions(session.succeed(follow_up, "full")) == [(RECOVERING, HEALTHY, 0)]


def test_a_failure_while_recovering_degrades_again() -> None:
    """RECOVERING -> DEGRADED on a failure."""
    session = degraded()
    session.now += 30
    probe = session.request()
    session.add(4)
    session.succeed(probe, "partial")
    assert transitions(session.fail(session.request())) == [(RECOVERING, DEGRADED, 1)]


def test_the_degraded_backlog_is_bounded() -> None:
    """In DEGRADED the unsummarized backlog keeps at most recovery_backlog_limit turns, oldest dropped."""
    session = degraded(recovery_backlog_limit=2)
    session.add(4, 5, 6)
    trims = [e for e in session.log if isinstance(e, BacklogTrimmed)]
    assert [e.dropped_through for e in trims] == [1, 2]
    assert session.pending() == [3, 4]
    assert session.recent() == [5, 6]
    assert [r.index for r in session.state.turns] == [1, 2, 3, 4, 5, 6]  # still in the log-derived state


def test_entering_degraded_trims_an_oversized_backlog() -> None:
    """The transition into DEGRADED trims the backlog in the same decision."""
    session = Session(rolling(retry_attempts=0, recovery_backlog_limit=1))
    session.add(1, 2, 3, 4, 5)
    in_flight = session.request()
    events = session.fail(in_flight)
    assert [type(e) for e in events] == [HealthChanged, BacklogTrimmed]
    assert session.pending() == [3]


def test_a_slow_summarizer_never_drops_a_turn_outside_degraded() -> None:
    """HEALTHY and RETRY keep every pending turn, however many arrive."""
    session = Session(rolling(recovery_backlog_limit=1))
    session.add(1, 2, 3)
    session.fail(session.request())
    session.add(*range(4, 30))
    assert session.health == (RETRY, 1)
    assert session.pending() == list(range(1, 28))
    assert not any(isinstance(e, BacklogTrimmed) for e in session.log)


def test_a_probe_summarizes_the_whole_bounded_backlog() -> None:
    """On recovery the entire (bounded) backlog is batch-summarized."""
    session = degraded(recovery_backlog_limit=3)
    session.add(4, 5, 6, 7)
    session.now += 30
    probe = session.request()
    assert (probe.covers_from, probe.covers_through) == (3, 5)


# Budgets ----------------------------------------------------------------------------


def error_policy(total: int, strategy: str = "rolling_summary", zone: int = 2) -> ShortTermMemoryConfig:
    return ShortTermMemoryConfig(
        strategy=strategy,  # type: ignore[arg-type]
        budget=MemoryBudget(
            full_zone_turns=zone,
            summary_max_tokens=min(20, total),
            total_max_tokens=total,
            overflow_policy="error",
        ),
    )


def test_the_error_policy_refuses_a_turn_over_budget_and_stores_nothing() -> None:
    """MemoryBudgetExceeded is raised by decide, so no event exists to store."""
    session = Session(error_policy(60))
    session.add(1, 2, 3)
    before = session.state
    with pytest.raises(MemoryBudgetExceeded) as info:
        session.add("a much longer question that does not fit " * 3)
    assert info.value.budget == 60
    assert info.value.tokens > 60
    assert session.state is before
    assert full_tokens(session.state) <= 60


def test_the_error_policy_refuses_even_the_first_turn() -> None:
    """A session whose first turn is over budget is not even opened."""
    session = Session(error_policy(5))
    with pytest.raises(MemoryBudgetExceeded):
        session.add(1)
    assert session.log == []


def test_the_error_policy_counts_only_what_truncation_shows() -> None:
    """Under truncation only the full zone counts towards the budget."""
    session = Session(error_policy(40, strategy="truncation", zone=1))
    session.add(*range(10))
    assert len(session.state.turns) == 10


def test_the_error_policy_does_not_apply_to_strategy_none() -> None:
    """strategy none shows nothing, so nothing can exceed the budget."""
    session = Session(error_policy(5, strategy="none"))
    session.add(1, 2, 3)
    assert len(session.state.turns) == 3


def test_the_error_policy_refuses_a_summary_that_would_exceed_the_budget() -> None:
    """A summary longer than what it replaces, over the total budget, is a failure, not stored."""
    session = Session(error_policy(50))
    session.add(1, 2, 3)
    assert full_tokens(session.state) == 47
    request = session.request()
    events = session.succeed(request, "x" * 76)  # 20 tokens: within summary_max_tokens, not the total
    assert [type(e) for e in events] == [HealthChanged]
    assert "total_max_tokens=50" in events[0].reason  # type: ignore[union-attr]
    assert session.state.summary == ""
    assert full_tokens(session.state) <= 50


def test_the_error_policy_refuses_a_restore_over_budget() -> None:
    """Restoring an export too big for the budget raises before anything is stored."""
    session = Session(error_policy(40))
    session.add(1)
    before = session.state
    with pytest.raises(MemoryBudgetExceeded):
        session.do(Restore(summary="", turns=tuple(turn(n) for n in range(10))))
    assert session.state is before


# Clear and restore ------------------------------------------------------------------


def test_clear_of_a_healthy_session_is_one_event() -> None:
    """Clear emits SessionCleared up to the last turn number."""
    session = Session()
    session.add(1, 2, 3)
    (cleared,) = session.do(Clear(reason="user asked"))
    assert isinstance(cleared, SessionCleared)
    assert (cleared.cleared_through, cleared.reason) == (3, "user asked")
    assert session.state.turns == ()
    assert session.due() is None


def test_clear_heals_an_unhealthy_session_first() -> None:
    """A cleared session has nothing to summarize, so it returns to HEALTHY before the clear."""
    session = degraded()
    events = session.do(Clear())
    assert [type(e) for e in events] == [HealthChanged, SessionCleared]
    assert transitions(events) == [(DEGRADED, HEALTHY, 0)]
    assert session.health == (HEALTHY, 0)


def test_turns_after_a_clear_continue_the_numbering() -> None:
    """A clear never reuses a turn number."""
    session = Session()
    session.add(1, 2)
    session.do(Clear())
    added = session.add(3)
    assert isinstance(added[0], TurnAdded)
    assert added[0].index == 3


def test_restore_replaces_the_content_and_starts_healthy() -> None:
    """Restore emits a heal if needed, then SessionRestored numbering turns after the last one."""
    session = degraded()
    events = session.do(Restore(summary="imported", turns=(turn("a"), turn("b"), turn("c"))))
    assert [type(e) for e in events] == [HealthChanged, SessionRestored]
    restored = events[1]
    assert isinstance(restored, SessionRestored)
    assert restored.first_index == 4
    assert session.state.summary == "imported"
    assert session.pending() == [4]
    assert session.recent() == [5, 6]
    request = session.request()
    assert (request.previous_summary, request.covers_from, request.health) == ("imported", 4, HEALTHY)


@pytest.mark.parametrize(("summary", "problem"), [("a\x00b", "NUL"), ("a\udfffb", "surrogate")])
def test_restore_refuses_a_summary_that_cannot_be_stored(summary: str, problem: str) -> None:
    """A restored summary with NUL or a lone surrogate raises InvalidInput naming the summary."""
    session = Session()
    with pytest.raises(InvalidInput, match=problem) as info:
        session.do(Restore(summary=summary, turns=()))
    assert info.value.field == "summary"


def test_every_prefix_of_a_decision_is_a_valid_history() -> None:
    """The runtime may store a decision's events one by one; each prefix folds."""
    session = Session(rolling(retry_attempts=0, recovery_backlog_limit=1))
    session.add(1, 2, 3, 4, 5)
    before = session.state
    events = decide(before, SummaryFailed(request=session.request(), reason="x"), now=2000.0, command_id="c")
    assert len(events) == 2
    state = before
    for event in events:
        state = evolve(state, event)
        assert state.version == event.seq


def test_a_reason_that_cannot_be_encoded_is_stored_safely() -> None:
    """A failure or clear reason with a lone surrogate (from an exception message) still encodes."""
    session = Session()
    session.add(1, 2, 3)
    (changed,) = session.fail(session.request(), "bad byte \udcff in reply")
    assert isinstance(changed, HealthChanged)
    assert "bad byte" in changed.reason
    assert decode_event(encode_event(changed)) == changed
    cleared = session.do(Clear(reason="\ud800"))
    for event in cleared:
        assert decode_event(encode_event(event)) == event


# Agent items --------------------------------------------------------------------------


def test_adding_no_items_is_refused() -> None:
    """AddItems needs at least one item."""
    with pytest.raises(InvalidInput, match="items"):
        Session().do(AddItems(items=()))


def test_items_join_the_turn_their_user_message_opened() -> None:
    """A user message opens a turn; the items after it join that turn; numbers stay consecutive."""
    session = Session()
    user = MessageItem(kind="message", role="user", content="hi")
    call = MessageItem(kind="function_call", call_id="c1", name="lookup", arguments="{}")
    result = MessageItem(kind="function_call_output", call_id="c1", output="42")
    session.do(AddItems(items=(user, call)))
    session.do(AddItems(items=(result,)))
    (record,) = session.state.turns
    assert record.index == 1
    assert record.turn.items == (user, call, result)
    session.add(2)
    assert [r.index for r in session.state.turns] == [1, 2]


def test_popping_from_an_empty_session_does_nothing() -> None:
    """PopItem on a session without turns emits nothing."""
    session = Session()
    session.do(StartSession(key=session.key, config=session.config))
    assert session.do(PopItem()) == []


def test_popping_the_only_item_of_a_turn_removes_the_turn() -> None:
    """A turn left with no item leaves the context; its number is not reused."""
    session = Session()
    session.do(AddItems(items=(MessageItem(kind="message", role="user", content="hi"),)))
    (popped,) = session.do(PopItem())
    assert isinstance(popped, ItemPopped)
    assert session.state.turns == ()
    session.add(2)
    assert [r.index for r in session.state.turns] == [2]


def test_the_agents_summarizing_strategy_waits_for_context_limit_turns() -> None:
    """Agents summarizing: due at context_limit unsummarized turns, covering all but keep_last_n_turns."""
    agents = AgentsMemoryConfig(strategy="summarizing", context_limit=4, keep_last_n_turns=1, max_turns=8)
    session = Session(rolling(agents=agents))
    session.add(1, 2, 3)
    assert session.due() is None
    session.add(4)
    request = session.request()
    assert (request.covers_from, request.covers_through) == (1, 3)
    session.succeed(request, "three turns")
    session.add(5, 6)
    assert session.due() is None
