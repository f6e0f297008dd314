"""The retention sweep: apply `RetentionPolicies` to every session of the log.

For each session whose tenant has a policy, `sweep_retention` reads its
events, folds them, and asks `plan_retention` (pure, in `projections`) what
to do at the clock's `now`:

* **erase** an idle session: a `SessionErased` fence is appended after the
  very event the decision was made on (so a turn written meanwhile makes
  the fence conflict, and the session is kept), then the normal erasure
  runs (`MemorySystem.erase`: events, snapshot, live copies); a session a
  planner began again over the fence meanwhile is kept, and only the idle
  history before the fence is dropped (`EventLog.drop_before`);
* **compact** a history over a cap: a `HistoryCompacted` carrying the state
  is appended after that same event (a conflict: skipped until the next
  sweep), the session's live copy here is dropped, a snapshot of the
  compacted state replaces the old one, and the events before the
  compaction are erased from the log (`EventLog.drop_before`);
* **finish** what a cut-short sweep left: the events before a stored
  compaction (or before a fence a session was begun again over), or the
  events under a fence whose erasure did not run. A session is folded from
  its latest stored compaction or fence on, so whatever part of the events
  before it a drop killed half-way left is finished, never refused as a
  history that does not fold.

Every change is conditional on the session's seq, and dropping events
before a stored compaction can be done again: sweeps are idempotent and
safe to run concurrently (two sweepers, or a sweeper and a writer, never
lose a turn; the loser of a race skips the session until the next sweep).
A dry run reads and plans the same way and writes nothing. What a sweep did
is a `RetentionReport`, a pure value of `projections` (`_retention`).

A session with a message that does not decode or does not fit is never
touched: the sweep reports it (``convmem verify`` says more). So is a session
known only by its snapshot (given `snapshots`): one the log lost
(`SessionLost`), or whose snapshot cannot be read. No policy can apply to it
(its events are gone), and its snapshot keeps its turns past every policy
until an operator restores or erases it; an erased session's leftover is no
problem (the erasure deletes it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable

import msgspec

from convmem.actors._audit import _ReadOnlySnapshots
from convmem.actors._journal import JournaledLog
from convmem.actors._load import LoadReport, decode_logged, load_state
from convmem.actors._ports import Clock, EventLog, SnapshotStore, Timer, position_of, snapshot_of
from convmem.errors import ConcurrencyConflict, ConvmemError, ReplayError, SessionLost
from convmem.events import AnyEvent, HistoryCompacted, MemoryKey, RetentionPolicies, SessionErased
from convmem.projections import (
    Compact,
    EraseIdle,
    FinishCompaction,
    RetentionOutcome,
    RetentionProblem,
    RetentionReport,
    SkippedEvent,
    compacted_state,
    compaction,
    history_facts,
    plan_retention,
    replay,
    without_horizon,
)

__all__ = ["RetentionSweeper", "sweep_retention"]

_log = logging.getLogger("convmem.retention")

_NO_ERASER = "not erased: no erasure path given (erase through MemorySystem.sweep_retention, journaled)"


def sweep_retention(
    log: EventLog,
    policies: RetentionPolicies,
    *,
    now: float,
    dry_run: bool,
    snapshots: SnapshotStore | None = None,
    erase: Callable[[MemoryKey], int] | None = None,
    passivate: Callable[[MemoryKey], object] | None = None,
    tenant_id: str | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RetentionReport:
    """Apply `policies` at `now` to every session of the log (of `tenant_id`); see the module docstring.

    `erase(key)` erases a session and returns the events removed (the
    system's journaled erasure: without one, an idle session is reported,
    never erased); `passivate(key)` drops a
    session's live copy in this process. `stop` ends the sweep between two
    sessions. A failure of the log on one session is reported in its
    outcome and the sweep goes on.
    """
    report = RetentionReport(dry_run=dry_run, at=now)
    logged = sorted(log.keys(tenant_id=tenant_id), key=MemoryKey.composite)
    keys = [k for k in logged if not policies.for_tenant(k.tenant_id).empty]
    for n, key in enumerate(keys, start=1):
        if stop is not None and stop.is_set():
            report.stopped = True
            break
        report.sessions += 1
        try:
            outcome = _sweep_one(log, policies, key, now, dry_run, snapshots, erase, passivate, report)
        except ConvmemError as exc:
            _log.warning("retention: %s: %s", key, exc)
            report.problems.append(RetentionProblem(key=key, problem=f"the log failed: {exc}"))
            outcome = None
        if outcome is not None:
            report.outcomes.append(outcome)
        if progress is not None:
            progress(n, len(keys))
    if snapshots is not None and not report.stopped:
        report.problems.extend(_known_by_snapshot_only(log, snapshots, policies, tenant_id, set(logged)))
    return report


def _known_by_snapshot_only(
    log: EventLog,
    snapshots: SnapshotStore,
    policies: RetentionPolicies,
    tenant_id: str | None,
    logged: set[MemoryKey],
) -> list[RetentionProblem]:
    """The sessions (of tenants with a policy) that the log holds no event of while a snapshot of
    them is kept and tells of a session: lost ones, and those whose snapshot cannot be read. Read
    only: nothing is deleted (an erased session's leftover is the erasure's to delete)."""
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    reader = _ReadOnlySnapshots(snapshots)
    problems = []
    for key in snapshots.keys(tenant_id=tenant_id):
        if key in logged or policies.for_tenant(key.tenant_id).empty:
            continue
        try:
            load_state(log, reader, key, journal=journal)
        except SessionLost as exc:
            problem = (
                f"lost: {exc}. No policy applies to it, and its snapshot keeps its turns until it is "
                "restored or erased (convmem erase --key)"
            )
        except ConvmemError as exc:
            problem = (
                f"known only by its snapshot, which cannot be read: {exc}; left as it is: run convmem verify"
            )
        else:
            continue  # nothing of a session left in it (an erasure's leftover, a shredded key)
        problems.append(RetentionProblem(key=key, problem=problem))
    return problems


def _sweep_one(
    log: EventLog,
    policies: RetentionPolicies,
    key: MemoryKey,
    now: float,
    dry_run: bool,
    snapshots: SnapshotStore | None,
    erase: Callable[[MemoryKey], int] | None,
    passivate: Callable[[MemoryKey], object] | None,
    report: RetentionReport,
) -> RetentionOutcome | None:
    records = log.read(key)
    loaded = LoadReport()
    decoded = list(decode_logged(records, on_poison="skip", report=loaded))
    if loaded.poison:
        first = loaded.poison[0]
        report.problems.append(
            RetentionProblem(
                key=key,
                problem=f"{len(loaded.poison)} message(s) that cannot be read (first at position "
                f"{first.position}: {first.problem}); left as it is: run convmem verify",
            )
        )
        return None
    if loaded.damage:  # damaged or missing events: a repair decides what stays, not a sweep
        first = loaded.damage[0]
        report.problems.append(
            RetentionProblem(
                key=key,
                problem=f"damaged: seq {first.seq}: {first.problem}; left as it is: run convmem verify, "
                "then convmem repair",
            )
        )
        return None
    events = [e for e in decoded if not isinstance(e, SkippedEvent)]
    opened = _opened(events, key)
    try:
        state = replay(opened)
    except ReplayError as exc:
        report.problems.append(RetentionProblem(key=key, problem=f"its events do not fold: {exc}"))
        return None
    policy = policies.for_tenant(key.tenant_id)
    # The turns past the live horizon are in the log only: fold it without the horizon to keep
    # those within the caps (a session that retired none has them all in its state).
    whole = replay(without_horizon(opened)) if policy.caps and state.retired_through else None
    action = plan_retention(state, history_facts(events), policy, now, whole=whole)
    match action:
        case None:
            return None
        case EraseIdle():
            outcome = RetentionOutcome(
                key=key, action="erase", reason=action.reason, events_removed=len(events)
            )
            if dry_run:
                return outcome
            if not state.started:  # a fence is stored already: finish that erasure
                if erase is None:
                    return msgspec.structs.replace(outcome, skipped=_NO_ERASER)
                removed = erase(key)
                return msgspec.structs.replace(outcome, done=True, events_removed=removed)
            if erase is None:
                return msgspec.structs.replace(outcome, skipped=_NO_ERASER)
            fence = SessionErased(
                seq=state.version + 1,
                event_id=f"erased/retention/{os.urandom(8).hex()}",
                at=now,
                reason=f"retention: {action.reason}",
            )
            try:
                log.append(key, [fence], expected_seq=state.version)
            except ConcurrencyConflict:
                return msgspec.structs.replace(outcome, skipped="written meanwhile: kept")
            if log.last_seq(key) != fence.seq:  # a session begun again over the fence since: kept
                removed = _drop(log, snapshots, passivate, key, fence.seq)
                skipped = "begun again meanwhile: the new session is kept, the idle history before it dropped"
                return msgspec.structs.replace(outcome, events_removed=removed, skipped=skipped)
            removed = erase(key)
            return msgspec.structs.replace(outcome, done=True, events_removed=removed)
        case Compact():
            event = compaction(
                state,
                action.keep,
                event_id=f"retention/{os.urandom(8).hex()}",
                at=now,
                dropped_events=action.dropped_events,
                dropped_turns=action.dropped_turns,
                reason=action.reason,
                history=action.history,
            )
            outcome = RetentionOutcome(
                key=key,
                action="compact",
                reason=action.reason,
                events_removed=action.dropped_events,
                turns_dropped=action.dropped_turns,
                turns_kept=len(action.history) + len(action.keep),
            )
            if dry_run:
                return outcome
            try:
                log.append(key, [event], expected_seq=state.version)
            except ConcurrencyConflict:
                return msgspec.structs.replace(outcome, skipped="written meanwhile: left for the next sweep")
            removed = _drop(log, snapshots, passivate, key, event.seq, event)
            return msgspec.structs.replace(outcome, done=True, events_removed=removed)
        case FinishCompaction():
            outcome = RetentionOutcome(
                key=key, action="finish", reason=action.reason, events_removed=action.dropped_events
            )
            if dry_run:
                return outcome
            stored = next(
                (e for e in events if isinstance(e, HistoryCompacted) and e.seq == action.seq), None
            )
            removed = _drop(log, snapshots, passivate, key, action.seq, stored)
            return msgspec.structs.replace(outcome, done=True, events_removed=removed)


def _opened(events: list[AnyEvent], key: MemoryKey) -> list[AnyEvent]:
    """The session's events from the latest stored compaction of it or erasure fence on.

    Either one opens the history it reads as (a compaction carries the whole
    state, after a fence the session is empty), so the fold starts there.
    What is stored before it is what a sweep drops (or finishes dropping), and
    is never folded: a drop cut short may have left any part of it (its oldest
    events, or its newest: an older convmem dropped oldest first), which need
    not fold on its own, and the next sweep must still finish the drop.
    """
    for n in range(len(events) - 1, 0, -1):
        event = events[n]
        if isinstance(event, SessionErased) or (isinstance(event, HistoryCompacted) and event.key == key):
            return events[n:]
    return events


def _drop(
    log: EventLog,
    snapshots: SnapshotStore | None,
    passivate: Callable[[MemoryKey], object] | None,
    key: MemoryKey,
    seq: int,
    compacted: HistoryCompacted | None = None,
) -> int:
    """Drop the events before the stored event at `seq` that opens the history (a compaction, or a
    fence): the live copy here first, then the snapshot: a compaction's replaces it, and before a
    fence it goes (it may hold the erased history; one saved since only costs a longer replay).

    An erasure of the session may run between the compaction's append and its snapshot's save (its
    snapshot step then finds nothing to delete): once saved, the snapshot stays only while the log
    still holds the compaction, else it is deleted, as the erasure would have (an erasure that
    erases the compaction after this check deletes the snapshot itself: its snapshot step follows)."""
    if passivate is not None:
        passivate(key)  # no live state here keeps (or snapshots) the dropped turns
    if snapshots is not None:
        if compacted is not None:
            position = position_of(log, key, compacted.seq, compacted.event_id)
            snapshot = snapshot_of(key, compacted_state(compacted), compacted.event_id, position=position)
            snapshots.save(snapshot)
            if not any(r.event_id == compacted.event_id for r in log.read(key)):
                snapshots.delete(key)  # the session was erased meanwhile: the snapshot holds erased turns
        else:
            snapshots.delete(key)
    return log.drop_before(key, seq=seq)


class RetentionSweeper:
    """Sweeps every `policies.sweep_every` seconds of `clock`, on a thread of its own.

    The clock's timer only hands the sweep to the thread (timer callbacks must
    be quick), so a `ManualClock` drives it in tests: advance it past a due
    time and wait for `sweeps` to grow. The first sweep is one interval after
    `start`, the next one interval after a sweep ends (`due`). `sweep` runs
    one now (blocking); `last` is the latest report.
    """

    def __init__(
        self,
        policies: RetentionPolicies,
        clock: Clock,
        run: Callable[[threading.Event], RetentionReport],
    ) -> None:
        self.policies = policies
        self._clock = clock
        self._run = run
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self._timer: Timer | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="convmem-retention")
        self.sweeps = 0
        self.last: RetentionReport | None = None
        self.due: float | None = None
        """When the next sweep is due, by the clock (None before `start` and after `close`)."""

    def start(self) -> None:
        """Schedule the first sweep one interval from now."""
        self._schedule()

    def _schedule(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self.due = self._clock.now() + self.policies.sweep_every
            self._timer = self._clock.call_at(self.due, self._due)

    def _due(self) -> None:
        with contextlib.suppress(RuntimeError):  # shut down meanwhile
            self._thread.submit(self._sweep_and_reschedule)

    def _sweep_and_reschedule(self) -> None:
        try:
            self.sweep()
        except Exception:
            _log.exception("retention sweep failed")
        finally:
            self._schedule()

    def sweep(self) -> RetentionReport:
        """One sweep now, on the caller's thread."""
        report = self._run(self._stop)
        with self._lock:
            self.sweeps += 1
            self.last = report
            self._lock.notify_all()
        if report.outcomes or report.problems:
            _log.info("retention: %s", report.summary())
        return report

    def wait_for(self, sweeps: int, timeout: float) -> RetentionReport | None:
        """Wait until `sweeps` sweeps ended (at most `timeout` seconds); the latest report."""
        with self._lock:
            self._lock.wait_for(lambda: self.sweeps >= sweeps, timeout=timeout)
            return self.last

    def close(self) -> None:
        """No more sweeps; a sweep under way stops after its current session."""
        with self._lock:
            self._stop.set()
            self.due = None
            if self._timer is not None:
                self._timer.cancel()
        self._thread.shutdown(wait=True)
