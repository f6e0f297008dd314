"""A hypothesis state machine driving a whole `MemorySystem` on a manual clock.

Rules add turns to a few sessions, plan the summarizer's next outcomes (ok,
fail, garbage, huge, hang), move the clock, passivate a session, clear one,
and restart the whole system from the same log and snapshot store. After every
step each session's live state must settle to a full replay of its log, the
snapshot store must rebuild the same state, and the live turns must be
exactly the turns acknowledged since the session's last clear.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from runtime_helpers import (
    Harness,
    Outcome,
    PlannedSummarizer,
    key,
    replay_log,
    settle,
    summarizing_config,
    turn,
    users,
)

from convmem.actors import MemorySystem, load_state
from convmem.events import MemoryHealth, MemoryKey
from convmem.projections import SessionState

KEYS = (key("a"), key("b.c"), key("d", user="other@example.com"))
CONFIG = summarizing_config(
    full_zone_turns=2,
    retry_attempts=2,
    backoff=(2.0, 4.0),
    degraded_retry_seconds=30.0,
    summarize_timeout_seconds=5.0,
    recovery_backlog_limit=3,
)
SETTLE = 5.0
"""Seconds a live session may take to settle after a step (it takes milliseconds)."""
OUTCOMES: tuple[Outcome, ...] = ("ok", "fail", "garbage", "huge", "hang")

keys = st.sampled_from(KEYS)


class RuntimeMachine(RuleBasedStateMachine):
    """The runtime against a plain model: acknowledged turns per key since its last clear."""

    def __init__(self) -> None:
        super().__init__()
        self.harness = Harness()
        self.summarizer = PlannedSummarizer(default="ok")
        self.acked: dict[MemoryKey, list[str]] = {k: [] for k in KEYS}
        self.counter = 0
        self.system = self._start()

    def _start(self) -> MemorySystem:
        return self.harness.system(
            CONFIG,
            summarizer=self.summarizer,
            snapshot_every=3,
            max_live_sessions=2,
            idle_seconds=20.0,
            summarizer_workers=2,
        )

    def _text(self, k: MemoryKey) -> str:
        self.counter += 1
        return f"{k.session_id}-{self.counter}"

    @rule(k=keys)
    def add_turn(self, k: MemoryKey) -> None:
        text, number = self._text(k), self._next_number(k)
        assert self.system.session(k).add_turn(turn(text)) == number
        self.acked[k].append(text)

    @rule(k=keys)
    def add_turn_retried(self, k: MemoryKey) -> None:
        text, number = self._text(k), self._next_number(k)
        session = self.system.session(k)
        assert session.add_turn(turn(text), idempotency_key=text) == number
        assert session.add_turn(turn(text), idempotency_key=text) == 0
        self.acked[k].append(text)

    def _next_number(self, k: MemoryKey) -> int:
        return replay_log(self.harness.log, k).next_index

    @rule(outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=3))
    def plan_summarizer(self, outcomes: list[Outcome]) -> None:
        self.summarizer.plan(*outcomes)

    @rule(seconds=st.sampled_from([1.0, 2.0, 4.0, 6.0, 30.0]))
    def advance_clock(self, seconds: float) -> None:
        self.harness.clock.advance(seconds)

    @rule(k=keys)
    def passivate(self, k: MemoryKey) -> None:
        self.system.passivate(k)
        assert not self.system.is_live(k)

    @rule(k=keys)
    def clear(self, k: MemoryKey) -> None:
        self.system.session(k).clear()
        self.acked[k] = []

    @rule()
    def restart(self) -> None:
        self.system.close()
        self.system = self._start()

    @invariant()
    def live_state_is_the_replay_and_holds_every_acknowledged_turn(self) -> None:
        log = self.harness.log
        for k in KEYS:
            # Only live sessions are compared: reading a passivated one would activate it from
            # the log (evicting another), and compare a fresh load with a replay.
            if self.system.is_live(k):
                replayed = settle(self.system, log, k, timeout=SETTLE)
            else:
                replayed = replay_log(log, k)
            assert users(replayed) == self.acked[k]
            from_snapshot, replayed = self._both_loads(k)
            assert from_snapshot == replayed
            if replayed.health is MemoryHealth.DEGRADED:
                assert len(replayed.pending()) <= CONFIG.recovery_backlog_limit

    def _both_loads(self, k: MemoryKey) -> tuple[SessionState, SessionState]:
        """Snapshot + tail and full replay of the same log prefix (a late summary may land meanwhile)."""
        log = self.harness.log
        while True:
            last = log.last_seq(k)
            from_snapshot, _ = load_state(log, self.harness.snapshots, k)
            replayed = replay_log(log, k)
            if log.last_seq(k) == last:
                return from_snapshot, replayed

    def teardown(self) -> None:
        self.harness.close()


RuntimeMachine.TestCase.settings = settings(stateful_step_count=20)
TestRuntimeMachine = RuntimeMachine.TestCase
