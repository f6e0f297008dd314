"""The health machine live, on a manual clock: retries, degraded probes, backlog, recovery, hangs.

Timers fire inside `clock.set()` / `clock.advance()` in the test thread; the
session's reaction is asynchronous, so every step waits on a fact (a state, a
call count) with a deadline, or uses `refresh()` as a barrier: it is handled
after every message sent before it, so a timer that fired too early would
already show as a summary in flight or a new attempt.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from runtime_helpers import (
    Harness,
    PlannedSummarizer,
    events_of,
    key,
    replay_log,
    summarizing_config,
    transitions,
    turn,
    users,
    wait_until,
)

from convmem.actors import MemorySystem, SessionHandle
from convmem.errors import OperationTimeout
from convmem.events import BacklogTrimmed, HealthChanged, MemoryHealth, SummaryProduced

HEALTHY, RETRY, DEGRADED, RECOVERING = (
    MemoryHealth.HEALTHY,
    MemoryHealth.RETRY,
    MemoryHealth.DEGRADED,
    MemoryHealth.RECOVERING,
)


def wait_health(session: SessionHandle, health: MemoryHealth, attempt: int) -> None:
    wait_until(
        lambda: (session.health, session.snapshot_state().attempt) == (health, attempt),
        message=f"session reaches {health.value} attempt {attempt}",
    )


def assert_idle(system: MemorySystem, session: SessionHandle, health: MemoryHealth, attempt: int) -> None:
    """Nothing happened behind our back: no summary in flight, same health and attempt."""
    state = session.refresh(timeout=10)  # a barrier: handled after any Wake sent before it
    activity = system.activity(session.key)
    assert activity is not None
    assert not activity.summarizing
    assert (state.health, state.attempt) == (health, attempt)


def start_failing(
    harness: Harness, summarizer: PlannedSummarizer, **config: object
) -> tuple[MemorySystem, SessionHandle, float]:
    """A session whose first summary request fails: returns it after that failure, and its time."""
    system = harness.system(summarizing_config(**config), summarizer=summarizer)  # type: ignore[arg-type]
    session = system.session(key())
    for i in range(3):  # full zone 2: the third turn makes turn 1 pending
        session.add_turn(turn(f"t{i}"))
    wait_health(session, RETRY if config.get("retry_attempts") != 0 else DEGRADED, 1)
    assert summarizer.call_count == 1
    return system, session, session.snapshot_state().health_since


def test_retries_fire_on_the_clock_at_2_4_8_seconds_without_new_turns(harness: Harness) -> None:
    """RETRY attempts run when the clock reaches 2s, then 4s, then 8s after each failure; no turn needed."""
    summarizer = PlannedSummarizer(default="fail")
    system, session, since = start_failing(harness, summarizer)
    expected_at = [since]
    for attempt, backoff in ((1, 2.0), (2, 4.0), (3, 8.0)):
        harness.clock.set(since + backoff - 0.5)
        assert_idle(system, session, RETRY, attempt)
        assert summarizer.call_count == attempt
        harness.clock.set(since + backoff)
        summarizer.wait_calls(attempt + 1)
        if attempt < 3:
            wait_health(session, RETRY, attempt + 1)
        else:
            wait_health(session, DEGRADED, 1)
        since = since + backoff
        expected_at.append(since)
    changes = events_of(harness.log, key(), HealthChanged)
    assert [(c.old, c.new, c.attempt) for c in changes] == [
        (HEALTHY, RETRY, 1),
        (RETRY, RETRY, 2),
        (RETRY, RETRY, 3),
        (RETRY, DEGRADED, 1),
    ]
    assert [c.at for c in changes] == expected_at
    assert summarizer.call_count == 4
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_degraded_probes_every_degraded_retry_seconds(harness: Harness) -> None:
    """A DEGRADED session probes its summarizer every degraded_retry_seconds, by itself."""
    summarizer = PlannedSummarizer(default="fail")
    system, session, since = start_failing(harness, summarizer, retry_attempts=1, degraded_retry_seconds=30.0)
    harness.clock.set(since + 2.0)
    wait_health(session, DEGRADED, 1)
    since = session.snapshot_state().health_since
    for attempt in (1, 2, 3):
        harness.clock.set(since + 29.5)
        assert_idle(system, session, DEGRADED, attempt)
        harness.clock.set(since + 30.0)
        wait_health(session, DEGRADED, attempt + 1)
        since += 30.0
        assert session.snapshot_state().health_since == since
    assert summarizer.call_count == 5  # the first call, one retry, three probes
    assert transitions(harness.log, key())[-3:] == [(DEGRADED, DEGRADED)] * 3


def test_degraded_backlog_stays_within_recovery_backlog_limit(harness: Harness) -> None:
    """In DEGRADED the unsummarized backlog never exceeds recovery_backlog_limit; trims are logged."""
    summarizer = PlannedSummarizer(default="fail")
    _, session, _ = start_failing(harness, summarizer, retry_attempts=0, recovery_backlog_limit=3)
    for i in range(3, 15):
        session.add_turn(turn(f"t{i}"))
        state = session.snapshot_state()
        assert len(state.pending()) <= 3
        assert len(session.to_dict()["backlog"]) <= 3
    assert [r.turn.user_message for r in session.snapshot_state().pending()] == ["t10", "t11", "t12"]
    trims = events_of(harness.log, key(), BacklogTrimmed)
    assert trims
    assert trims[-1].dropped_through == 10  # turns 1..10 ("t0".."t9") left the backlog
    memory = session.get_llm_context()["conversation_memory"]
    assert [t["user"] for t in memory["recent_turns"]] == ["t13", "t14"]
    assert "summary" not in memory
    assert "pending_turns" not in memory
    assert users(session.snapshot_state()) == [f"t{i}" for i in range(15)]  # nothing leaves the state
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_a_healed_summarizer_brings_degraded_through_recovering_to_healthy(harness: Harness) -> None:
    """DEGRADED -> RECOVERING -> HEALTHY once a probe succeeds; the context shows the summary again."""
    summarizer = PlannedSummarizer(default="fail")
    seen: list[tuple[MemoryHealth, MemoryHealth]] = []
    lock = threading.Lock()

    def on_health(old: MemoryHealth, new: MemoryHealth) -> None:
        with lock:
            seen.append((old, new))

    system = harness.system(
        summarizing_config(retry_attempts=1, recovery_backlog_limit=4),
        summarizer=summarizer,
        on_health_changed=on_health,
    )
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    wait_health(session, RETRY, 1)
    harness.clock.advance(2.0)
    wait_health(session, DEGRADED, 1)
    assert "summary" not in session.get_llm_context()["conversation_memory"]
    for i in range(3, 8):
        session.add_turn(turn(f"t{i}"))
    summarizer.plan(default="ok")
    harness.clock.advance(30.0)
    session.flush(timeout=10)
    wait_health(session, HEALTHY, 0)
    assert transitions(harness.log, key()) == [
        (HEALTHY, RETRY),
        (RETRY, DEGRADED),
        (DEGRADED, RECOVERING),
        (RECOVERING, HEALTHY),
    ]
    memory = session.get_llm_context()["conversation_memory"]
    assert memory["summary"].startswith("covers ")
    assert [t["user"] for t in memory["recent_turns"]] == ["t6", "t7"]
    assert "pending_turns" not in memory
    produced = events_of(harness.log, key(), SummaryProduced)
    assert produced[-1].covers_through == 6
    wait_until(lambda: len(seen) == 4, message="every transition reached on_health_changed")
    assert sorted(seen, key=str) == sorted(transitions(harness.log, key()), key=str)
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_every_health_change_is_an_event_and_the_chain_is_consistent(harness: Harness) -> None:
    """Each transition is one HealthChanged that starts where the previous one ended."""
    summarizer = PlannedSummarizer("fail", "fail", "ok", "fail", "fail", "fail", "ok")
    system = harness.system(summarizing_config(retry_attempts=2), summarizer=summarizer)
    session = system.session(key())

    def step(n_transitions: int) -> None:
        wait_until(lambda: len(transitions(harness.log, key())) == n_transitions)
        barrier(session)

    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    step(1)
    harness.clock.advance(2.0)
    step(2)
    harness.clock.advance(4.0)
    step(3)
    session.add_turn(turn("t3"))
    step(4)
    harness.clock.advance(2.0)
    step(5)
    harness.clock.advance(4.0)
    step(6)
    harness.clock.advance(30.0)
    step(8)
    changes = transitions(harness.log, key())
    assert changes == [
        (HEALTHY, RETRY),
        (RETRY, RETRY),
        (RETRY, HEALTHY),
        (HEALTHY, RETRY),
        (RETRY, RETRY),
        (RETRY, DEGRADED),
        (DEGRADED, RECOVERING),
        (RECOVERING, HEALTHY),
    ]
    assert all(prev[1] is nxt[0] for prev, nxt in itertools.pairwise(changes))
    assert session.health is HEALTHY
    assert summarizer.call_count == 7
    assert session.snapshot_state() == replay_log(harness.log, key())


def barrier(session: SessionHandle) -> None:
    """Return once the session's actor handled every message sent before (timers set, calls made)."""
    session.refresh(timeout=10)


