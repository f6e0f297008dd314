"""Helpers for the runtime tests: scripted summarizers, a harness that closes what it opens,
log readers and a deadline wait that polls facts instead of sleeping.

Nothing here sleeps. Waits poll a predicate with `threading.Event.wait` in short
steps and fail with a message when the deadline passes; the deadline is a
safety net for a broken runtime, never a timing assertion.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from convmem.actors import ManualClock, MemorySystem, load_state
from convmem.adapters import InMemoryErasureJournal, InMemoryEventLog, InMemorySnapshotStore
from convmem.events import (
    AnyEvent,
    ConversationTurn,
    Event,
    HealthChanged,
    HealthPolicy,
    MemoryBudget,
    MemoryHealth,
    MemoryKey,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
)
from convmem.projections import SessionState

WAIT = 15.0
"""Seconds any wait may take before the test fails (a broken runtime, not a slow one)."""

E = TypeVar("E")

Outcome = Literal["ok", "fail", "garbage", "huge", "hang"]

GARBAGE: tuple[object, ...] = ({"summary": 42}, {}, "", {"summary": "   "}, None)
"""Summarizer outputs that must count as failures (the "huge" one is built per call)."""


# Turns and keys ----------------------------------------------------------------------


def key(session: str = "s", *, tenant: str = "acme", user: str = "u@example.com") -> MemoryKey:
    """A key with an e-mail user id (dots and @ must not matter)."""
    return MemoryKey(tenant, user, session)


def turn(text: str) -> ConversationTurn:
    """A turn whose user message is `text` (the tests identify turns by it)."""
    return ConversationTurn(user_message=text, assistant_response=f"answer to {text}")


def users(state: SessionState) -> list[str]:
    """The user messages of the live turns, oldest first."""
    return [record.turn.user_message for record in state.turns]


def summarizing_config(
    *,
    full_zone_turns: int = 2,
    retry_attempts: int = 3,
    backoff: tuple[float, ...] = (2.0, 4.0, 8.0),
    degraded_retry_seconds: float = 30.0,
    summarize_timeout_seconds: float = 60.0,
    recovery_backlog_limit: int = 20,
    summary_max_tokens: int = 200,
    total_max_tokens: int = 100_000,
) -> ShortTermMemoryConfig:
    """A rolling-summary configuration that asks for a summary as soon as a turn is pending."""
    return ShortTermMemoryConfig(
        strategy="rolling_summary",
        budget=MemoryBudget(
            full_zone_turns=full_zone_turns,
            summary_max_tokens=summary_max_tokens,
            total_max_tokens=total_max_tokens,
        ),
        retry_attempts=retry_attempts,
        recovery_backlog_limit=recovery_backlog_limit,
        health=HealthPolicy(
            retry_backoff_seconds=backoff,
            degraded_retry_seconds=degraded_retry_seconds,
            summarize_timeout_seconds=summarize_timeout_seconds,
        ),
    )


# Waiting on facts ----------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, message: str = "") -> None:
    """Poll `predicate` until it holds; fail the test when `timeout` passes first.

    What the test waits on is the fact; the pause between checks only paces them. It starts at
    1 ms and doubles up to 25 ms, so a fact that holds at once costs nothing and a long wait does
    not spin a core that the code under test needs (the suite runs on 2 cores).
    """
    deadline, pause, gap = time.monotonic() + timeout, threading.Event(), 0.001
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout:g}s: {message or predicate}")
        pause.wait(gap)  # an event never set: a bounded pause between two checks
        gap = min(gap * 2, 0.025)


def run_threads(n: int, work: Callable[[int], None], timeout: float = WAIT * 4) -> None:
    """Run `work(i)` on n threads released together; re-raise the first failure in the test thread."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            start.wait(timeout=WAIT)
            work(i)
        except BaseException as exc:  # handed to the test thread below, never lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,), name=f"writer-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a worker thread is stuck"
    if errors:
        raise errors[0]


