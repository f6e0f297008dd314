"""The summarizer pool: N worker actors behind one bounded queue.

A session submits a `SummaryRequest` with a reply callback and goes on; it
never waits for a summarizer. A worker runs the summarizer on a thread of its
own and waits for it at most `call_timeout` seconds, so a hanging summarizer
costs one abandoned thread, not a worker. Whatever the summarizer returns or
raises (a `BaseException` included) becomes a `SummaryOutcome`; nothing
escapes into an actor.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import threading
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


class _Job(msgspec.Struct, frozen=True):
    request: SummaryRequest
    reply: Reply


def _extract(result: object) -> str:
    """The summary text from a summarizer's return value (mapping or string)."""
    if isinstance(result, Mapping):
        if "summary" not in result:
            raise ValueError(f"summarizer output has no 'summary' key (keys: {sorted(map(str, result))[:5]})")
        result = result["summary"]
    if not isinstance(result, str):
        raise TypeError(f"summarizer output 'summary' is {type(result).__name__}, not a string")
    return result


def _call(summarizer: Summarizer, payload: Mapping[str, Any]) -> str:
    result = summarizer(payload)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return _extract(result)


async def _await(awaitable: Any) -> Any:
    return await awaitable


class _Worker(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self, pool: SummarizerPool) -> None:
        super().__init__()
        self._pool = pool

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, _Job):
            raise TypeError(f"summarizer worker got an unknown message {type(message).__name__}")
        try:
            outcome = self._pool.run(message.request)
        finally:
            self._pool.job_done()
        try:
            message.reply(outcome)
        except Exception:
            _log.exception("delivering a summary to %s failed", message.request.key)
        return None


class SummarizerPool:
    """N summarizer workers sharing a bounded queue of jobs."""

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        workers: int = 4,
        queue_limit: int = 1000,
        call_timeout: float = 60.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if queue_limit < workers:
            raise ValueError(f"queue_limit ({queue_limit}) must be >= workers ({workers})")
        self._summarizer = summarizer
        self._queue_limit = queue_limit
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._queued = 0
        self._abandoned = 0
        self._closing = threading.Event()
        self._refs = [_Worker.start(self) for _ in range(workers)]
        self._next = itertools.cycle(range(workers))

    @property
    def queued(self) -> int:
        """Jobs submitted and not finished."""
        with self._lock:
            return self._queued

    @property
    def abandoned(self) -> int:
        """Summarizer calls that outlived `call_timeout` and were left running."""
        with self._lock:
            return self._abandoned

    def submit(self, request: SummaryRequest, reply: Reply) -> bool:
        """Queue a job; False (nothing queued) when the queue is full or the pool closed."""
        with self._lock:
            if self._closing.is_set() or self._queued >= self._queue_limit:
                return False
            self._queued += 1
            ref = self._refs[next(self._next)]
        try:
            ref.tell(_Job(request, reply))
        except pykka.ActorDeadError:
            self.job_done()
            return False
        return True

    def job_done(self) -> None:
        with self._lock:
            self._queued -= 1

    def run(self, request: SummaryRequest) -> SummaryOutcome:
        """Run the summarizer on its own thread; wait at most `call_timeout` or until close."""
        if self._closing.is_set():
            return SummaryOutcome(request=request, error="summarizer pool closed")
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["summary"] = _call(self._summarizer, request.payload())
            except BaseException as exc:  # a summarizer must never take a thread's actor down
                box["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                done.set()

        thread = threading.Thread(target=target, name=f"convmem-summarize-{request.key}", daemon=True)
        thread.start()
        deadline_hit = not _wait_any(done, self._closing, self._call_timeout)
        if not done.is_set():
            with self._lock:
                self._abandoned += 1
            why = "timed out" if deadline_hit else "pool closed"
            return SummaryOutcome(
                request=request, error=f"summarizer {why} after {self._call_timeout:g}s limit"
            )
        if "error" in box:
            return SummaryOutcome(request=request, error=box["error"])
        return SummaryOutcome(request=request, summary=box["summary"])

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, release waiting workers, stop the workers."""
        self._closing.set()
        for ref in self._refs:
            try:
                ref.stop(block=True, timeout=timeout)
            except (pykka.ActorDeadError, pykka.Timeout):
                _log.warning("summarizer worker did not stop within %ss", timeout)


def _wait_any(done: threading.Event, closing: threading.Event, timeout: float) -> bool:
    """Wait until `done` or `closing` is set or `timeout` passes; True unless it timed out."""
    step = min(0.05, timeout)
    remaining = timeout
    while remaining > 0:
        if done.wait(step) or closing.is_set():
            return True
        remaining -= step
    return done.is_set()
