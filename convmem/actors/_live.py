"""`LiveSessions`: the registry of live session actors, and what each of them sees of the system.

Sessions are virtual. A session activates on its first write (from the idle
cache, else its snapshot plus the log's tail) and its actor leaves when idle
for `idle_seconds` or when the live set grows past `max_live_sessions` (the
least recently used session of the tenant holding the most live ones, see
`convmem.actors._fair`: a tenant touching many sessions evicts its own, not
another tenant's). Every message to a session goes through the registry
under one lock, and a session leaves the registry before its actor is told to
stop, so nothing is sent to a stopping actor; whatever was already queued is
handed back (`stopped`) and delivered to the next activation, on a dispatcher
thread.

A session whose actor left keeps its cell (state and served view) in the
`IdleCache`, bounded in bytes: reads are served from it with no actor, and a
write starts an actor from it without reading the log (optimistic concurrency
on the log's last seq catches another process's writes). An explicit
`passivate`, an erasure (`forget`) and closing drop the cached cell too.

`LiveSessions` is the `SessionHost` its actors are started with: the clock,
the metrics, the storage, the per-session services, the callbacks, and
delivery to live sessions. Handles reach sessions through it too (`deliver`,
`claim_live`, `cell`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading

import msgspec
import pykka

from convmem.actors._callbacks import Callbacks
from convmem.actors._dispatch import Dispatcher, PooledActor, claim, is_busy
from convmem.actors._fair import TenantLru
from convmem.actors._idle import IdleCache, measure
from convmem.actors._leave import Leaving, LiveEntry
from convmem.actors._metrics import Metrics
from convmem.actors._ports import Clock
from convmem.actors._services import ServiceRegistry
from convmem.actors._session import Flush, Message, SessionActor, StateCell, Wake, Write
from convmem.actors._storage import SessionStorage
from convmem.errors import SessionClosed
from convmem.events import AnyEvent, MemoryKey
from convmem.projections import SessionState, next_due_at

__all__ = ["LiveSessions", "SessionActivity"]

_log = logging.getLogger("convmem.system")


class SessionActivity(msgspec.Struct, frozen=True, kw_only=True):
    """What a live session is doing at one moment (`MemorySystem.activity`)."""

    summarizing: bool
    """A summary of the session is being made."""
    flushes_waiting: int
    """`flush()` calls waiting for its summary work to settle."""
    busy: bool
    """A message of the session runs (a write until the log settles it, say) or waits in its inbox:
    a caller's next write queues behind it instead of running on the caller's thread or loop."""


class LiveSessions(Leaving):
    """The live session actors of one system, on one dispatcher's threads."""

    def __init__(
        self,
        *,
        storage: SessionStorage,
        services: ServiceRegistry,
        callbacks: Callbacks,
        clock: Clock,
        metrics: Metrics,
        max_live_sessions: int,
        idle_seconds: float,
        actor_threads: int,
        timeout: float,
        idle_cache_bytes: int,
    ) -> None:
        self.storage = storage
        self.services = services
        self.clock = clock
        self.metrics = metrics
        self.timeout = timeout
        self.max_live_sessions = max_live_sessions
        self.idle_seconds = idle_seconds
        self.dispatcher = Dispatcher(actor_threads, name="convmem-session")
        """The threads the session actors run on (a session holds one only while it handles a message)."""
        self._callbacks = callbacks
        self._lock = threading.RLock()
        self._live: TenantLru[LiveEntry] = TenantLru()
        self.idle = IdleCache(idle_cache_bytes)
        """The cells of sessions whose actor left (under `_lock`)."""
        self.forgets = 0
        """Erasures seen (`forget`): an activation that read the log across one reads it again."""
        self._activation_locks: dict[MemoryKey, threading.Lock] = {}
        # Actors told to stop that may still be handling their last messages: a new
        # activation of the key waits for them, or it would load the log too early.
        self._stopping: dict[MemoryKey, pykka.ActorRef[SessionActor]] = {}
        self.closed = False
        self._sweep_timer = clock.call_at(clock.now() + idle_seconds / 2, self._sweep)

    # What a session actor sees of the system (`SessionHost`) ------------------------------

    def notify(self, key: MemoryKey, old: SessionState, new: SessionState, events: list[AnyEvent]) -> None:
        """A write stored `events`: count them and fire the callbacks, off the write path."""
        self._callbacks.notify(key, old, new, events)

    def tell(self, key: MemoryKey, message: Message, *, here: bool = False) -> bool:
        """Deliver `message` only to a live session (timers and summaries of passivated ones lapse).

        With `here`, a live session that is idle has the message handled by the calling thread (a
        summarizer worker delivering its answer: the answer's write starts without waking a
        dispatcher thread); never on a thread that runs an event loop, where it is queued as usual.
        """
        with self._lock:
            entry = self._live.get(key)
            if entry is None or self.closed:
                return False
            actor = claim(entry.ref) if here and asyncio._get_running_loop() is None else None
            if actor is None:
                entry.ref.tell(message)
                return True
        actor.run_claimed(message)
        return True

    def stopped(self, key: MemoryKey, ref: pykka.ActorRef[SessionActor], leftovers: list[Message]) -> None:
        """A session's actor stopped: its entry goes; the writes and flushes it still held go on.

        They are delivered to the session's next activation from a dispatcher
        thread (activating reads the log), or fail when the system is closed.
        An actor that stopped without being passivated (its caller's thread
        was interrupted while running it) leaves the live set too: the
        session's next message activates it afresh from the log.
        """
        with self._lock:
            if self._stopping.get(key) is ref:
                del self._stopping[key]
            live = self._live.get(key)
            if live is not None and live.ref is ref:
                del self._live[key]
        for message in leftovers:
            if not isinstance(message, Write | Flush):
                continue  # timers and summaries of a passivated session lapse; activation resumes them
            if self.closed or not self.dispatcher.submit(functools.partial(self._redeliver, key, message)):
                _fail(message, SessionClosed("the memory system closed before the message was handled"))

    def _redeliver(self, key: MemoryKey, message: Write | Flush) -> None:
        """On a dispatcher thread: `message` to the session's next activation, or its caller told why not."""
        try:
            self.deliver(key, message)
        except Exception as exc:  # the log could not be read, or the system closed meanwhile
            _log.warning(
                "session %s: a message left by its stopped actor was not delivered", key, exc_info=True
            )
            _fail(message, exc)

    # Reaching a session -------------------------------------------------------------------

    def deliver(self, key: MemoryKey, message: Message, *, here: bool = False) -> None:
        """Queue `message` for the session, activating it when needed.

        With `here`, when the session is idle the calling thread handles the
        message itself: for a caller that is about to wait for the answer
        anyway. The message runs as the actor's next one, in order, and the
        caller skips two thread hand-offs. Never from an event loop (activation
        and the message may read the log, whose answers may need that loop).
        """
        while True:
            if self.closed:
                _fail(message, SessionClosed("the memory system is closed"))
                return
            entry = self._actor(key)
            with self._lock:
                if self._live.get(key) is entry:
                    actor = self._hand(entry, message, here=here)
                    break
        if actor is not None:
            actor.run_claimed(message)

    def claim_live(self, key: MemoryKey, write: Write) -> bool:
        """From an event loop: run `write` right here if its session is live and idle, else queue it
        for the live session; False (nothing done) when the session is not live (activation reads the log).
        """
        with self._lock:
            entry = None if self.closed else self._live.get(key)
            evicted: list[LiveEntry] = []
            if entry is None:
                started = self._from_idle(key)  # reads no log: fine on a loop
                if started is None:
                    return False
                entry, evicted = started
            actor = self._hand(entry, write, here=True)
        if evicted:
            self._stop_evicted(evicted)
        if actor is not None:
            actor.run_claimed(write, on_loop=True)
        return True

    def _hand(self, entry: LiveEntry, message: Message, *, here: bool) -> PooledActor | None:
        """`entry`'s actor claimed for the caller (with `here`, when idle), else `message` queued.

        Under the lock, with `entry` live.
        """
        entry.cell.last_used = self.clock.now()
        actor = claim(entry.ref) if here else None
        if actor is None:
            entry.ref.tell(message)
        return actor

    def cell(self, key: MemoryKey) -> StateCell:
        """The state cell of `key`: live, else cached, else loaded into the cache (no actor starts)."""
        entry = self._entry(key, actor=False)
        return entry.cell if isinstance(entry, LiveEntry) else entry

    def live_cell(self, key: MemoryKey) -> StateCell | None:
        """The state cell of `key` if it is live or cached, else None (never reads the log: loop-safe)."""
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return self.idle.get(key)
            self._live.move_to_end(key)
            return entry.cell

    def activity(self, key: MemoryKey) -> SessionActivity | None:
        """What the live session `key` is doing now; None when it is not live (never activates)."""
        with self._lock:
            entry = self._live.get(key)
        if entry is None:
            return None
        cell = entry.cell
        return SessionActivity(
            summarizing=cell.in_flight, flushes_waiting=cell.waiters, busy=is_busy(entry.ref)
        )

    def is_live(self, key: MemoryKey) -> bool:
        with self._lock:
            return key in self._live

    def is_cached(self, key: MemoryKey) -> bool:
        """Whether `key`'s cell is in the idle cache (its actor left, its state kept)."""
        with self._lock:
            return key in self.idle

    def cached(self) -> tuple[int, int]:
        """(sessions in the idle cache, the bytes they are estimated to hold)."""
        with self._lock:
            return len(self.idle), self.idle.bytes

    def count(self) -> int:
        with self._lock:
            return len(self._live)

    def health_counts(self) -> dict[str, int]:
        """How many live sessions are in each health state (``ok``, ``degraded``...), by the value's name."""
        with self._lock:
            cells = [entry.cell for entry in self._live.values()]
        counts: dict[str, int] = {}
        for cell in cells:
            name = cell.state.health.value
            counts[name] = counts.get(name, 0) + 1
        return counts

    # Activation and passivation -----------------------------------------------------------

    def _actor(self, key: MemoryKey) -> LiveEntry:
        entry = self._entry(key, actor=True)
        assert isinstance(entry, LiveEntry)
        return entry

    def _entry(self, key: MemoryKey, *, actor: bool) -> LiveEntry | StateCell:
        """`key`'s live entry; without `actor`, its cached cell will do (loaded from the log if need be)."""
        while True:
            evicted: list[LiveEntry] = []
            with self._lock:
                entry = self._live.get(key)
                if entry is not None:
                    self._live.move_to_end(key)
                    return entry
                if self.closed:
                    raise SessionClosed("the memory system is closed")
                if not actor:
                    cell = self.idle.get(key)
                    if cell is not None:
                        return cell
                started = self._from_idle(key) if actor else None
                if started is None:
                    key_lock = self._activation_locks.setdefault(key, threading.Lock())
            if started is not None:
                entry, evicted = started
                self._stop_evicted(evicted)
                return entry
            with key_lock:
                with self._lock:
                    entry = self._live.get(key)
                    if entry is not None:
                        return entry
                    if self._activation_locks.get(key) is not key_lock:
                        # An activation retired this lock while we waited for it: another thread
                        # may hold the current one, so take that, or two actors would start.
                        continue
                    previous = self._stopping.get(key)
                if previous is not None and not previous.actor_stopped.wait(self.timeout):
                    _log.warning("session %s: the previous actor did not stop within %ss", key, self.timeout)
                return self._activate(key, key_lock, previous, actor=actor)

    def _from_idle(self, key: MemoryKey) -> tuple[LiveEntry, list[LiveEntry]] | None:
        """Under the lock: `key`'s actor started from its cached cell, if it is cached and nobody
        is activating it or waiting for its previous actor; with the entries evicted to make room."""
        if key in self._stopping or key in self._activation_locks:
            return None
        cell = self.idle.pop(key)
        if cell is None:
            return None
        self.metrics.count("idle_cache_hits")
        return self._admit(key, cell)

    def _activate(
        self,
        key: MemoryKey,
        key_lock: threading.Lock,
        previous: pykka.ActorRef[SessionActor] | None,
        *,
        actor: bool,
    ) -> LiveEntry | StateCell:
        """Start `key`'s actor (or, without `actor`, cache its cell) from the idle cache, else from its
        snapshot and the log; evict past the bound. Under `key_lock`, the previous actor stopped."""
        while True:
            with self._lock:
                if previous is not None and self._stopping.get(key) is previous:
                    del self._stopping[key]
                cell = self.idle.pop(key) if actor else self.idle.get(key)
                forgets = self.forgets
            if cell is None:
                try:
                    state, report = self.storage.load(key)
                except BaseException:
                    with self._lock:
                        if self._activation_locks.get(key) is key_lock:
                            del self._activation_locks[key]
                    raise
                if report.poison:
                    self.metrics.count("poison_events", len(report.poison))
                self.metrics.count("idle_cache_misses")
                cell = StateCell(state, self.clock.now())
            elif actor:
                self.metrics.count("idle_cache_hits")
            measured = None if actor else measure(cell)  # counted here, not under the lock
            with self._lock:
                if self.forgets != forgets and self.idle.get(key) is not cell:
                    continue  # an erasure was seen while the log was read: read it again
                self._activation_locks.pop(key, None)
                if self.closed:
                    raise SessionClosed("the memory system is closed")
                if not actor:
                    self.idle.put(key, cell, measured)
                    return cell
                entry, evicted = self._admit(key, cell)
            self._stop_evicted(evicted)
            return entry

    def _admit(self, key: MemoryKey, cell: StateCell) -> tuple[LiveEntry, list[LiveEntry]]:
        """Under the lock: start `key`'s actor on `cell` and make it live; returns it with the entries
        evicted past the bound (their cells cached; `_stop_evicted` stops their actors)."""
        cell.last_used = self.clock.now()
        ref = SessionActor.start(self, key, cell)
        entry = LiveEntry(key, ref, cell)
        self._live[key] = entry
        if next_due_at(cell.state) is not None:
            ref.tell(Wake())  # summary work resumes (timers and replies can find the actor now)
        self.metrics.count("activations")
        evicted: list[LiveEntry] = []
        # Past the bound, the least recently used session of the tenant holding the most live ones
        # (`TenantLru`): a tenant touching many sessions evicts its own, never another tenant's few.
        # Never `key`, nor a session whose summary or flush is under way: passivating it would throw
        # the work away and wake it again at once (sessions then evict each other without end). The
        # bound gives way until the work is done.
        for _ in range(len(self._live) - self.max_live_sessions):
            found = self._live.oldest_of_heaviest(lambda k, e: k != key and not e.cell.busy())
            if found is None:
                break
            self._retire(*found, keep=True)
            evicted.append(found[1])
        return entry, evicted

    def close(self) -> None:
        """Stop every session actor (after its queued messages), then the dispatcher's threads."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            entries = list(self._live.values())
            self._live.clear()
            self.idle.clear()
            self._sweep_timer.cancel()
        for entry in entries:
            try:
                entry.ref.stop(block=True, timeout=self.timeout)
            except (pykka.ActorDeadError, pykka.Timeout):
                _log.warning("a session actor did not stop within %ss", self.timeout)
        self.dispatcher.close(self.timeout)


def _fail(message: Message, error: Exception) -> None:
    reply = getattr(message, "reply", None)
    if reply is not None and not reply.done():
        reply.set_exception(error)
