"""How sessions leave the live set: eviction past the bound, the idle sweep, passivation, erasure.

A session evicted past `max_live_sessions` or idle for `idle_seconds` leaves
its cell (state and served view) in the idle cache and its actor stops: on
the evicting thread at once when the actor is idle, else behind its mail. An
explicit `passivate` and an erasure (`forget`) drop the cell as well, so the
session's next call reads the log. Part of `LiveSessions` (`convmem.actors._live`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pykka

from convmem.actors._dispatch import stop_idle
from convmem.actors._fair import TenantLru
from convmem.actors._idle import IdleCache, measure
from convmem.actors._metrics import Metrics
from convmem.actors._ports import Clock, Timer
from convmem.actors._session import SessionActor, StateCell
from convmem.events import MemoryKey
from convmem.projections import next_due_at

__all__ = ["Leaving", "LiveEntry"]


class LiveEntry:
    """A live session: its actor and its cell."""

    __slots__ = ("cell", "key", "ref")

    def __init__(self, key: MemoryKey, ref: pykka.ActorRef[SessionActor], cell: StateCell) -> None:
        self.key = key
        self.ref = ref
        self.cell = cell


class Leaving:
    """`LiveSessions`' part that takes sessions out of the live set (and out of the idle cache)."""

    _lock: threading.RLock
    _live: TenantLru[LiveEntry]
    _stopping: dict[MemoryKey, pykka.ActorRef[SessionActor]]
    _sweep_timer: Timer
    idle: IdleCache
    metrics: Metrics
    clock: Clock
    timeout: float
    idle_seconds: float
    closed: bool
    forgets: int

    def _retire(self, key: MemoryKey, entry: LiveEntry, *, keep: bool) -> None:
        """Under the lock: `key` leaves the live set, its cell cached when `keep` (counted by
        `_stop_evicted`, after the lock); its actor is stopping."""
        del self._live[key]
        self._stopping[key] = entry.ref
        if keep:
            self.idle.put(key, entry.cell)
        else:
            self.idle.pop(key)

    def _stop_evicted(self, evicted: list[LiveEntry]) -> None:
        """Stop the actors of evicted entries: here when idle, else behind their mail; then count
        what their cached cells cost, outside the lock (an encode of each state)."""
        for old in evicted:
            self.metrics.count("passivations")
            if not stop_idle(old.ref):
                old.ref.stop(block=False)
            measured = measure(old.cell)
            with self._lock:
                self.idle.counted(old.key, old.cell, measured)

    def passivate(self, key: MemoryKey) -> bool:
        """Stop the session's actor now and forget its cached state (it reloads from the log when next used).

        True when the session was live or cached.
        """
        with self._lock:
            cached = self.idle.pop(key) is not None
            entry = self._live.get(key)
            if entry is None:
                return cached
            self._retire(key, entry, keep=False)
        entry.ref.stop(block=True, timeout=self.timeout)
        return True

    def forget(self, matches: Callable[[MemoryKey], bool]) -> list[MemoryKey]:
        """Drop every live or cached session whose key `matches`, and wait for those already stopping.

        Returns the keys dropped, in key order.
        """
        with self._lock:
            self.forgets += 1
            # The cache first, under the same lock hold as the live set is read: a session that an
            # activation takes from the cache is live by the time the lock is free, so it is seen below.
            cached = self.idle.drop(matches)
            stopping = [(k, ref) for k, ref in self._stopping.items() if matches(k)]
            live = [k for k in self._live if matches(k)]
        for _key, ref in stopping:
            ref.actor_stopped.wait(self.timeout)
        for key in live:
            self.passivate(key)
        with self._lock:
            cached.extend(self.idle.drop(matches))  # cells that stopping actors were evicted into meanwhile
        return sorted({*live, *cached, *(k for k, _ in stopping)}, key=MemoryKey.composite)

    def _sweep(self) -> None:
        """Retire the actors of sessions idle for `idle_seconds` with no summary work due (cells cached)."""
        now = self.clock.now()
        idle: list[LiveEntry] = []
        with self._lock:
            if self.closed:
                return
            for key, entry in list(self._live.items()):
                cell = entry.cell
                if cell.last_used + self.idle_seconds > now or cell.in_flight:
                    continue
                if next_due_at(cell.state) is not None:
                    continue  # keep healing sessions live; the LRU bound still applies
                self._retire(key, entry, keep=True)
                idle.append(entry)
            for key, ref in list(self._stopping.items()):
                if not ref.is_alive():
                    del self._stopping[key]
            self._sweep_timer = self.clock.call_at(now + self.idle_seconds / 2, self._sweep)
        self._stop_evicted(idle)
