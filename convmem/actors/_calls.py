"""One summarizer call: its outcome, and the event loop a coroutine summarizer runs on.

A worker of the `SummarizerPool` makes each call on its own thread and turns
whatever the summarizer returns or raises into a `SummaryOutcome`.

A summarizer that returns an awaitable (an ``async def``) is run on an event
loop where it works, not under ``asyncio.run`` on the worker's thread: a
coroutine that awaits an object of the planner's loop (an event, a shared
HTTP client) can only finish there. `SummaryLoops` picks the loop: the one
the system was made on (or that an integration names) while it runs, else a
loop of the pool's own on a thread of its own, kept for every call, so a
client the summarizer binds to its loop on the first call still works on the
next. The worker waits for the coroutine; a call past its limit is
cancelled on its loop (by the pool's watchdog), which frees the worker at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import weakref
from collections.abc import Coroutine, Mapping
from typing import Any

import msgspec

from convmem.errors import SessionClosed, SummarizerError
from convmem.projections import SummaryRequest

__all__ = ["SummaryLoops", "SummaryOutcome", "extract", "failure"]

_log = logging.getLogger("convmem.summarizer")

_STOP_SECONDS = 5.0
"""How long closing waits for the pool's own loop to cancel its calls and stop."""


class SummaryOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A summarizer's answer to `request`: a text, or why there is none."""

    request: SummaryRequest
    summary: str | None = None
    error: str | None = None


def extract(result: object) -> str:
    """The summary text from a summarizer's return value (mapping or string)."""
    if isinstance(result, Mapping):
        if "summary" not in result:
            raise SummarizerError(
                f"summarizer output has no 'summary' key (keys: {sorted(map(str, result))[:5]})"
            )
        result = result["summary"]
    if not isinstance(result, str):
        raise SummarizerError(f"summarizer output 'summary' is {type(result).__name__}, not a string")
    # A str subclass is copied into a plain str here, at the boundary: its own methods (`__len__`,
    # `__hash__`, ...) are the summarizer's code and must not run inside the pure core later.
    return str.__str__(result)


def failure(request: SummaryRequest, exc: BaseException) -> SummaryOutcome:
    return SummaryOutcome(
        request=request, error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    )


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _coroutine(awaitable: Any) -> Coroutine[Any, Any, Any]:
    return awaitable if inspect.iscoroutine(awaitable) else _awaited(awaitable)


class SummaryLoops:
    """The loop a coroutine summarizer runs on: the preferred one while it runs, else the pool's own."""

    def __init__(self, preferred: asyncio.AbstractEventLoop | None) -> None:
        self._preferred = weakref.ref(preferred) if preferred is not None else None
        self._lock = threading.Lock()
        self._own: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, awaitable: Any) -> concurrent.futures.Future[Any]:
        """Start `awaitable` on a loop from any thread; its future (cancelling it cancels the task)."""
        coroutine = _coroutine(awaitable)
        loop = self._preferred() if self._preferred is not None else None
        if loop is not None and loop.is_running() and not loop.is_closed():
            try:
                return asyncio.run_coroutine_threadsafe(coroutine, loop)
            except RuntimeError:  # it closed just now: run on the pool's own loop
                pass
        return asyncio.run_coroutine_threadsafe(coroutine, self._own_loop())

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise SessionClosed("the summarizer pool is closed")
            if self._own is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._serve, args=(loop, ready), name="convmem-summarizer-loop", daemon=True
                )
                thread.start()
                ready.wait()
                self._own, self._thread = loop, thread
            return self._own

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def close(self) -> None:
        """Cancel what still runs on the pool's own loop and stop it (the preferred loop is the caller's)."""
        with self._lock:
            self._closed = True
            loop, thread = self._own, self._thread
            self._own = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(_STOP_SECONDS)
        except (concurrent.futures.TimeoutError, RuntimeError):
            _log.warning("summarizer calls on the pool's event loop did not end within %ss", _STOP_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(_STOP_SECONDS)


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
