"""Clocks: the system clock with one timer thread, and a manual clock for tests.

Timer callbacks must be quick and must not block: the runtime's callbacks
only post a message to an actor.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable

from convmem.errors import InvalidInput

__all__ = ["ManualClock", "SystemClock"]

_log = logging.getLogger("convmem.clock")

LONGEST_SLEEP = 3_600.0
"""The longest the timer thread sleeps at once: it wakes and looks again (a wait of more than about
9.2e9 seconds overflows time_t, and the thread would die with every timer of the system; settings
are bounded to a day, but a configuration stored by an older version is replayed as it was)."""


class _Handle:
    __slots__ = ("_heap", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object], heap: _TimerHeap | None = None) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self._heap = heap

    def cancel(self) -> None:
        """Never run; the callback (and whatever it holds) is let go at once."""
        if self.cancelled:
            return
        self.cancelled = True
        self.callback = _nothing
        heap, self._heap = self._heap, None
        if heap is not None:
            heap.forget_one()


def _nothing() -> None:
    return None


class _TimerHeap:
    """Timers by due time. Cancelled ones leave the heap once they are half of it.

    A session sets a timeout for every summary and cancels it a moment later;
    left in the heap until due (a minute on), tens of thousands of dead timers
    would pile up under load and slow every garbage collection.
    """

    __slots__ = ("_cancelled", "_counter", "_lock", "entries")

    def __init__(self, lock: threading.Lock | threading.RLock | threading.Condition) -> None:
        self.entries: list[tuple[float, int, _Handle]] = []
        self._counter = itertools.count()
        self._cancelled = 0
        self._lock = lock

    def push(self, when: float, callback: Callable[[], object]) -> _Handle:
        """Add a timer (the caller holds the lock)."""
        handle = _Handle(when, callback, self)
        heapq.heappush(self.entries, (when, next(self._counter), handle))
        return handle

    def due(self) -> float:
        """When the earliest timer is due (infinity when there is none; the caller holds the lock)."""
        return self.entries[0][0] if self.entries else math.inf

    def pop(self) -> _Handle:
        """Take the earliest timer (the caller holds the lock)."""
        _, _, handle = heapq.heappop(self.entries)
        if handle.cancelled:
            self._cancelled -= 1
        else:
            handle._heap = None  # leaving the heap: a cancel after this counts nothing
        return handle

    def forget_one(self) -> None:
        with self._lock:
            self._cancelled += 1
            if self._cancelled > 64 and 2 * self._cancelled > len(self.entries):
                self.entries = [entry for entry in self.entries if not entry[2].cancelled]
                heapq.heapify(self.entries)
                self._cancelled = 0


def _run(handle: _Handle) -> None:
    try:
        handle.callback()
    except Exception:
        _log.exception("timer callback failed")


class SystemClock:
    """Wall-clock time; timers run on one daemon thread started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._timers = _TimerHeap(self._cond)
        self._thread: threading.Thread | None = None
        self._closed = False

    def now(self) -> float:
        """Epoch seconds."""
        return time.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> _Handle:
        """Run `callback` on the timer thread once `now() >= when`."""
        with self._cond:
            if self._closed:
                handle = _Handle(when, callback)
                handle.cancel()
                return handle
            handle = self._timers.push(when, callback)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="convmem-timers", daemon=True)
                self._thread.start()
            elif self._timers.due() < when:
                return handle  # an earlier timer wakes the thread first: no wake-up (and GIL hand-off) now
            self._cond.notify()
        return handle

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (due := self._timers.due()) > time.time():
                    self._cond.wait(
                        timeout=None if due == math.inf else min(due - time.time(), LONGEST_SLEEP)
                    )
                if self._closed:
                    return
                handle = self._timers.pop()
            if not handle.cancelled:
                _run(handle)

    def close(self) -> None:
        """Stop the timer thread; pending timers never fire."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class ManualClock:
    """A clock that moves only when told to, for tests; it refuses to go backwards.

    Timers fire inside `advance()` / `set()` in the caller's thread, in time
    order; a timer scheduled for a time already reached fires at once.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.RLock()
        self._timers = _TimerHeap(self._lock)

    def now(self) -> float:
        """The current manual time."""
        with self._lock:
            return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _Handle:
        """Schedule `callback`; runs immediately when `when` has already come."""
        with self._lock:
            due = when <= self._now
            if not due:
                return self._timers.push(when, callback)
        handle = _Handle(when, callback)
        _run(handle)
        return handle

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing every timer that comes due."""
        if seconds < 0:
            raise InvalidInput("seconds", f"a clock does not go backwards (advance by {seconds})")
        self.set(self.now() + seconds)

    def set(self, when: float) -> None:
        """Move time forward to `when`, firing every timer that comes due."""
        with self._lock:
            if when < self._now:
                raise InvalidInput("when", f"a clock does not go backwards ({when} < {self._now})")
        while True:
            with self._lock:
                if self._timers.due() > when:
                    self._now = when
                    return
                handle = self._timers.pop()
                self._now = max(self._now, handle.when)
            if not handle.cancelled:
                _run(handle)

    def pending_timers(self) -> int:
        """Timers scheduled and not yet fired or cancelled."""
        with self._lock:
            return sum(1 for _, _, h in self._timers.entries if not h.cancelled)
