"""Clocks: the system clock with one timer thread, and a manual clock for tests.

Timer callbacks must be quick and must not block: the runtime's callbacks
only post a message to an actor.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["ManualClock", "SystemClock"]

_log = logging.getLogger("convmem.clock")


class _Handle:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _run(handle: _Handle) -> None:
    try:
        handle.callback()
    except Exception:
        _log.exception("timer callback failed")


class SystemClock:
    """Wall-clock time; timers run on one daemon thread started on first use."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Handle]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def now(self) -> float:
        """Epoch seconds."""
        return time.time()

    def call_at(self, when: float, callback: Callable[[], object]) -> _Handle:
        """Run `callback` on the timer thread once `now() >= when`."""
        handle = _Handle(when, callback)
        with self._cond:
            if self._closed:
                handle.cancel()
                return handle
            heapq.heappush(self._heap, (when, next(self._counter), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="convmem-timers", daemon=True)
                self._thread.start()
            self._cond.notify()
        return handle

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.time()):
                    wait = self._heap[0][0] - time.time() if self._heap else None
                    self._cond.wait(timeout=wait)
                if self._closed:
                    return
                _, _, handle = heapq.heappop(self._heap)
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
        self._heap: list[tuple[float, int, _Handle]] = []
        self._counter = itertools.count()
        self._lock = threading.RLock()

    def now(self) -> float:
        """The current manual time."""
        with self._lock:
            return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> _Handle:
        """Schedule `callback`; runs immediately when `when` has already come."""
        handle = _Handle(when, callback)
        with self._lock:
            due = when <= self._now
            if not due:
                heapq.heappush(self._heap, (when, next(self._counter), handle))
        if due:
            _run(handle)
        return handle

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing every timer that comes due."""
        if seconds < 0:
            raise ValueError(f"a clock does not go backwards (advance by {seconds})")
        self.set(self.now() + seconds)

    def set(self, when: float) -> None:
        """Move time forward to `when`, firing every timer that comes due."""
        with self._lock:
            if when < self._now:
                raise ValueError(f"a clock does not go backwards ({when} < {self._now})")
        while True:
            with self._lock:
                if not self._heap or self._heap[0][0] > when:
                    self._now = when
                    return
                at, _, handle = heapq.heappop(self._heap)
                self._now = max(self._now, at)
            if not handle.cancelled:
                _run(handle)

    def pending_timers(self) -> int:
        """Timers scheduled and not yet fired or cancelled."""
        with self._lock:
            return sum(1 for _, _, h in self._heap if not h.cancelled)
