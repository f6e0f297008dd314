"""Answers for the callers of a session: how a blocking thread and an asyncio task wait for a write.

A blocking caller waits on a `concurrent.futures.Future` with a timeout
(`wait_for`). An asyncio caller's write is answered through a `LoopAnswer`:
settled on any thread (often the log's loop), handed to the caller's loop in
batches, one wake-up of that loop per batch instead of one per answer as
`asyncio.wrap_future` would make. Both are `Settle`s of the runtime's one
protocol.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from convmem.actors._ports import Settle
from convmem.errors import ConvmemError, InternalError, OperationTimeout, SessionClosed
from convmem.events import AnyEvent

__all__ = ["Answering", "Deadlines", "Expiring", "LoopAnswer", "SettleOnce", "await_for", "wait_for"]

T = TypeVar("T")


class _LoopInbox:
    """Answers for one asyncio loop, settled on other threads and handed over in batches.

    One `call_soon_threadsafe` (a wake-up of the loop) per batch instead of
    one per answer, as `asyncio.wrap_future` would make.
    """

    __slots__ = ("__weakref__", "_items", "_lock", "_loop", "_scheduled", "deadlines")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the registry of inboxes is keyed by the loop, and must not keep it alive.
        self._loop = weakref.ref(loop)
        self._items: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self.deadlines: Deadlines[LoopAnswer] = Deadlines()
        """The timeouts of the loop's callers (`LoopAnswer.expire`), used on the loop only."""

    def deliver(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        with self._lock:
            self._items.append((future, result, error))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        if loop is None:
            return  # the loop is gone, and whoever waited on it
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for future, result, error in items:
            if future.done():
                continue  # its caller stopped waiting (a timeout)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopInbox] = weakref.WeakKeyDictionary()
_inboxes_lock = threading.Lock()


_last: tuple[weakref.ref[asyncio.AbstractEventLoop], _LoopInbox] | None = None
"""The inbox asked for last, by a weak reference to its loop (a process mostly awaits on one loop:
the registry, a weak dictionary whose `get` is Python code, is asked only when the loop changes)."""


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    return _inbox_of(loop)


def _inbox_of(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    global _last  # noqa: PLW0603 - the one-entry cache of `_inbox`
    inbox = _inboxes.get(loop)
    if inbox is None:
        with _inboxes_lock:
            inbox = _inboxes.setdefault(loop, _LoopInbox(loop))
    _last = (weakref.ref(loop), inbox)
    return inbox


_PENDING, _RUNNING, _CANCELLED, _FINISHED = range(4)
_LINE = 1024
"""`Deadlines` compacts a line past this many waiting answers at the least."""


class Expiring(Protocol):
    """What `Deadlines` times out: an answer that says whether it was given (`sent`), and gives
    `OperationTimeout` when `expire` is called first (on the loop)."""

    wait: float | None
    """Its timeout, once a `Deadlines` keeps it."""

    @property
    def sent(self) -> bool: ...

    def expire(self, wait: float) -> None: ...


E = TypeVar("E", bound=Expiring)


class _Line(Generic[E]):
    """The answers of one timeout, in the order they were awaited, and whether a timer is set for it."""

    __slots__ = ("armed", "compact_at", "items")

    def __init__(self) -> None:
        self.items: collections.deque[tuple[float, E]] = collections.deque()
        self.armed = False
        self.compact_at = _LINE


class Deadlines(Generic[E]):
    """The timeouts of the answers awaited on one loop: one line per timeout in seconds, in the order
    the answers were awaited (so by deadline), one timer per line, used on that loop only.

    An answer given leaves the head of its line at once (answers mostly come in order); one given
    behind an older, slower one stays in the line until the older one leaves, and when those
    outnumber the line's last compacted length twice over (a session kept busy for its whole
    timeout, say) the line is compacted: it holds at most about twice the answers still awaited (at
    least `_LINE`). The timer wakes at the head's deadline, expires what is due (`expire`) and
    sleeps until the next head's. No timer made and cancelled per write, as `call_later` would. It
    keeps no reference to its timers (the loop does), so it never keeps a loop alive by itself.
    """

    __slots__ = ("_lines",)

    def __init__(self) -> None:
        self._lines: dict[float, _Line[E]] = {}

    def add(self, answer: E, wait: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Time `answer` out after `wait` seconds on `loop` (the running one: given, or looked up)."""
        if loop is None:
            loop = asyncio.get_running_loop()
        line = self._lines.get(wait)
        if line is None:
            line = self._lines[wait] = _Line()
        deadline = loop.time() + wait
        line.items.append((deadline, answer))
        answer.wait = wait
        if not line.armed:
            line.armed = True
            loop.call_at(deadline, self._expire, wait)

    def answered(self, wait: float) -> None:
        """An answer of the line `wait` was given: the given ones leave its head."""
        line = self._lines.get(wait)
        if line is None:
            return
        items = line.items
        while items and items[0][1].sent:
            items.popleft()
        if len(items) > line.compact_at:
            line.items = collections.deque(entry for entry in items if not entry[1].sent)
            line.compact_at = max(_LINE, 2 * len(line.items))

    def waiting(self, wait: float) -> int:
        """How many answers the line `wait` holds (given ones behind an older one included)."""
        line = self._lines.get(wait)
        return 0 if line is None else len(line.items)

    def _expire(self, wait: float) -> None:
        loop = asyncio.get_running_loop()
        line = self._lines[wait]
        line.armed = False
        now = loop.time()
        while line.items:  # (`line.items` looked up again: an answer may compact it)
            deadline, answer = line.items[0]
            if answer.sent:
                line.items.popleft()
            elif deadline <= now:
                line.items.popleft()
                answer.expire(wait)  # answered now: nothing of it is kept
            else:
                line.armed = True
                loop.call_at(deadline, self._expire, wait)
                return
        del self._lines[wait]


class SettleOnce(abc.ABC):
    """A write's answer as the write sees it (`Settle`) without a `concurrent.futures.Future`: pending,
    running, then cancelled or finished, each step once, under `_lock` (a subclass gives it: one of
    its own, or one shared by many answers). A subclass delivers the outcome: `_cancelled` with the
    error of a write that will never start, `_finished` with the write's result or error.
    """

    __slots__ = ("_state",)
    _lock: threading.Lock

    def __init__(self) -> None:
        self._state = _PENDING

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            if self._state == _CANCELLED:
                return False
            if self._state != _PENDING:
                raise InternalError("the write's reply was started twice")
            self._state = _RUNNING
            return True

    def running(self) -> bool:
        return self._state == _RUNNING

    def done(self) -> bool:
        return self._state >= _CANCELLED

    def cancel(self) -> bool:
        """Before the write starts: it never will (its caller gave up, or its loop or actor stopped)."""
        if not self._withdraw():
            return self._state == _CANCELLED
        self._cancelled(SessionClosed("the write was cancelled before it started"))
        return True

    def _withdraw(self) -> bool:
        """Pending -> cancelled, telling no one: True if this call did it."""
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
            return True

    def set_result(self, result: Any, /) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None, /) -> None:
        self._finish(None, exception or RuntimeError("a write failed without an error"))

    def _finish(self, result: Any, error: BaseException | None) -> None:
        self._mark_finished()
        self._finished(result, error)

    def _mark_finished(self) -> None:
        with self._lock:
            if self._state >= _CANCELLED:
                raise concurrent.futures.InvalidStateError("the write was answered already")
            self._state = _FINISHED

    @abc.abstractmethod
    def _cancelled(self, error: BaseException) -> None: ...

    @abc.abstractmethod
    def _finished(self, result: Any, error: BaseException | None) -> None: ...


class LoopAnswer(SettleOnce):
    """A write's answer (`Settle`) for an asyncio caller: settled on any thread, answered on its loop.

    What a write needs of a `concurrent.futures.Future`, without its
    condition variable and per-answer wake-up: the answer goes to `future` on
    the caller's loop through the loop's `_LoopInbox`.
    """

    __slots__ = ("_inbox", "_lock", "deadlines", "future", "wait")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.future: asyncio.Future[Any] = loop.create_future()
        self._inbox = inbox = _inbox(loop)
        self._lock = threading.Lock()
        self.deadlines: Deadlines[LoopAnswer] = inbox.deadlines
        """The timeouts of its loop's callers: `add` it there once its write is on its way."""
        self.wait: float | None = None
        """Its timeout, once its loop's `Deadlines` keeps it (`expire`)."""

    @property
    def sent(self) -> bool:
        """Its caller has its answer (or stopped waiting)."""
        return self.future.done()

    def expire(self, wait: float) -> None:
        """On the caller's loop, once its wait ran out: it gets `OperationTimeout`; the write may go on."""
        if self.future.done():
            return
        self.cancel()  # not started yet: it never will be
        self.future.set_exception(
            OperationTimeout(
                f"write did not finish within {wait:g}s (it may still complete; retry with the same "
                "idempotency_key to store it once)"
            )
        )

    def _cancelled(self, error: BaseException) -> None:
        self._inbox.deliver(self.future, None, error)

    def _finished(self, result: Any, error: BaseException | None) -> None:
        future = self.future
        if asyncio._get_running_loop() is future.get_loop():  # settled on the caller's own loop: at once
            if not future.done():  # (done: its caller stopped waiting, a timeout)
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
            return
        self._inbox.deliver(future, result, error)


class Answering(Generic[T]):
    """A write's `Settle` that hands its caller's `reply` what the stored events read as (`answer`)."""

    __slots__ = ("_answer", "_reply")

    def __init__(self, reply: Settle[T], answer: Callable[[list[AnyEvent]], T]) -> None:
        self._reply = reply
        self._answer = answer

    def set_running_or_notify_cancel(self) -> bool:
        return self._reply.set_running_or_notify_cancel()

    def done(self) -> bool:
        return self._reply.done()

    def cancel(self) -> bool:
        return self._reply.cancel()

    def set_result(self, events: list[AnyEvent], /) -> None:
        try:
            value = self._answer(events)
        except Exception as exc:
            self._reply.set_exception(exc)
        else:
            self._reply.set_result(value)

    def set_exception(self, exception: BaseException, /) -> None:
        self._reply.set_exception(exception)


def wait_for(reply: concurrent.futures.Future[T], timeout: float, what: str) -> T:
    try:
        return reply.result(timeout=timeout)
    except ConvmemError:
        raise  # the work's own error (an OperationTimeout included), not our wait timing out
    except concurrent.futures.TimeoutError:
        raise OperationTimeout(
            f"{what} did not finish within {timeout:g}s (a write may still complete; retry with "
            "the same idempotency_key to store it once)"
        ) from None


async def await_for(reply: concurrent.futures.Future[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(reply), timeout)
    except ConvmemError:
        raise  # the work's own error (an OperationTimeout included), not our wait timing out
    except TimeoutError:
        raise OperationTimeout(f"{what} did not finish within {timeout:g}s") from None
