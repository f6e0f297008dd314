"""The summarizer pool: N pykka worker actors, each with one long-lived call thread.

A session submits a `SummaryRequest` with a reply callback (and its own
summarizer, when it has one: see `SessionServices`) and goes on; it never
waits for a summarizer. `submit` hands the job to the worker actor that
holds the fewest jobs, so no job queues behind a busy or hanging worker while
another is idle. The queue is bounded: `queue_limit` counts every job
submitted and not yet answered, queued or running.

A worker hands each job to its call thread and waits for the answer at most
`call_timeout`, or until the pool closes. The call thread stays for the next
job: no thread is made per call (under load a session asks for about one
summary per turn, and a thread start costs more than a summarizer that
answers at once). The worker waits on its own thread rather than calling the
summarizer there, so it can time a call out: a call that outlives
`call_timeout` is answered with a timeout error and its thread abandoned to
the hanging summarizer, and the worker starts a fresh call thread for its
next job. A hanging call costs one abandoned thread until it returns, never a
worker. Call threads, serving or abandoned, number at most `workers +
max_abandoned`: a worker that would start one past that starts none and
answers its job at once with an error saying so (the session's health goes
RETRY, then DEGRADED, with that reason), until an abandoned call returns. A
summarizer that never returns thus costs at most that many threads, whatever
the time.

A coroutine summarizer is awaited on an event loop (`SummaryLoops`: the
system's caller's loop while it runs, else the pool's own); past
`call_timeout` its task is cancelled there, which frees the call thread, so
it abandons no thread at all unless its synchronous part hangs.

Whatever the summarizer returns or raises (a `BaseException` included)
becomes a `SummaryOutcome`, and so does a reply callback's failure (logged);
nothing escapes into an actor, where a `BaseException` would stop every actor
of the process. `close()` answers every queued and running job at once,
waits for no hanging call, and stops the workers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from convmem.actors._calls import Caller, SummaryLoops, SummaryOutcome, failure
from convmem.actors._ports import Summarizer
from convmem.errors import InternalError, InvalidConfig, InvalidInput
from convmem.projections import SummaryRequest

__all__ = ["SummarizerPool", "SummaryOutcome"]

_log = logging.getLogger("convmem.summarizer")


Reply = Callable[[SummaryOutcome], object]


class _Slot:
    """The pool's side of one worker: its actor, its call thread, the jobs it holds.

    `jobs`, `caller` and `thread` change only under the pool's lock.
    """

    ref: pykka.ActorRef[_Worker]

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: dict[_Job, None] = {}
        """Jobs told to the worker and not answered yet, oldest first."""
        self.caller: Caller | None = None
        self.calls = itertools.count()
        self.thread: threading.Thread | None = None
        """The worker actor's thread, once it started."""


class _Job:
    """A submitted request, answered once: by its worker or by `close()`."""

    __slots__ = ("reply", "request", "settled", "slot", "started", "summarizer")

    def __init__(self, request: SummaryRequest, reply: Reply, slot: _Slot, summarizer: Summarizer) -> None:
        self.request = request
        self.reply = reply
        self.slot = slot
        self.summarizer = summarizer
        """Who answers it: the session's own summarizer, or the pool's."""
        self.started = False
        """Whether its worker handed it to a call thread."""
        self.settled = False


def _deliver(job: _Job, outcome: SummaryOutcome) -> None:
    try:
        job.reply(outcome)
    except BaseException:  # a reply must not take a worker down either
        _log.exception("delivering a summary to %s failed", job.request.key)


