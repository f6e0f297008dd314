"""The summarizer pool: N pykka worker actors, each making its calls on its own thread.

A session submits a `SummaryRequest` with a reply callback (and its own
summarizer, when it has one: see `SessionServices`) and goes on; it never
waits for a summarizer. `submit` hands the job to the serving worker actor
that holds the fewest jobs, so no job queues behind a busy or hanging worker
while another is idle. The queue is bounded: `queue_limit` counts every job
submitted and not yet answered, queued or running.

Tenants (a job's `SummaryRequest.key.tenant_id`) share the pool fairly. A
worker's next call is the oldest queued job of the tenant it served least
recently, not its oldest job: a tenant with many sessions asking for
summaries takes turns with the others instead of queueing them behind all of
its own. And when the queue is full, a job of a tenant holding fewer jobs
than the one holding the most takes the place of that tenant's newest queued
job, which is answered at once with ``summarizer queue is full`` (its session
retries as for any refusal): one tenant filling the queue cannot refuse
another's summaries.

A worker calls the summarizer on its own thread and answers the job there:
a summary costs two thread wake-ups (the worker takes the job, the session
takes the answer), where a worker that handed each call to a call thread of
its own and waited for it cost four (under load a session asks for about one
summary per turn). No thread is made per call. One watchdog thread per pool
times calls out: it sleeps until the oldest running call's limit (a later
call's limit is never earlier, so a call that starts wakes nobody). A call
that outlives `call_timeout` is answered with a timeout error, and its worker
is abandoned to the hanging summarizer: it serves no more, hands the jobs
still in its inbox to a fresh worker actor that takes its place, and stops
once the call returns. A hanging call costs one abandoned thread until it
returns, never a worker. Worker threads, serving or abandoned, number at most
`workers + max_abandoned`: where a fresh worker would pass that, none starts,
and a job with no serving worker left is answered at once with an error
saying so (the session's health goes RETRY, then DEGRADED, with that reason),
until an abandoned call returns and its worker's place is taken again. A
summarizer that never returns thus costs at most that many threads, whatever
the time.

A coroutine summarizer is awaited on an event loop (`SummaryLoops`: the
system's caller's loop while it runs, else the pool's own); past
`call_timeout` its task is cancelled there, which frees the worker, so it
abandons no thread at all unless its synchronous part hangs.

Whatever the summarizer returns or raises (a `BaseException` included)
becomes a `SummaryOutcome`, and so does a reply callback's failure (logged);
nothing escapes into an actor, where a `BaseException` would stop every actor
of the process. `close()` answers every queued and running job at once,
waits for no hanging call, and stops the workers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from convmem.actors._bounds import (
    MAX_ACTOR_THREADS,
    MAX_QUEUED,
    MAX_TIMEOUT_SECONDS,
    check_count,
    check_seconds,
)
from convmem.actors._calls import SummaryLoops, SummaryOutcome, extract, failure
from convmem.actors._ports import Summarizer
from convmem.errors import InternalError, InvalidConfig, InvalidInput
from convmem.projections import SummaryRequest

__all__ = ["SummarizerPool", "SummaryOutcome"]

_log = logging.getLogger("convmem.summarizer")


Reply = Callable[[SummaryOutcome], object]

QUEUE_FULL = "summarizer queue is full"
"""The error of a job pushed out of a full queue by another tenant's (the text a refusal is stored with)."""


class _Slot:
    """The pool's side of one worker's place: the worker serving it now, the jobs it holds.

    Every field changes only under the pool's lock.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: dict[_Job, None] = {}
        """Jobs told to the slot's workers and not answered yet, oldest first."""
        self.worker: _Worker | None = None
        """The worker serving the slot: None while every thread the pool may have is taken."""
        self.ref: pykka.ActorRef[_Worker] | None = None
        """The serving worker's ref (kept once it stopped from outside: a job told to it is refused)."""
        self.generation = itertools.count(1)
        self.waiting: dict[str, dict[_Job, None]] = {}
        """The jobs of `jobs` no worker took yet, by tenant, oldest first (tenants with none left out)."""
        self.held: dict[str, int] = {}
        """How many of `jobs` each tenant holds (tenants with none left out)."""
        self.served: dict[str, int] = {}
        """When (the pool's turn count) the slot last took a job of each tenant holding jobs in it."""