def assert_each_writer_in_order(stored: Sequence[str], writers: int, per_writer: int) -> None:
    """Every `w{t}-{i}` is stored exactly once, and each writer's turns in the order it sent them."""
    assert sorted(stored) == sorted(f"w{t}-{i}" for t in range(writers) for i in range(per_writer))
    for t in range(writers):
        mine = [int(u.split("-")[1]) for u in stored if u.startswith(f"w{t}-")]
        assert mine == list(range(per_writer)), f"writer {t}'s turns are out of order: {mine}"


# Reading the log back -------------------------------------------------------------------


def replay_log(log: InMemoryEventLog, k: MemoryKey) -> SessionState:
    """The session's state by a full replay of the log (no snapshot)."""
    state, _ = load_state(log, None, k)
    return state


def logged_events(log: InMemoryEventLog, k: MemoryKey) -> list[AnyEvent]:
    """The session's decodable events, in order."""
    out: list[AnyEvent] = []
    for record in log.read(k):
        try:
            out.append(decode_event(record.data))
        except ValueError:
            continue
    return out


def events_of(log: InMemoryEventLog, k: MemoryKey, kind: type[E]) -> list[E]:
    """The session's stored events of one type."""
    return [e for e in logged_events(log, k) if isinstance(e, kind)]


def transitions(log: InMemoryEventLog, k: MemoryKey) -> list[tuple[MemoryHealth, MemoryHealth]]:
    """Every health transition the log recorded, oldest first."""
    return [(e.old, e.new) for e in events_of(log, k, HealthChanged)]


def stored_users(log: InMemoryEventLog, k: MemoryKey) -> list[str]:
    """User messages of every TurnAdded in the log (cleared ones included)."""
    return [e.turn.user_message for e in events_of(log, k, TurnAdded)]


# Summarizers -------------------------------------------------------------------------------


def deterministic_summary(request: Mapping[str, Any]) -> str:
    """A short summary that depends only on the request (and stays short)."""
    turns: Sequence[Mapping[str, Any]] = request["turns"]
    previous = str(request["previous_summary"])
    count = int(previous.split()[1]) if previous.startswith("covers ") else 0
    return f"covers {count + len(turns)} turns; latest: {turns[-1]['user'][:40]}"


class EchoSummarizer:
    """Succeeds every time with `deterministic_summary`; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        with self._lock:
            self.calls += 1
        return {"summary": deterministic_summary(request)}

    def release(self) -> None:
        """Nothing to release (the harness calls it on every summarizer)."""


class PlannedSummarizer:
    """A summarizer driven by a queue of planned outcomes; `default` when the queue is empty.

    * ``ok``: a deterministic summary;
    * ``fail``: raises;
    * ``garbage``: the next of `GARBAGE` (malformed or empty output);
    * ``huge``: a summary far over any `summary_max_tokens` used in the tests;
    * ``hang``: blocks until `release()` (the harness releases at teardown), then answers
      like ``ok`` (a late answer the session must ignore once it timed out).

    It records every call and lets a test wait until the summarizer was entered
    `n` times or is blocked in `n` hanging calls.
    """

    def __init__(
        self, *outcomes: Outcome, default: Outcome = "ok", garbage: Sequence[object] = GARBAGE
    ) -> None:
        self.default: Outcome = default
        self._garbage_outputs = tuple(garbage)
        self._plan: collections.deque[Outcome] = collections.deque(outcomes)
        self._cond = threading.Condition()
        self._released = threading.Event()
        self._garbage = 0
        self.calls: list[Outcome] = []
        self.hanging = 0

    def plan(self, *outcomes: Outcome, default: Outcome | None = None) -> None:
        """Queue more outcomes (and optionally change the default)."""
        with self._cond:
            self._plan.extend(outcomes)
            if default is not None:
                self.default = default

    def __call__(self, request: Mapping[str, Any], /) -> object:
        with self._cond:
            outcome = self._plan.popleft() if self._plan else self.default
            self.calls.append(outcome)
            if outcome == "hang":
                self.hanging += 1
            garbage = self._garbage_outputs[self._garbage % len(self._garbage_outputs)]
            if outcome == "garbage":
                self._garbage += 1
            self._cond.notify_all()
        match outcome:
            case "ok":
                return {"summary": deterministic_summary(request)}
            case "fail":
                raise RuntimeError("planned summarizer failure")
            case "garbage":
                return garbage
            case "huge":
                return {"summary": "word " * 20_000}
            case "hang":
                self._released.wait(WAIT * 4)
                with self._cond:
                    self.hanging -= 1
                return {"summary": deterministic_summary(request)}

    def wait_calls(self, n: int, timeout: float = WAIT) -> None:
        """Wait until the summarizer was entered at least `n` times."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls) >= n, timeout):
                raise AssertionError(f"summarizer entered {len(self.calls)} times, expected {n}")

    @property
    def call_count(self) -> int:
        with self._cond:
            return len(self.calls)

    def release(self) -> None:
        """Let every hanging call return (and every later one return at once)."""
        self._released.set()


