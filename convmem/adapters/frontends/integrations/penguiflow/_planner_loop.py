"""PenguiFlow's async summarizer and callbacks, run on the event loop they belong to.

The summarizer ReactPlanner builds calls the planner's LLM client, which is
often bound to the planner's event loop (an HTTP connection pool, a lock).
convmem asks for summaries from its summarizer pool's threads, so each
memory remembers the loop of its latest caller (the one that added the turn
or flushed) and runs the summarizer's coroutine there. A call is bounded by
the session's summarize timeout: past it the coroutine is cancelled on its
loop and the call fails (the health machine shows it). When that loop has
stopped, the coroutine runs on a fresh loop on the pool's thread instead;
nothing ever waits on a loop that no longer runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from convmem.errors import OperationTimeout, SummarizerError

__all__ = ["CallerLoop", "LoopCallback", "LoopSummarizer"]

_log = logging.getLogger("convmem.penguiflow")


class CallerLoop:
    """The event loop of a memory's latest caller, held weakly."""

    __slots__ = ("_ref",)

    def __init__(self) -> None:
        self._ref: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def capture(self) -> None:
        """Remember the running loop (call from a coroutine)."""
        loop = asyncio.get_running_loop()
        if self._ref is None or self._ref() is not loop:
            self._ref = weakref.ref(loop)

    def running(self) -> asyncio.AbstractEventLoop | None:
        """The loop, if it still runs."""
        loop = self._ref() if self._ref is not None else None
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        return loop


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _coroutine(awaitable: Any) -> Coroutine[Any, Any, Any]:
    return awaitable if inspect.iscoroutine(awaitable) else _awaited(awaitable)


class LoopSummarizer:
    """A summarizer for convmem's pool threads that runs PenguiFlow's async one on its caller's loop."""

    def __init__(self, summarizer: Callable[..., Any], loop: CallerLoop, timeout: float) -> None:
        self._summarizer = summarizer
        self._loop = loop
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"LoopSummarizer({self._summarizer!r})"

    def __call__(self, request: Any, /) -> Any:
        result = self._summarizer(request)
        if not inspect.isawaitable(result):
            return result
        loop = self._loop.running()
        if loop is None:
            return asyncio.run(asyncio.wait_for(_coroutine(result), self._timeout))
        future = asyncio.run_coroutine_threadsafe(_coroutine(result), loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # cancels the task on its loop
            raise OperationTimeout(
                f"the summarizer did not answer within {self._timeout:g}s on the planner's event loop; "
                "its call was cancelled"
            ) from None
        except concurrent.futures.CancelledError:
            raise SummarizerError("the summarizer's call was cancelled on the planner's event loop") from None


class LoopCallback:
    """One of PenguiFlow's callbacks, fired on its memory's caller loop as a task (best-effort).

    convmem runs callbacks on its callback threads; an async PenguiFlow
    callback goes to the caller's loop when it runs, else to a fresh loop
    there. Exceptions are swallowed, as PenguiFlow does.
    """

    def __init__(
        self, callback: Callable[..., Any], loop: CallerLoop, convert: Callable[..., tuple[Any, ...]]
    ) -> None:
        self._callback = callback
        self._loop = loop
        self._convert = convert

    def __call__(self, *args: Any) -> None:
        try:
            result = self._callback(*self._convert(*args))
            if not inspect.isawaitable(result):
                return
            loop = self._loop.running()
            if loop is None:
                asyncio.run(_coroutine(result))
                return
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                asyncio.run_coroutine_threadsafe(_quiet(_coroutine(result)), loop)
        except Exception:
            _log.debug("memory callback %r failed (ignored)", self._callback, exc_info=True)


async def _quiet(coroutine: Coroutine[Any, Any, Any]) -> None:
    try:
        await coroutine
    except Exception:
        _log.debug("memory callback failed (ignored, as PenguiFlow does)", exc_info=True)