class _Worker(pykka.ThreadingActor):
    """A summarizer worker: runs its jobs in turn on its call thread and answers each."""

    use_daemon_thread = True

    def __init__(self, pool: SummarizerPool, slot: _Slot) -> None:
        super().__init__()
        self._pool = pool
        self._slot = slot

    def on_start(self) -> None:
        self._pool._started(self._slot)

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, _Job):
            raise InternalError(f"summarizer worker got an unknown message {type(message).__name__}")
        try:
            outcome = self._pool._run(message)
        except BaseException as exc:  # no call thread to be had, say: the job gets the error, the actor lives
            _log.exception("running a summary for %s failed", message.request.key)
            outcome = self._pool._give_up(message, exc)
        if outcome is not None:
            _deliver(message, outcome)
        return None

    def on_stop(self) -> None:
        self._pool._stopped(self._slot)

    def on_failure(self, *exc_info: Any) -> None:
        self._pool._stopped(self._slot)


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
        max_abandoned = workers if max_abandoned is None else max_abandoned
        if max_abandoned < 0:
            raise InvalidConfig("max_abandoned", f"must be >= 0, got {max_abandoned}")
        if workers < 1:
            raise InvalidConfig("workers", f"must be >= 1, got {workers}")
        if queue_limit < workers:
            raise InvalidConfig("queue_limit", f"({queue_limit}) must be >= workers ({workers})")
        if not call_timeout > 0:
            raise InvalidConfig("call_timeout", f"must be > 0, got {call_timeout}")
        self._summarizer = summarizer
        self._queue_limit = queue_limit
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._queued = 0
        self._abandoned = 0
        self._hanging = 0
        self._max_abandoned = max_abandoned
        self._loops = SummaryLoops(loop)
        self._closing = False
        self._slots = [_Slot(f"convmem-summarizer-{n}") for n in range(workers)]
        for n, slot in enumerate(self._slots):
            try:
                slot.ref = _Worker.start(self, slot)
            except BaseException:
                for started in self._slots[:n]:
                    started.ref.stop(block=False)
                raise

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
        """Abandoned calls still running now: each holds a thread (serving and abandoned call threads
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
        with self._lock:
            if self._closing or self._queued >= self._queue_limit:
                return False
            slot = min(self._slots, key=lambda slot: len(slot.jobs))
            job = _Job(request, reply, slot, chosen)
            try:
                slot.ref.tell(job)
            except pykka.ActorDeadError:  # stopped from outside (pykka's stop_all)
                return False
            slot.jobs[job] = None
            self._queued += 1
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, answer every queued and running one, stop the workers."""
        queued: list[_Job] = []
        running: list[_Job] = []
        idle: list[threading.Thread] = []
        with self._lock:
            self._closing = True
            for slot in self._slots:
                for job in list(slot.jobs):
                    (running if job.started else queued).append(job)
                    self._settle(job)
                if slot.caller is not None and not slot.caller.calling:
                    idle.append(slot.caller.thread)
                self._drop_caller(slot)
            self._abandoned += len(running)
        stopping = [(slot.thread, slot.ref.stop(block=False)) for slot in self._slots]
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
        for thread in idle:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _log.warning("summarizer thread %s did not stop within %ss", thread.name, timeout)
        self._loops.close()

    # The workers' side (each called on a worker's thread) ------------------------------

    def _started(self, slot: _Slot) -> None:
        thread = threading.current_thread()
        thread.name = slot.name
        with self._lock:
            slot.thread = thread

    def _run(self, job: _Job) -> SummaryOutcome | None:
        """Run `job` on its worker's call thread; its outcome, or None if `close()` answered it."""
        slot = job.slot
        with self._lock:
            if job.settled:
                return None  # answered by close() while it waited in the inbox
            caller = slot.caller
            if caller is None:
                callers = sum(1 for other in self._slots if other.caller is not None)
                if self._hanging + callers >= len(self._slots) + self._max_abandoned:
                    self._settle(job)
                    return SummaryOutcome(request=job.request, error=self._full_error())
                name = f"{slot.name}-call-{next(slot.calls)}"
                caller = Caller(self._lock, name, self._loops, self._returned)
                caller.thread.start()
                slot.caller = caller
            job.started = True
            caller.hand(job.request, job.summarizer)
            answered = lambda: caller.outcome is not None or caller.retired  # noqa: E731
            caller.answered.wait_for(answered, self._call_timeout)
            limit = f"{self._call_timeout:g}s limit"
            if caller.outcome is None and not job.settled and caller.cancel():
                # A coroutine: cancelled on its loop, its call thread answers at once (and stays).
                caller.answered.wait_for(answered, self._call_timeout)
                if caller.outcome is not None:
                    caller.outcome = SummaryOutcome(
                        request=job.request,
                        error=f"summarizer coroutine did not finish within the {limit}; it was cancelled",
                    )
            if job.settled:
                return None  # close() answered it and abandoned the call
            outcome = caller.outcome
            if outcome is None:
                caller.retire()  # its thread stays with the hanging call; the next job gets a fresh one
                slot.caller = None
                self._abandoned += 1
                self._hanging += 1
                outcome = SummaryOutcome(request=job.request, error=f"summarizer timed out after {limit}")
            self._settle(job)
        return outcome

    def _drop_caller(self, slot: _Slot) -> None:
        """Retire the slot's call thread (lock held); a call it is making is cancelled if it can be."""
        caller, slot.caller = slot.caller, None
        if caller is None:
            return
        if caller.calling:
            caller.cancel()
            self._hanging += 1  # until it returns (`_returned`)
        caller.retire()

    def _returned(self) -> None:
        """An abandoned call returned at last (on its thread, lock held): its thread ends."""
        self._hanging -= 1

    def _full_error(self) -> str:
        return (
            f"summarizer: {self._hanging} earlier calls are still running past their "
            f"{self._call_timeout:g}s limit, the most this pool leaves running (workers + max_abandoned="
            f"{self._max_abandoned} call threads in all); no new call is started until one returns"
        )

    def _give_up(self, job: _Job, exc: BaseException) -> SummaryOutcome | None:
        """The outcome for a job that could not be run, or None if it was answered already."""
        with self._lock:
            if job.settled:
                return None
            self._settle(job)
        return failure(job.request, exc)

    def _stopped(self, slot: _Slot) -> None:
        """A worker stopped: retire its call thread and answer the jobs it still held.

        It holds none after `close()`; only a stop from outside the pool leaves any.
        """
        with self._lock:
            self._drop_caller(slot)
            orphans = list(slot.jobs)
            for job in orphans:
                self._settle(job)
        for job in orphans:
            _deliver(job, SummaryOutcome(request=job.request, error="summarizer worker stopped"))

    def _settle(self, job: _Job) -> None:
        """Mark `job` answered (the caller answers it); with the lock held."""
        job.settled = True
        del job.slot.jobs[job]
        self._queued -= 1