def test_a_hanging_summarizer_times_out_on_the_manual_clock_and_goes_to_retry(harness: Harness) -> None:
    """A call that outlasts summarize_timeout_seconds (clock time) is a failure: RETRY, reason timed out."""
    summarizer = PlannedSummarizer("hang", default="fail")
    system = harness.system(summarizing_config(summarize_timeout_seconds=60.0), summarizer=summarizer)
    session = system.session(key())
    start = harness.clock.now()
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    barrier(session)  # the request and its timeout timer are out
    summarizer.wait_calls(1)
    harness.clock.set(start + 59.5)
    assert_idle_in_flight(system, session)
    harness.clock.set(start + 60.0)
    wait_health(session, RETRY, 1)
    change = events_of(harness.log, key(), HealthChanged)[0]
    assert change.at == start + 60.0
    assert "timed out" in change.reason
    summarizer.release()  # the late answer must be ignored: the request already failed
    harness.clock.set(start + 62.0)
    summarizer.wait_calls(2)
    wait_health(session, RETRY, 2)
    assert not events_of(harness.log, key(), SummaryProduced)
    assert session.snapshot_state() == replay_log(harness.log, key())


def assert_idle_in_flight(system: MemorySystem, session: SessionHandle) -> None:
    state = session.refresh(timeout=10)
    activity = system.activity(session.key)
    assert activity is not None
    assert activity.summarizing
    assert state.health is HEALTHY


