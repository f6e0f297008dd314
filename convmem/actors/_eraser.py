"""Carrying out an erasure: an ordered list of steps, the first of which records it.

`ERASURE_STEPS` is the whole procedure, in order. Each step is idempotent and
reads what it needs from the `ErasureRequest` alone, so any process may run
the steps again from the second on (`Eraser.finish`) after a crash at any
point, and two processes may run them at once:

1. ``record``: the request is written to the `ErasureJournal` (durably);
   nothing is deleted before it.
2. ``shred_key``: a user's erasure deletes the user's data keys when the log
   encrypts per user (`KeyShredder`): from then on no copy anywhere (replicas,
   backups, old snapshots) can be read. A session's erasure keeps the key. A
   key store that cannot tell every key of the user is gone (a stored key
   that does not read) raises `EncryptionKeyError`: the erasure stops there,
   pending, and is not reported done.
3. ``drop_live``: this process's live actors and idle cache of the sessions
   stop, so none keeps (or snapshots) what is being erased.
4. ``events``: each session's events are erased from the log.
5. ``snapshots``: each session's snapshot and every part of it are erased.
6. ``announce``: every process using the log is told (`ErasureNotice`, ids
   as keyed digests) and drops its live and cached copies; this process too.
7. ``exports``: the export files convmem wrote and recorded
   (`ExportRegistry`) lose the sessions' lines.
8. ``complete``: the journal keeps a receipt without ids in clear (with where
   the log stood after the events step, `ErasureReceipt.log_position`, so a
   kept copy is later weighed against it by position, not by clock), and the
   pending request is erased for good.

The sessions are listed from the log *and* the snapshot store (heads and
parts), so a session whose events are gone but whose snapshot stayed is
still found. `hook(step)` runs after each step: tests stop the process
there (kill -9) to check that a restart, or `convmem erase --resume`,
finishes the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple, Protocol, runtime_checkable

import msgspec

from convmem.actors._erasure import ErasureNotice, ErasureWatch, KeyShredder
from convmem.actors._journal import (
    ErasureJournal,
    ErasureJournalDamaged,
    ErasureRequest,
    log_position,
    readable_pending,
)
from convmem.actors._ports import Clock, EventLog, SnapshotStore
from convmem.errors import ConvmemError, EncryptionKeyError, SessionDamaged
from convmem.events import MemoryKey

__all__ = ["ERASURE_STEPS", "Erased", "Eraser", "ErasureStep", "ExportLookup", "ExportRegistry"]

_log = logging.getLogger("convmem.erasure")

Matches = Callable[[MemoryKey], bool]


class Erased(msgspec.Struct, frozen=True, kw_only=True):
    """What an erasure removed: `events_purged` events from `sessions` sessions.

    The service API's ``erase`` reply and ``convmem erase --json`` use the same two names.
    """

    events_purged: int
    sessions: int


@runtime_checkable
class ExportRegistry(Protocol):
    """The export files convmem wrote, as recorded when it wrote them (a port).

    `erase_copies(request)` removes the lines of the request's sessions from
    every recorded file that still exists, and returns how many files it
    changed. Idempotent.
    """

    def erase_copies(self, request: ErasureRequest) -> int: ...


@runtime_checkable
class ExportLookup(Protocol):
    """An `ExportRegistry` that can tell whether a recorded file holds any session of a request."""

    def holds(self, request: ErasureRequest) -> bool: ...


class ErasureRun:
    """One pass over the steps for one request: what it found and removed so far."""

    def __init__(self, eraser: Eraser, request: ErasureRequest) -> None:
        self.eraser = eraser
        self.request = request
        self.events_purged = 0
        self.log_position: int | None = None
        """Where the log stood once the events step was done (`LogPositions`), for the receipt."""
        self.events_told = False
        """The events step ran in this run: the log told of what it erased (`ErasureWatch`)."""
        self._keys: list[MemoryKey] | None = None

    @property
    def keys(self) -> list[MemoryKey]:
        """The sessions to erase: from the log's events and the snapshot store's keys and parts."""
        if self._keys is None:
            self._keys = self.eraser.sessions_of(self.request)
        return self._keys


class ErasureStep(NamedTuple):
    """One step of an erasure: its name (what the fault hook is told) and what it does."""

    name: str
    run: Callable[[ErasureRun], None]


def _record(run: ErasureRun) -> None:
    run.eraser.journal.record(run.request)


def _shred_key(run: ErasureRun) -> None:
    request, log = run.request, run.eraser.log
    if request.session_id is not None or not isinstance(log, KeyShredder):
        return
    try:
        ids = log.shred_user(request.tenant_id, request.user_id)
    except EncryptionKeyError as exc:
        # The key store cannot tell that every key of the user is gone: the erasure must not
        # carry on as done. It stays pending (recorded), and finishing it runs this step again.
        message = str(exc).removeprefix(f"{exc.source}: ")
        raise EncryptionKeyError(
            f"{message}. The erasure of the user stays pending: it is finished by the next "
            "start or `convmem erase --resume` once the key store is fixed",
            source=exc.source,
        ) from exc
    _log.info("erasure %s: %d data key(s) of the user deleted", request.id, len(ids))


def _drop_live(run: ErasureRun) -> None:
    run.eraser.drop(run.request.covers)


def _events(run: ErasureRun) -> None:
    log, now = run.eraser.log, run.eraser.clock.now()
    left: list[SessionDamaged] = []
    for key in run.keys:
        try:
            run.events_purged += log.erase(key, at=now)
        except SessionDamaged as exc:  # messages it cannot erase stay: the others' are erased still
            left.append(exc)
    if left:  # not done: the erasure stays pending, naming the first
        raise left[0]
    # Every erased event and every fence is at or below this; whatever is stored from now on is above.
    run.log_position = log_position(log)
    run.events_told = True


def _snapshots(run: ErasureRun) -> None:
    snapshots = run.eraser.snapshots
    if snapshots is not None:
        for key in run.keys:
            snapshots.delete(key)


def _announce(run: ErasureRun) -> None:
    request, log = run.request, run.eraser.log
    if isinstance(log, ErasureWatch):
        key = request.key
        # The events step ran in this run: the log told of what it erased (its bytes tallied or not),
        # so this repeat says nothing of bytes (else each erasure would cost each tenant a full count).
        tallied = run.events_told
        notice = (
            ErasureNotice.of_user(request.tenant_id, request.user_id, tallied=tallied)
            if key is None
            else ErasureNotice.of_sessions([key], tallied=tallied)
        )
        log.announce(notice)
    run.eraser.drop(request.covers)  # also when the log tells no one (a racing activation)


def _exports(run: ErasureRun) -> None:
    if run.eraser.exports is not None:
        run.eraser.exports.erase_copies(run.request)


def _complete(run: ErasureRun) -> None:
    position = run.log_position if run.log_position is not None else log_position(run.eraser.log)
    receipt = run.request.receipt(
        completed_at=run.eraser.clock.now(),
        sessions=len(run.keys),
        events_purged=run.events_purged,
        log_position=position,
    )
    run.eraser.journal.complete(receipt)


ERASURE_STEPS: tuple[ErasureStep, ...] = (
    ErasureStep("record", _record),
    ErasureStep("shred_key", _shred_key),
    ErasureStep("drop_live", _drop_live),
    ErasureStep("events", _events),
    ErasureStep("snapshots", _snapshots),
    ErasureStep("announce", _announce),
    ErasureStep("exports", _exports),
    ErasureStep("complete", _complete),
)
"""The steps of every erasure, in order (see the module's doc); ``record`` is always first."""


class Eraser:
    """Runs `ERASURE_STEPS` for new and pending erasures on one log, snapshot store and journal.

    `drop(matches)` drops this process's live and cached sessions that
    `matches` (the memory system's own). `hook(step)` runs after each step.
    """

    def __init__(
        self,
        *,
        journal: ErasureJournal,
        log: EventLog,
        snapshots: SnapshotStore | None,
        clock: Clock,
        drop: Callable[[Matches], object],
        exports: ExportRegistry | None = None,
        hook: Callable[[str], object] | None = None,
        steps: tuple[ErasureStep, ...] = ERASURE_STEPS,
    ) -> None:
        self.journal = journal
        self.log = log
        self.snapshots = snapshots
        self.clock = clock
        self.drop = drop
        self.exports = exports
        self.hook = hook
        self.steps = steps

    def sessions_of(self, request: ErasureRequest) -> list[MemoryKey]:
        """Every session the request erases that has events, a snapshot or a part of one."""
        key = request.key
        if key is not None:
            return [key]
        found = set(self.log.keys(tenant_id=request.tenant_id, user_id=request.user_id))
        if self.snapshots is not None:
            found.update(self.snapshots.keys(tenant_id=request.tenant_id, user_id=request.user_id))
        return sorted(found, key=MemoryKey.composite)

    def erase(self, request: ErasureRequest) -> Erased:
        """Record `request`, then carry it out to the end."""
        return self._run(request, self.steps)

    def finds_nothing(self, request: ErasureRequest) -> bool:
        """Whether `request` would remove nothing the store or this machine holds: no event, no
        snapshot or part of one, no recorded export file holding its sessions, and (a user's, on a
        log that encrypts) no data key to shred, which copies elsewhere (backups) still need gone.

        Live copies in this process are the caller's to look at (a user's are dropped here: with no
        event left, a copy is one that outlived a deletion made outside an erasure). An export
        registry that cannot tell, or a log that may keep a user's keys, finds something.
        """
        log, snapshots, exports = self.log, self.snapshots, self.exports
        key = request.key
        if key is None and isinstance(log, KeyShredder) and getattr(log, "keyring", True) is not None:
            return False
        if key is not None:
            if log.last_seq(key) != 0:
                return False
        elif log.keys(tenant_id=request.tenant_id, user_id=request.user_id):
            return False
        if snapshots is not None and any(
            request.covers(k) for k in snapshots.keys(tenant_id=request.tenant_id, user_id=request.user_id)
        ):
            return False
        if exports is not None:
            try:
                if not isinstance(exports, ExportLookup) or exports.holds(request):
                    return False
            except ConvmemError:
                return False  # a damaged registry: the erasure's own step says so, as it always did
        if key is None:
            self.drop(request.covers)
        return True

    def finish(self, request: ErasureRequest) -> Erased:
        """Carry out a recorded `request` again from the step after ``record`` (idempotent)."""
        return self._run(request, self.steps[1:])

    def finish_pending(self) -> list[Erased]:
        """Finish every pending erasure of the journal, oldest first.

        A journal holding damaged records (`ErasureJournalDamaged`): every
        pending erasure that reads is finished first, then the error is raised.
        One that cannot finish now (its store unreachable, a key file damaged)
        does not hold back the ones after it: each is tried, then the first
        failure is raised (the ones that failed stay pending).
        """
        pending, damaged = readable_pending(self.journal)
        finished: list[Erased] = []
        failed: list[ConvmemError] = []
        for request in pending:
            try:
                finished.append(self.finish(request))
            except ConvmemError as exc:
                _log.warning("pending erasure %s not finished: %s", request.id, exc)
                failed.append(exc)
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=pending)
        if failed:
            raise failed[0]
        return finished

    def _run(self, request: ErasureRequest, steps: tuple[ErasureStep, ...]) -> Erased:
        run = ErasureRun(self, request)
        for step in steps:
            step.run(run)
            if self.hook is not None:
                self.hook(step.name)
        _log.info("erasure %s done: %d session(s), %d event(s)", request.id, len(run.keys), run.events_purged)
        return Erased(events_purged=run.events_purged, sessions=len(run.keys))
