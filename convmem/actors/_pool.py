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
next job. A hanging summarizer costs one abandoned thread, never a worker.

Whatever the summarizer returns or raises (a `BaseException` included)
becomes a `SummaryOutcome`, and so does a reply callback's failure (logged);
nothing escapes into an actor, where a `BaseException` would stop every actor
of the process. `close()` answers every queued and running job at once,
waits for no hanging call, and stops the workers.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import pykka

from convmem.actors._ports import Summarizer
from convmem.projections import SummaryRequest

__all__ = ["SummarizerPool", "SummaryOutcome"]

_log = logging.getLogger("convmem.summarizer")


class SummaryOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A summarizer's answer to `request`: a text, or why there is none."""

    request: SummaryRequest
    summary: str | None = None
    error: str | None = None


Reply = Callable[[SummaryOutcome], object]


def _extract(result: object) -> str:
    """The summary text from a summarizer's return value (mapping or string)."""
    if isinstance(result, Mapping):
        if "summary" not in result:
            raise ValueError(f"summarizer output has no 'summary' key (keys: {sorted(map(str, result))[:5]})")
        result = result["summary"]
    if not isinstance(result, str):
        raise TypeError(f"summarizer output 'summary' is {type(result).__name__}, not a string")
    return result


def _summarize(summarizer: Summarizer, request: SummaryRequest) -> str:
    result = summarizer(request.payload())
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return _extract(result)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _failure(request: SummaryRequest, exc: BaseException) -> SummaryOutcome:
    return SummaryOutcome(
        request=request, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    )


def _outcome(summarizer: Summarizer, request: SummaryRequest) -> SummaryOutcome:
    """Run the summarizer in an empty context (as on a new thread); every failure becomes an error."""
    try:
        summary = contextvars.Context().run(_summarize, summarizer, request)
    except BaseException as exc:  # a summarizer must never take a call thread down
        return _failure(request, exc)
    return SummaryOutcome(request=request, summary=summary)


class _Slot:
    """The pool's side of one worker: its actor, its call thread, the jobs it holds.

    `jobs`, `caller` and `thread` change only under the pool's lock.
    """

    ref: pykka.ActorRef[_Worker]

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: dict[_Job, None] = {}
        """Jobs told to the worker and not answered yet, oldest first."""
        self.caller: _Caller | None = None
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


class _Caller:
    """A worker's call thread: runs the requests its worker hands it, one at a time, until retired.

    Its conditions share the pool's lock; `hand` and `retire` are called with it held.
    """

    def __init__(self, lock: threading.Lock, name: str) -> None:
        self._handed = threading.Condition(lock)  # a request was handed, or retired
        self.answered = threading.Condition(lock)  # the outcome is in, or retired
        self._request: SummaryRequest | None = None
        self._summarizer: Summarizer | None = None
        self.outcome: SummaryOutcome | None = None
        self.calling = False
        self.retired = False
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def hand(self, request: SummaryRequest, summarizer: Summarizer) -> None:
        self._request = request
        self._summarizer = summarizer
        self.outcome = None
        self._handed.notify()

    def retire(self) -> None:
        """Serve no more requests; a call running now ends with its summarizer, and its answer is dropped."""
        self.retired = True
        self._handed.notify()
        self.answered.notify()

    def _serve(self) -> None:
        while True:
            with self._handed:
                self._handed.wait_for(lambda: self._request is not None or self.retired)
                request, summarizer = self._request, self._summarizer
                if self.retired or request is None or summarizer is None:
                    return
                self._request = self._summarizer = None
                self.calling = True
            outcome = _outcome(summarizer, request)
            with self.answered:
                self.calling = False
                self.outcome = outcome
                self.answered.notify()


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
            raise TypeError(f"summarizer worker got an unknown message {type(message).__name__}")
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
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if queue_limit < workers:
            raise ValueError(f"queue_limit ({queue_limit}) must be >= workers ({workers})")
        if not call_timeout > 0:
            raise ValueError(f"call_timeout must be > 0, got {call_timeout}")
        self._summarizer = summarizer
        self._queue_limit = queue_limit
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._queued = 0
        self._abandoned = 0
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
        """Summarizer calls that outlived `call_timeout` (or the pool) and were left running."""
        with self._lock:
            return self._abandoned

    def submit(self, request: SummaryRequest, reply: Reply, *, summarizer: Summarizer | None = None) -> bool:
        """Queue a job for `summarizer` (default: the pool's); False (nothing queued) when the
        queue is full or the pool closed. A job with no summarizer at all is a `ValueError`."""
        chosen = summarizer if summarizer is not None else self._summarizer
        if chosen is None:
            raise ValueError("this summarizer pool has no summarizer of its own: pass summarizer=")
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
                if slot.caller is not None:
                    if not slot.caller.calling:
                        idle.append(slot.caller.thread)
                    slot.caller.retire()
                    slot.caller = None
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
                caller = _Caller(self._lock, f"{slot.name}-call-{next(slot.calls)}")
                caller.thread.start()
                slot.caller = caller
            job.started = True
            caller.hand(job.request, job.summarizer)
            caller.answered.wait_for(lambda: caller.outcome is not None or caller.retired, self._call_timeout)
            if job.settled:
                return None  # close() answered it and abandoned the call
            outcome = caller.outcome
            if outcome is None:
                caller.retire()  # its thread stays with the hanging call; the next job gets a fresh one
                slot.caller = None
                self._abandoned += 1
                error = f"summarizer timed out after {self._call_timeout:g}s limit"
                outcome = SummaryOutcome(request=job.request, error=error)
            self._settle(job)
        return outcome

    def _give_up(self, job: _Job, exc: BaseException) -> SummaryOutcome | None:
        """The outcome for a job that could not be run, or None if it was answered already."""
        with self._lock:
            if job.settled:
                return None
            self._settle(job)
        return _failure(job.request, exc)

    def _stopped(self, slot: _Slot) -> None:
        """A worker stopped: retire its call thread and answer the jobs it still held.

        It holds none after `close()`; only a stop from outside the pool leaves any.
        """
        with self._lock:
            if slot.caller is not None:
                slot.caller.retire()
                slot.caller = None
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