def test_add_turn_does_not_wait_for_a_hanging_summarizer(harness: Harness) -> None:
    """While the summarizer hangs, add_turn keeps storing turns and answering."""
    summarizer = PlannedSummarizer(default="hang")
    system = harness.system(summarizing_config(), summarizer=summarizer)
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    summarizer.wait_calls(1)
    for i in range(3, 30):
        assert session.add_turn(turn(f"t{i}"), timeout=10) == i + 1
        assert summarizer.hanging == 1
    assert users(session.snapshot_state()) == [f"t{i}" for i in range(30)]
    memory = session.get_llm_context()["conversation_memory"]
    assert len(memory["pending_turns"]) == 28  # pending turns stay visible while the summary is made
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_flush_times_out_while_the_summarizer_hangs_and_returns_once_it_answers(harness: Harness) -> None:
    """flush(timeout) raises OperationTimeout while a summary is in flight and returns once it landed."""
    summarizer = PlannedSummarizer("hang", default="ok")
    system = harness.system(summarizing_config(), summarizer=summarizer)
    session = system.session(key())
    for i in range(4):
        session.add_turn(turn(f"t{i}"))
    summarizer.wait_calls(1)
    with pytest.raises(OperationTimeout):
        session.flush(timeout=0.05)
    assert not events_of(harness.log, key(), SummaryProduced)
    flushed = threading.Event()
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            session.flush(timeout=10)
        except BaseException as exc:  # reported below, never lost in a thread
            errors.append(exc)
        flushed.set()

    waiter = threading.Thread(target=flush)
    waiter.start()
    summarizer.release()
    assert flushed.wait(10)
    waiter.join()
    assert errors == []
    produced = events_of(harness.log, key(), SummaryProduced)
    assert produced[-1].covers_through == 2  # flush returned only after every pending turn was summarized
    assert "pending_turns" not in session.get_llm_context()["conversation_memory"]
    activity = system.activity(key())
    assert activity is not None
    assert activity.summarizing is False


