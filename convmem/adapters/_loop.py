"""An asyncio loop on its own thread, for synchronous callers of an async client.

The ports are synchronous (session actors are threads) while nats-py is
asyncio. One daemon thread runs the loop that owns the connection; callers
hand it a coroutine function and wait on a `concurrent.futures.Future` with a
timeout, so no caller ever blocks the loop and no wait is unbounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from convmem.errors import LogUnavailable, SessionClosed

__all__ = ["EventLoopThread"]

T = TypeVar("T")


class EventLoopThread:
    """A running event loop and the thread that runs it."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    def submit(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Schedule `fn()` on the loop; the coroutine is only made once the loop accepts it."""
        with self._lock:
            if self._stopped:
                raise SessionClosed("the NATS connection of this log is closed")
            return asyncio.run_coroutine_threadsafe(fn(), self._loop)

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], *, timeout: float, what: str) -> T:
        """Run `fn()` on the loop and wait at most `timeout` seconds for its result.

        A wait that runs out cancels the coroutine and raises `LogUnavailable`.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking call was made from the event loop thread; it would deadlock")
        future = self.submit(fn)
        return wait(future, timeout=timeout, what=what)

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join its thread. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


def wait(future: concurrent.futures.Future[T], *, timeout: float, what: str) -> T:
    """Wait for a loop future; a timeout cancels it and raises `LogUnavailable`."""
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise LogUnavailable(
            f"{what} did not finish within {timeout:g}s; the NATS server may be down or overloaded "
            "(retrying is safe: appends are exactly-once by event id)"
        ) from None
    except concurrent.futures.CancelledError:
        raise SessionClosed(f"{what} was cancelled because the connection closed") from None