class _Job:
    """A submitted request, answered once: by its worker, the watchdog or `close()`."""

    __slots__ = ("order", "reply", "request", "settled", "slot", "started", "summarizer", "tenant")

    _orders = itertools.count()

    def __init__(self, request: SummaryRequest, reply: Reply, slot: _Slot, summarizer: Summarizer) -> None:
        self.order = next(self._orders)
        """When it was submitted, across the pool's slots (made under the pool's lock)."""
        self.request = request
        self.reply = reply
        self.slot = slot
        self.summarizer = summarizer
        """Who answers it: the session's own summarizer, or the pool's."""
        self.tenant = request.key.tenant_id
        self.started = False
        """Whether its worker started its call."""
        self.settled = False


def _deliver(job: _Job, outcome: SummaryOutcome) -> None:
    try:
        job.reply(outcome)
    except BaseException:  # a reply must not take a worker down either
        _log.exception("delivering a summary to %s failed", job.request.key)


class _Worker(pykka.ThreadingActor):
    """A summarizer worker: makes its jobs' calls in turn on its own thread and answers each.

    The call it is making (`job`, `deadline`, the coroutine it `awaiting`) is
    read and written under the pool's lock; `abandoned` once the watchdog or
    `close()` gave up on that call (the worker then stops when it returns).
    """

    use_daemon_thread = True

    def __init__(self, pool: SummarizerPool, slot: _Slot, name: str) -> None:
        super().__init__()
        self._pool = pool
        self.slot = slot
        self.name = name
        self.thread: threading.Thread | None = None
        self.job: _Job | None = None
        self.deadline = 0.0
        self.cancelled = False
        """The coroutine of the call was cancelled at its limit (the call then gets that error)."""
        self.awaiting: concurrent.futures.Future[Any] | None = None
        self.abandoned = False
        slot.worker = self  # made by `SummarizerPool._staff`, under the pool's lock

    def on_start(self) -> None:
        thread = threading.current_thread()
        thread.name = self.name
        self.thread = thread

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, _Job):
            raise InternalError(f"summarizer worker got an unknown message {type(message).__name__}")
        # Each job told to the slot is one message; each message runs one queued job of the slot,
        # the fairest (`SummarizerPool._next`), which need not be the message's own.
        job = self._pool._next(self.slot)
        if job is None:
            return None  # every queued job of the slot ran on an earlier message, or was answered
        try:
            outcome = self._pool._run(self, job)
        except BaseException as exc:  # the job gets the error, the actor lives
            _log.exception("running a summary for %s failed", job.request.key)
            outcome = self._pool._give_up(job, exc)
        if outcome is not None:
            _deliver(job, outcome)
        return None

    def on_stop(self) -> None:
        self._pool._stopped(self)

    def on_failure(self, *exc_info: Any) -> None:
        self._pool._stopped(self)

    def call(self, summarizer: Summarizer, request: SummaryRequest) -> SummaryOutcome:
        """Run the summarizer in an empty context (as on a new thread); every failure becomes an error."""
        try:
            summary = contextvars.Context().run(self._summarize, summarizer, request)
        except BaseException as exc:  # a summarizer must never take a worker down
            return failure(request, exc)
        return SummaryOutcome(request=request, summary=summary)

    def _summarize(self, summarizer: Summarizer, request: SummaryRequest) -> str:
        result = summarizer(request.payload())
        if inspect.isawaitable(result):
            awaiting = self._pool._loops.run(result)
            with self._pool._lock:
                self.awaiting = awaiting
                if self.abandoned:
                    awaiting.cancel()
            result = awaiting.result()
        return extract(result)