def test_flush_on_a_retrying_session_waits_for_the_retry(harness: Harness) -> None:
    """flush() in RETRY times out until the retry (driven by the clock) succeeds."""
    summarizer = PlannedSummarizer("fail", default="ok")
    _, session, since = start_failing(harness, summarizer)
    with pytest.raises(OperationTimeout):
        session.flush(timeout=0.05)
    harness.clock.set(since + 2.0)
    session.flush(timeout=10)
    assert session.health is HEALTHY
    assert session.get_llm_context()["conversation_memory"]["summary"] == "covers 1 turns; latest: t0"


@pytest.mark.parametrize(
    "output",
    [{"summary": 42}, {}, "", {"summary": "  \n "}, None, {"text": "wrong key"}, "huge"],
    ids=["int", "empty-dict", "empty-str", "blank", "none", "wrong-key", "huge"],
)
def test_garbage_summarizer_output_is_a_failure(harness: Harness, output: object) -> None:
    """Malformed, empty or over-budget summaries are failures: RETRY, nothing stored, then recovery."""
    if output == "huge":
        summarizer = PlannedSummarizer("huge", default="ok")
    else:
        summarizer = PlannedSummarizer("garbage", default="ok", garbage=[output])
    _, session, since = start_failing(harness, summarizer)
    assert not events_of(harness.log, key(), SummaryProduced)
    assert "summary" not in session.get_llm_context()["conversation_memory"]
    harness.clock.set(since + 2.0)
    session.flush(timeout=10)
    assert session.health is HEALTHY
    assert [e.summary for e in events_of(harness.log, key(), SummaryProduced)] == [
        "covers 1 turns; latest: t0"
    ]
    assert session.snapshot_state() == replay_log(harness.log, key())
    assert transitions(harness.log, key()) == [(HEALTHY, RETRY), (RETRY, HEALTHY)]


def test_a_summary_over_summary_max_tokens_names_the_limit(harness: Harness) -> None:
    """The failure reason of a huge summary says which limit it broke."""
    summarizer = PlannedSummarizer("huge", default="fail")
    start_failing(harness, summarizer)
    assert "summary_max_tokens=200" in events_of(harness.log, key(), HealthChanged)[0].reason


def test_a_hanging_probe_in_degraded_times_out_and_stays_degraded(harness: Harness) -> None:
    """A DEGRADED probe that hangs past the timeout counts as one more failed probe."""
    summarizer = PlannedSummarizer("fail", "hang", default="fail")
    system = harness.system(
        summarizing_config(retry_attempts=0, summarize_timeout_seconds=10.0), summarizer=summarizer
    )
    session = system.session(key())
    for i in range(3):
        session.add_turn(turn(f"t{i}"))
    wait_health(session, DEGRADED, 1)
    since = session.snapshot_state().health_since
    harness.clock.set(since + 30.0)
    barrier(session)
    summarizer.wait_calls(2)
    harness.clock.set(since + 40.0)
    wait_health(session, DEGRADED, 2)
    assert "timed out" in events_of(harness.log, key(), HealthChanged)[-1].reason
    assert session.add_turn(turn("still writable"), timeout=10) == 4


def test_a_full_summarizer_queue_is_a_stored_failure_and_the_write_is_answered(harness: Harness) -> None:
    """A summary that falls due at a write's end is asked for there; when the pool's queue is full
    the write is still answered, and the refusal is stored as a failure of its own (RETRY), from
    the session's own thread, with the turns kept pending."""
    summarizer = PlannedSummarizer(default="hang")
    system = harness.system(
        summarizing_config(), summarizer=summarizer, summarizer_workers=1, summarizer_queue=1
    )
    first, second = system.session(key("first")), system.session(key("second"))
    for i in range(3):
        assert first.add_turn(turn(f"a{i}"), timeout=10) == i + 1
    summarizer.wait_calls(1)  # the one worker hangs on first's summary; the queue holds it
    for i in range(3):
        assert second.add_turn(turn(f"b{i}"), timeout=10) == i + 1  # answered despite the refusal
    wait_health(second, RETRY, 1)
    assert summarizer.call_count == 1  # second's summary was never called: refused at the queue
    failed = [e for e in events_of(harness.log, key("second"), HealthChanged) if e.new is RETRY]
    assert [e.reason for e in failed] == ["summarizer queue is full"]
    assert len(second.get_llm_context()["conversation_memory"]["pending_turns"]) == 1
    assert second.snapshot_state() == replay_log(harness.log, key("second"))