class GatedLog(InMemoryEventLog):
    """An in-memory log whose next append, once armed, waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self._armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def arm(self) -> None:
        """Hold the next append (of any key) until `gate` is set."""
        self._armed = True

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        if self._armed:
            self._armed = False
            self.entered.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        return super().append(key, events, expected_seq=expected_seq)


# A harness that closes everything it opened ------------------------------------------------


class Harness:
    """One log, one snapshot store, one manual clock, and the systems built on them.

    `close()` closes every system (in reverse order) and releases every
    summarizer, also when the test failed: use it through a fixture.
    """

    def __init__(self) -> None:
        self.log = InMemoryEventLog()
        self.snapshots = InMemorySnapshotStore()
        self.journal = InMemoryErasureJournal()
        self.clock = ManualClock()
        self._systems: list[MemorySystem] = []
        self._releasable: list[Any] = []

    def system(
        self,
        config: ShortTermMemoryConfig | None = None,
        *,
        summarizer: Any = None,
        log: InMemoryEventLog | None = None,
        **kwargs: Any,
    ) -> MemorySystem:
        """A `MemorySystem` on the harness's log, snapshots and clock (unless overridden)."""
        kwargs.setdefault("snapshots", self.snapshots)
        kwargs.setdefault("journal", self.journal)
        kwargs.setdefault("clock", self.clock)
        kwargs.setdefault("timeout", WAIT)
        if summarizer is not None and hasattr(summarizer, "release"):
            self._releasable.append(summarizer)
        system = MemorySystem(
            config, log=log if log is not None else self.log, summarizer=summarizer, **kwargs
        )
        self._systems.append(system)
        return system

    def close(self) -> None:
        """Close every system, then release the summarizers' hanging calls; re-raise the first failure."""
        errors: list[Exception] = []
        for system in reversed(self._systems):
            try:
                system.close()
            except Exception as exc:  # close the others first, then report it
                errors.append(exc)
        for summarizer in self._releasable:
            summarizer.release()
        if errors:
            raise errors[0]


def live_state(system: MemorySystem, k: MemoryKey) -> SessionState:
    """The session's acknowledged state as its actor holds it (activating it when needed).

    Handles show an unstarted session with the configuration it will start
    with; the acknowledged state is what must equal the replay.
    """
    return system.session(k).snapshot_state()


def settle(system: MemorySystem, log: InMemoryEventLog, k: MemoryKey, timeout: float = WAIT) -> SessionState:
    """Wait until the live state of `k` equals the replay of its log; on failure show the difference."""
    try:
        wait_until(lambda: live_state(system, k) == replay_log(log, k), timeout)
    except AssertionError:
        live, replayed = live_state(system, k), replay_log(log, k)
        if live != replayed:
            raise AssertionError(
                f"live state of {k} did not settle to its replay:\n live:   {live!r}\n replay: {replayed!r}"
            ) from None
    return replay_log(log, k)
