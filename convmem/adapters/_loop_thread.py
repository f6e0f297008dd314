"""An asyncio loop on its own thread, for synchronous callers of an async client.

The ports are synchronous (session actors are threads) while nats-py is
asyncio. One daemon thread runs the loop that owns the connection; callers
hand it a coroutine function and wait on a `concurrent.futures.Future` with a
timeout, so no caller ever blocks the loop and no wait is unbounded.

`submit` costs a task and a wake-up of the loop per call. `post` is for the
hot path (appends from many session actors at once): posted work waits in a
list, the loop wakes once for whatever piled up and starts it all from one
task, and each piece settles its own future later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from convmem.actors import Settle
from convmem.errors import LogUnavailable, SessionClosed, WrongThread

__all__ = ["EventLoopThread"]

T = TypeVar("T")

Start = Callable[[], Coroutine[Any, Any, None]]
"""Posted work: begins (sends, spawns) without waiting on the network; settles its future later."""


class EventLoopThread:
    """A running event loop and the thread that runs it.

    Made with a `name`, it starts a loop on a daemon thread of its own. Made
    with `here()`, it is the caller's running loop and thread, used as they
    are: `stop` then leaves that loop running.
    """

    def __init__(self, name: str, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._posted: list[tuple[Start, Settle[Any]]] = []
        self._draining = False
        self._own = loop is None
        if loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        else:
            self._loop = loop
            self._thread = threading.current_thread()

    @classmethod
    def here(cls) -> EventLoopThread:
        """The event loop running on this thread (call from a coroutine)."""
        return cls("", loop=asyncio.get_running_loop())

    def on_loop_thread(self) -> bool:
        """Whether the caller is the loop's thread (where waiting for the loop would deadlock)."""
        return threading.current_thread() is self._thread

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
        self._cancel_posted()
        pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    def _cancel_posted(self) -> None:
        """Work posted and not yet started never will be (`post` refuses new work by now)."""
        with self._lock:
            posted, self._posted = self._posted, []
        for _, future in posted:
            future.cancel()

    def submit(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Schedule `fn()` on the loop; the coroutine is only made once the loop accepts it."""
        with self._lock:
            if self._stopped:
                raise SessionClosed("the NATS connection of this log is closed")
            return asyncio.run_coroutine_threadsafe(fn(), self._loop)

    def post(self, start: Start, future: Settle[Any]) -> None:
        """Run `start()` on the loop with whatever else was posted meanwhile, in one task.

        `start` must not wait on the network (it would hold up the rest of its
        batch): it sends or spawns, and settles `future` when the work is done.
        An exception it raises settles `future`; a closing loop cancels it.
        """
        with self._lock:
            if self._stopped:
                raise SessionClosed("the NATS connection of this log is closed")
            self._posted.append((start, future))
            if self._draining:
                return
            self._draining = True
        if threading.current_thread() is self._thread:
            self._loop.call_soon(self._drain)  # from the loop itself: no wake-up through its self-pipe
        else:
            self._loop.call_soon_threadsafe(self._drain)

    def start_here(self, start: Start, future: Settle[Any]) -> None:
        """On the loop's thread, `start()` in a task of its own, `future` already running (asked
        `set_running_or_notify_cancel`): what `post` does for one piece of work, without the batch."""
        self._loop.create_task(_start_all([(start, future)], running=True))

    def _drain(self) -> None:
        with self._lock:
            batch, self._posted = self._posted, []
            self._draining = False
        self._loop.create_task(_start_all(batch))

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], *, timeout: float, what: str) -> T:
        """Run `fn()` on the loop and wait at most `timeout` seconds for its result.

        A wait that runs out cancels the coroutine and raises `LogUnavailable`.
        """
        if self.on_loop_thread():
            raise WrongThread(
                f"a blocking call ({what}) was made on the NATS connection's event loop thread, where it "
                "would deadlock; make it from another thread (asyncio.to_thread)"
            )
        future = self.submit(fn)
        return wait(future, timeout=timeout, what=what)

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop the loop (cancelling what still runs on it) and join its thread. Idempotent.

        A loop used as it was (`here`) keeps running; work posted and not yet started is cancelled.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if not self._own:
            self._cancel_posted()
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


async def _start_all(batch: list[tuple[Start, Settle[Any]]], *, running: bool = False) -> None:
    for index, (start, future) in enumerate(batch):
        if not running and not future.set_running_or_notify_cancel():
            continue  # its caller stopped waiting before the loop got to it
        try:
            await start()
        except asyncio.CancelledError:  # the loop is closing: nobody will start the rest
            future.set_exception(SessionClosed("the NATS connection closed"))
            for _, rest in batch[index + 1 :]:
                rest.cancel()
            raise
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)


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