class SummarizerPool:
    """N summarizer worker actors sharing a bounded queue of jobs.

    `summarizer` answers every job that does not bring its own (a session's
    own summarizer, see `submit`); with None, every job must bring one.
    """

    def __init__(
        self,
        summarizer: Summarizer | None,
        *,
        workers: int = 4,
        queue_limit: int = 1000,
        call_timeout: float = 60.0,
        max_abandoned: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`max_abandoned` defaults to `workers`; `loop` is where coroutine summarizers run while it runs."""
        check_count("workers", workers, most=MAX_ACTOR_THREADS)  # each a thread, as each abandoned call
        max_abandoned = workers if max_abandoned is None else max_abandoned
        check_count("max_abandoned", max_abandoned, least=0, most=MAX_ACTOR_THREADS)
        check_count("queue_limit", queue_limit, most=MAX_QUEUED)
        if queue_limit < workers:
            raise InvalidConfig("queue_limit", f"({queue_limit}) must be >= workers ({workers})")
        # A system's is twice its configuration's summary time limit (at most a day).
        check_seconds("call_timeout", call_timeout, most=2 * MAX_TIMEOUT_SECONDS)
        self._summarizer = summarizer
        self._queue_limit = queue_limit
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._watch = threading.Condition(self._lock)
        self._queued = 0
        self._held: dict[str, int] = {}
        """Jobs submitted and not answered, by tenant (those holding none are left out)."""
        self._turns = itertools.count()
        self._abandoned = 0
        self._hanging = 0
        self._max_abandoned = max_abandoned
        self._loops = SummaryLoops(loop)
        self._closing = False
        self._slots = [_Slot(f"convmem-summarizer-{n}") for n in range(workers)]
        for n, slot in enumerate(self._slots):
            try:
                self._staff(slot, slot.name)
            except BaseException:
                for started in self._slots[:n]:
                    if started.ref is not None:
                        started.ref.stop(block=False)
                raise
        self._watchdog = threading.Thread(
            target=self._watch_calls, name="convmem-summarizer-watchdog", daemon=True
        )
        self._watchdog.start()

    @property
    def queued(self) -> int:
        """Jobs submitted and not finished."""
        with self._lock:
            return self._queued

    @property
    def abandoned(self) -> int:
        """Summarizer calls that outlived `call_timeout` (or the pool) and were left running, in all."""
        with self._lock:
            return self._abandoned

    @property
    def hanging(self) -> int:
        """Abandoned calls still running now: each holds a thread (serving and abandoned worker threads
        together are at most `workers + max_abandoned`)."""
        with self._lock:
            return self._hanging

    def submit(self, request: SummaryRequest, reply: Reply, *, summarizer: Summarizer | None = None) -> bool:
        """Queue a job for `summarizer` (default: the pool's); False (nothing queued) when the
        queue is full or the pool closed. A job with no summarizer at all is a `ValueError`."""
        chosen = summarizer if summarizer is not None else self._summarizer
        if chosen is None:
            raise InvalidInput(
                "summarizer", "this summarizer pool has no summarizer of its own: pass summarizer="
            )
        pushed: _Job | None = None
        with self._lock:
            if self._closing:
                return False
            if self._queued >= self._queue_limit:
                pushed = self._push_out(request.key.tenant_id)
                if pushed is None:
                    return False
            serving = [slot for slot in self._slots if slot.worker is not None]
            if not serving:  # every worker's call hangs and no fresh one may start: answered at once
                full, pushed = self._full_error(), None
            else:
                slot = min(serving, key=lambda slot: len(slot.jobs))
                job = _Job(request, reply, slot, chosen)
                try:
                    slot.ref.tell(job)  # type: ignore[union-attr]  # a serving slot has a ref
                except pykka.ActorDeadError:  # stopped from outside (pykka's stop_all)
                    return False
                if pushed is not None:
                    self._settle(pushed)
                slot.jobs[job] = None
                slot.waiting.setdefault(job.tenant, {})[job] = None
                slot.held[job.tenant] = slot.held.get(job.tenant, 0) + 1
                self._queued += 1
                self._held[job.tenant] = self._held.get(job.tenant, 0) + 1
                full = ""
        if pushed is not None:
            _deliver(pushed, SummaryOutcome(request=pushed.request, error=QUEUE_FULL))
        if full:
            try:
                reply(SummaryOutcome(request=request, error=full))
            except BaseException:
                _log.exception("delivering a summary to %s failed", request.key)
        return True

    def _push_out(self, tenant: str) -> _Job | None:
        """The queue is full (lock held): the newest queued (not started) job of the tenant holding
        the most jobs, when `tenant` holds fewer than that one; None when `tenant`'s job must wait."""
        heaviest = max(self._held, key=self._held.__getitem__, default=None)
        if heaviest is None or self._held.get(tenant, 0) + 1 >= self._held[heaviest]:
            return None
        newest: _Job | None = None
        for slot in self._slots:
            waiting = slot.waiting.get(heaviest)
            if waiting:
                job = next(reversed(waiting))
                if newest is None or job.order > newest.order:
                    newest = job
        return newest

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, answer every queued and running one, stop the workers."""
        queued: list[_Job] = []
        running: list[_Job] = []
        with self._lock:
            self._closing = True
            self._watch.notify_all()
            for slot in self._slots:
                for job in list(slot.jobs):
                    (running if job.started else queued).append(job)
                    self._settle(job)
                worker = slot.worker
                if worker is not None and worker.job is not None:
                    self._abandon(worker)
            self._abandoned += len(running)
            stopping = [
                (slot.worker.thread, slot.ref.stop(block=False))
                for slot in self._slots
                if slot.worker is not None and slot.ref is not None and not slot.worker.abandoned
            ]
        for job in queued:
            _deliver(job, SummaryOutcome(request=job.request, error="summarizer pool closed"))
        for job in running:
            _deliver(job, SummaryOutcome(request=job.request, error="summarizer pool closed during the call"))
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        for thread, stopped in stopping:
            if thread is me:
                continue  # closed from a reply: this worker stops once the reply returns
            try:
                stopped.get(timeout=max(0.0, deadline - time.monotonic()))
            except pykka.Timeout:
                _log.warning("summarizer worker %s did not stop within %ss", thread and thread.name, timeout)
        if self._watchdog is not me:
            self._watchdog.join(max(0.0, deadline - time.monotonic()))
        self._loops.close()

    # The workers' side (each called on a worker's thread) ------------------------------

    def _run(self, worker: _Worker, job: _Job) -> SummaryOutcome | None:
        """Make `job`'s call on this worker's thread; its outcome, or None if it was answered already
        (by `close()`, or by the watchdog that gave up on the call)."""
        with self._lock:
            if job.settled:
                return None  # answered by close() while it waited in the inbox
            job.started = True
            worker.job, worker.deadline = job, time.monotonic() + self._call_timeout
            worker.cancelled, worker.awaiting = False, None
        outcome = worker.call(job.summarizer, job.request)
        with self._lock:
            worker.job = worker.awaiting = None
            if worker.abandoned:  # given up on: its answer is dropped, and its thread ends here
                self._hanging -= 1
                self._restaff()
                return None
            if job.settled:
                return None
            if worker.cancelled:
                limit = f"{self._call_timeout:g}s limit"
                outcome = SummaryOutcome(
                    request=job.request,
                    error=f"summarizer coroutine did not finish within the {limit}; it was cancelled",
                )
            self._settle(job)
        return outcome

    def _watch_calls(self) -> None:
        """The watchdog: at each running call's limit, cancel its coroutine, else give up on it.

        It sleeps until the earliest limit of the calls running now; a call
        that starts later has a later limit, so starting one wakes nobody.
        """
        answers: list[tuple[_Job, SummaryOutcome]] = []
        with self._lock:
            while not self._closing:
                now = time.monotonic()
                wake = now + self._call_timeout
                for slot in self._slots:
                    worker = slot.worker
                    if worker is not None and worker.job is not None and worker.deadline <= now:
                        answers += self._time_out(worker, now)
                        worker = slot.worker  # a fresh one, when the call was abandoned
                    if worker is not None and worker.job is not None:
                        wake = min(wake, worker.deadline)
                if answers:
                    self._lock.release()
                    try:
                        for job, outcome in answers:
                            _deliver(job, outcome)
                    finally:
                        self._lock.acquire()
                    answers = []
                    continue
                self._watch.wait(max(0.0, wake - time.monotonic()))

    def _time_out(self, worker: _Worker, now: float) -> list[tuple[_Job, SummaryOutcome]]:
        """A call reached its limit (lock held): cancel its coroutine once; else abandon it. The jobs
        to answer off the lock: the call's, with the timeout, and any the cap leaves no thread for."""
        awaiting = worker.awaiting
        if not worker.cancelled and awaiting is not None and awaiting.cancel():
            # A coroutine: cancelled on its loop, the worker answers at once (and serves on).
            worker.cancelled = True
            worker.deadline = now + self._call_timeout
            return []
        job = worker.job
        answers = [
            (refused, SummaryOutcome(request=refused.request, error=self._full_error()))
            for refused in self._abandon(worker)
        ]
        self._abandoned += 1
        if job is not None and not job.settled:
            self._settle(job)
            limit = f"{self._call_timeout:g}s limit"
            answers.insert(
                0, (job, SummaryOutcome(request=job.request, error=f"summarizer timed out after {limit}"))
            )
        return answers

    def _abandon(self, worker: _Worker) -> list[_Job]:
        """Give up on `worker`'s call (lock held): it serves no more, and stops once the call returns;
        the jobs still in its inbox go to a fresh worker in its place, if one may start, else they are
        returned, settled, to be answered with the cap's error (`_full_error`) off the lock."""
        slot = worker.slot
        worker.abandoned = True
        self._hanging += 1
        if worker.awaiting is not None:
            worker.awaiting.cancel()
        moved: list[Any] = []
        inbox = worker.actor_inbox  # only its worker takes from it, and not while in a call, as now
        while not inbox.empty():
            moved.append(inbox.get())
        if slot.ref is not None:
            slot.ref.stop(block=False)  # runs once the call returns
        slot.worker = None
        if not self._closing:
            self._staff(slot, f"{slot.name}-{next(slot.generation)}")
        refused: list[_Job] = []
        for envelope in moved:
            if not isinstance(envelope.message, _Job):  # a stop from outside, say: it stays the old worker's
                worker.actor_inbox.put(envelope)
        # A message runs whichever queued job of the slot is fairest (`_next`), so the fresh worker
        # gets one message for each job of the slot not started yet, whatever the moved ones named.
        for job in [job for waiting in slot.waiting.values() for job in waiting]:
            if slot.worker is not None and slot.ref is not None:
                slot.ref.tell(job)
            else:  # no thread to be had: its turn comes at once, with the error
                self._settle(job)
                refused.append(job)
        return refused

    def _staff(self, slot: _Slot, name: str) -> None:
        """Start a worker for `slot` if the threads allow (lock held, or at construction)."""
        serving = sum(1 for other in self._slots if other.worker is not None)
        if self._hanging + serving >= len(self._slots) + self._max_abandoned:
            return
        slot.ref = _Worker.start(self, slot, name)  # its constructor makes it the slot's worker

    def _restaff(self) -> None:
        """An abandoned call returned (lock held): a slot left without a worker gets one again."""
        if self._closing:
            return
        for slot in self._slots:
            if slot.worker is None:
                self._staff(slot, f"{slot.name}-{next(slot.generation)}")

    def _full_error(self) -> str:
        return (
            f"summarizer: {self._hanging} earlier calls are still running past their "
            f"{self._call_timeout:g}s limit, the most this pool leaves running (workers + max_abandoned="
            f"{self._max_abandoned} threads in all); no new call is started until one returns"
        )

    def _give_up(self, job: _Job, exc: BaseException) -> SummaryOutcome | None:
        """The outcome for a job that could not be run, or None if it was answered already."""
        with self._lock:
            if job.settled:
                return None
            self._settle(job)
        return failure(job.request, exc)

    def _stopped(self, worker: _Worker) -> None:
        """A worker stopped: when it was its slot's serving worker (stopped from outside the pool, not
        abandoned and not closed), answer the jobs the slot still held.

        It holds none after `close()`; only a stop from outside the pool leaves any.
        """
        with self._lock:
            slot = worker.slot
            if worker.abandoned or slot.worker is not worker:
                return
            # It stays the slot's: a job told to it now is refused (`submit` returns False).
            orphans = list(slot.jobs)
            for job in orphans:
                self._settle(job)
        for job in orphans:
            _deliver(job, SummaryOutcome(request=job.request, error="summarizer worker stopped"))

    def _settle(self, job: _Job) -> None:
        """Mark `job` answered (the caller answers it); with the lock held."""
        job.settled = True
        slot = job.slot
        del slot.jobs[job]
        self._queued -= 1
        tenant = job.tenant
        waiting = slot.waiting.get(tenant)
        if waiting is not None and waiting.pop(job, False) is None and not waiting:
            del slot.waiting[tenant]
        _less(self._held, tenant)
        if _less(slot.held, tenant):
            slot.served.pop(tenant, None)  # nothing of it left here: it comes first again when it asks

    def _next(self, slot: _Slot) -> _Job | None:
        """The job a worker of `slot` runs on its next message: the oldest queued (not started, not
        answered) job of the tenant the slot took a job of least recently (a tenant it never did
        first; ties: the tenant waiting in the slot longest). None when the slot has none queued."""
        with self._lock:
            if not slot.waiting:
                return None
            tenant = min(slot.waiting, key=lambda t: slot.served.get(t, -1))
            slot.served[tenant] = next(self._turns)
            waiting = slot.waiting[tenant]
            job = next(iter(waiting))
            del waiting[job]
            if not waiting:
                del slot.waiting[tenant]
            return job


def _less(held: dict[str, int], tenant: str) -> bool:
    """Count one job of `tenant` fewer in `held`; whether it holds none now (then it is left out)."""
    left = held[tenant] - 1
    if left:
        held[tenant] = left
        return False
    del held[tenant]
    return True
