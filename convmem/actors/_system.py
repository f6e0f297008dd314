"""`MemorySystem`: the registry of live session actors, the summarizer pool, the clock.

Sessions are virtual. A session activates on its first message (snapshot plus
the log's tail) and passivates when idle for `idle_seconds` or when the live
set grows past `max_live_sessions` (least recently used first). Every message
to a session goes through the registry under one lock, and a session leaves
the registry before its actor is told to stop, so nothing is sent to a
stopping actor; whatever was already queued is handed back and delivered to
the next activation. A passivated session costs no memory and loses nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import msgspec
import pykka

from convmem.actors._clock import SystemClock
from convmem.actors._dispatch import Dispatcher, PooledActor, claim
from convmem.actors._erasure import ErasureNotice, ErasureWatch
from convmem.actors._fork import Forked, fork_session
from convmem.actors._handles import AsyncSessionHandle, SessionHandle
from convmem.actors._load import LoadReport, load_state
from convmem.actors._metrics import Metrics
from convmem.actors._pool import SummarizerPool
from convmem.actors._ports import Clock, EventLog, LoopEventLog, Settle, SnapshotStore, Summarizer, Timer
from convmem.actors._services import Callback, SessionServices
from convmem.actors._session import Flush, Message, SessionActor, StateCell, Wake
from convmem.actors._write import Write
from convmem.errors import ConvmemError, InvalidConfig, InvalidInput, SessionClosed
from convmem.events import (
    AnyEvent,
    HealthChanged,
    MemoryKey,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnAdded,
)
from convmem.projections import (
    SessionState,
    SummaryRequest,
    TokenEstimator,
    default_token_estimator,
    next_due_at,
)

__all__ = ["Erased", "MemorySystem"]

_log = logging.getLogger("convmem.system")


class Erased(msgspec.Struct, frozen=True, kw_only=True):
    """What an erasure removed: `events_purged` events from `sessions` sessions.

    The service API's ``erase`` reply and ``convmem erase --json`` use the same two names.
    """

    events_purged: int
    sessions: int


class _Live:
    __slots__ = ("cell", "ref")

    def __init__(self, ref: pykka.ActorRef[SessionActor], cell: StateCell) -> None:
        self.ref = ref
        self.cell = cell


class MemorySystem:
    """Short-term memory for many sessions, each a fold over its events in `log`."""

    def __init__(
        self,
        config: ShortTermMemoryConfig | None = None,
        *,
        log: EventLog,
        snapshots: SnapshotStore | None = None,
        summarizer: Summarizer | None = None,
        clock: Clock | None = None,
        token_estimator: TokenEstimator | None = None,
        on_turn_added: Callable[..., Any] | None = None,
        on_summary_updated: Callable[..., Any] | None = None,
        on_health_changed: Callable[..., Any] | None = None,
        max_live_sessions: int = 256,
        idle_seconds: float = 300.0,
        snapshot_every: int = 50,
        summarizer_workers: int = 4,
        summarizer_queue: int = 1000,
        actor_threads: int = 64,
        on_poison: Literal["skip", "stop"] = "skip",
        timeout: float = 30.0,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        self.config = config if config is not None else ShortTermMemoryConfig()
        if max_live_sessions < 1:
            raise InvalidConfig("max_live_sessions", f"must be >= 1, got {max_live_sessions}")
        if idle_seconds <= 0:
            raise InvalidConfig("idle_seconds", f"must be > 0, got {idle_seconds}")
        if snapshot_every < 1:
            raise InvalidConfig("snapshot_every", f"must be >= 1, got {snapshot_every}")
        if actor_threads < 1:
            raise InvalidConfig("actor_threads", f"must be >= 1, got {actor_threads}")
        if on_poison not in ("skip", "stop"):
            raise InvalidConfig("on_poison", f"must be 'skip' or 'stop', got {on_poison!r}")
        if summarizer is not None and not callable(summarizer):
            raise InvalidConfig("summarizer", f"must be callable, got {type(summarizer).__name__}")
        self._check_config(self.config, summarizer)
        self.log = log
        self.loop_log: LoopEventLog | None = log if isinstance(log, LoopEventLog) else None
        """The log, when its appends run on a loop of its own (`LoopEventLog`)."""
        self.start_append = _appender(log)
        self.snapshots = snapshots
        self._own_clock = clock is None
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.estimator: TokenEstimator = token_estimator or default_token_estimator
        self.snapshot_every = snapshot_every
        self.max_live_sessions = max_live_sessions
        self.idle_seconds = idle_seconds
        self.on_poison: Literal["skip", "stop"] = on_poison
        self.timeout = timeout
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(actor_threads, name="convmem-session")
        """The threads the session actors run on (a session holds one only while it handles a message)."""
        self._summarizer = summarizer
        self._pool_settings = (summarizer_workers, summarizer_queue)
        self.pool: SummarizerPool | None = None
        """The summarizer pool: started with the system when it has a summarizer, else when a
        session with a summarizer of its own first needs one (`SessionServices`)."""
        if summarizer is not None:
            self.pool = self._new_pool()
        self._callbacks = {
            "turn": Callback.wrap(on_turn_added, "on_turn_added"),
            "summary": Callback.wrap(on_summary_updated, "on_summary_updated"),
            "health": Callback.wrap(on_health_changed, "on_health_changed"),
        }
        self._callback_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="convmem-callback"
        )
        self._lock = threading.RLock()
        self._live: OrderedDict[MemoryKey, _Live] = OrderedDict()
        self._configs: dict[MemoryKey, ShortTermMemoryConfig] = {}
        self._services: weakref.WeakValueDictionary[MemoryKey, SessionServices] = (
            weakref.WeakValueDictionary()
        )
        self._activation_locks: dict[MemoryKey, threading.Lock] = {}
        # Actors told to stop that may still be handling their last messages: a new
        # activation of the key waits for them, or it would load the log too early.
        self._stopping: dict[MemoryKey, pykka.ActorRef[SessionActor]] = {}
        self._closed = False
        self._on_close = on_close
        self._sweep_timer: Timer | None = None
        self._schedule_sweep()
        # Erasures made by other processes (or other systems on this log) reach us as notices;
        # the live sessions they name are dropped on this one thread, off the log's loop.
        self._erasures = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="convmem-erasure")
        self._unwatch = log.watch_erasures(self._on_erasure) if isinstance(log, ErasureWatch) else None

    @staticmethod
    def _check_config(config: ShortTermMemoryConfig, summarizer: Summarizer | None) -> None:
        if config.summarizes and summarizer is None:
            raise InvalidConfig(
                "summarizer",
                "strategy 'rolling_summary' needs a summarizer "
                "(e.g. convmem.adapters.ExtractiveSummarizer())",
            )

    # Public API -------------------------------------------------------------------------

    def session(
        self,
        key: MemoryKey,
        *,
        config: ShortTermMemoryConfig | None = None,
        services: SessionServices | None = None,
    ) -> SessionHandle:
        """A blocking handle on the session `key` (for threads).

        `config` applies when the session starts; a started session keeps the
        configuration its `SessionStarted` event recorded. `services` gives the
        session its own summarizer, estimator, callbacks (and starting config)
        for as long as the caller keeps that object; the latest registration wins.
        """
        self._register(key, config, services)
        return SessionHandle(self, key)

    def async_session(
        self,
        key: MemoryKey,
        *,
        config: ShortTermMemoryConfig | None = None,
        services: SessionServices | None = None,
    ) -> AsyncSessionHandle:
        """An asyncio handle on the session `key` (awaitables never block the loop)."""
        self._register(key, config, services)
        return AsyncSessionHandle(self, key)

    def live_sessions(self) -> int:
        """How many sessions have a live actor now."""
        with self._lock:
            return len(self._live)

    def is_live(self, key: MemoryKey) -> bool:
        """Whether `key` has a live actor now."""
        with self._lock:
            return key in self._live

    def passivate(self, key: MemoryKey) -> bool:
        """Stop the session's actor now (it reactivates on its next message)."""
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is None:
                return False
            self._stopping[key] = entry.ref
        entry.ref.stop(block=True, timeout=self.timeout)
        return True

    def forget_stopped(self, key: MemoryKey, ref: pykka.ActorRef[SessionActor]) -> None:
        """A stopped actor's entry goes, so a passivated session holds no memory.

        An actor that stopped without being passivated (its caller's thread was
        interrupted while running it) leaves the live set too: the session's
        next message activates it afresh from the log.
        """
        with self._lock:
            if self._stopping.get(key) is ref:
                del self._stopping[key]
            live = self._live.get(key)
            if live is not None and live.ref is ref:
                del self._live[key]

    def erase(self, key: MemoryKey) -> Erased:
        """Remove a session's events and snapshot from the store (erasure of personal data).

        When it returns, reads through this system see nothing of the session,
        and the log has told every other process using it (see `forget`).
        A stale writer elsewhere conflicts instead of writing the erased
        history back; the session may start afresh.
        """
        return self._erase([key], lambda at: self.log.erase(key, at=at))

    def erase_user(self, tenant_id: str, user_id: str) -> Erased:
        """`erase` every session of one user."""
        keys = self.log.keys(tenant_id=tenant_id, user_id=user_id)
        return self._erase(keys, lambda at: self.log.erase_user(tenant_id, user_id, at=at))

    def _erase(self, keys: list[MemoryKey], purge: Callable[[float], int]) -> Erased:
        for key in keys:
            self.passivate(key)  # no live actor keeps (or snapshots) what is being erased
        events = purge(self.clock.now())
        for key in keys:
            self.passivate(key)  # drop any activation that raced in before the erasure
            if self.snapshots is not None:
                self.snapshots.delete(key)  # after the events: a stale save has nothing to follow
        return Erased(events_purged=events, sessions=len(keys))

    def fork(self, key: MemoryKey, *, to: MemoryKey, at: int | datetime | None = None) -> Forked:
        """Start session `to` as `key` was after log position `at` (an int), at a time (a datetime), or now.

        The new session's first event records where it came from; its state
        equals the source's at that point (see `convmem.actors._fork`).
        `to` must have no events yet.
        """
        self.passivate(to)
        forked, _ = fork_session(self.log, key, to, at)
        return forked

    def forget(self, matches: Callable[[MemoryKey], bool]) -> list[MemoryKey]:
        """Drop at once every live session whose key `matches`, and its snapshot.

        For erasures made elsewhere: the session's state leaves this process's
        memory now, not at its next write or passivation. An actor that is
        stopping is waited for, so a snapshot it was saving is deleted after
        it. A later message reactivates the session from the log. Returns the
        keys dropped.
        """
        with self._lock:
            stopping = [(k, ref) for k, ref in self._stopping.items() if matches(k)]
            live = [k for k in self._live if matches(k)]
        for _key, ref in stopping:
            ref.actor_stopped.wait(self.timeout)
        dropped = sorted({*live, *(k for k, _ in stopping)}, key=MemoryKey.composite)
        for key in live:
            self.passivate(key)
        if self.snapshots is not None:
            for key in dropped:
                try:
                    self.snapshots.delete(key)
                except ConvmemError:
                    _log.warning("the snapshot of erased session %s was not deleted", key, exc_info=True)
        if dropped:
            self.metrics.count("erasures_seen", len(dropped))
        return dropped

    def _on_erasure(self, notice: ErasureNotice | None) -> None:
        """The log's notice (on its thread): drop the matching sessions on ours; None drops them all."""
        match = (lambda _key: True) if notice is None else notice.matches
        with contextlib.suppress(RuntimeError):  # the pool shuts down with the system
            self._erasures.submit(self._forget_logged, match)

    def _forget_logged(self, match: Callable[[MemoryKey], bool]) -> None:
        try:
            self.forget(match)
        except Exception:
            _log.exception("dropping erased sessions failed")

    def load(self, key: MemoryKey) -> tuple[SessionState, LoadReport]:
        """Rebuild `key` from its snapshot and the log (what activation does)."""
        return load_state(self.log, self.snapshots, key, on_poison=self.on_poison)

    async def aclose(self) -> None:
        """`close` from a coroutine: on a worker thread, as stopping the sessions waits for them."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop every session actor (after its queued messages), the pool and the timers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entries = list(self._live.values())
            self._live.clear()
            if self._sweep_timer is not None:
                self._sweep_timer.cancel()
        if self._unwatch is not None:
            self._unwatch()
        self._erasures.shutdown(wait=True)
        for entry in entries:
            try:
                entry.ref.stop(block=True, timeout=self.timeout)
            except (pykka.ActorDeadError, pykka.Timeout):
                _log.warning("a session actor did not stop within %ss", self.timeout)
        with self._lock:
            pool = self.pool
        if pool is not None:
            pool.close()
        self.dispatcher.close(self.timeout)
        self._callback_pool.shutdown(wait=True)
        if self._own_clock and isinstance(self.clock, SystemClock):
            self.clock.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> MemorySystem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    # Runtime internals (used by handles and actors) ------------------------------------

    def _register(
        self, key: MemoryKey, config: ShortTermMemoryConfig | None, services: SessionServices | None = None
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        if self._closed:
            raise SessionClosed("the memory system is closed")
        if services is not None and not isinstance(services, SessionServices):
            raise InvalidInput("services", f"must be SessionServices, got {type(services).__name__}")
        summarizer = self.summarizer_for(key) if services is None else services.summarizer or self._summarizer
        if config is not None:
            self._check_config(config, summarizer)
        if services is not None and services.config is not None:
            self._check_config(services.config, summarizer)
        with self._lock:
            if config is not None:
                self._configs[key] = config
            if services is not None:
                self._services[key] = services

    def services_for(self, key: MemoryKey) -> SessionServices | None:
        """The services registered for `key`, if whoever registered them still holds them."""
        return self._services.get(key)

    def config_for(self, key: MemoryKey) -> ShortTermMemoryConfig:
        """The configuration a new session `key` starts with."""
        services = self._services.get(key)
        if services is not None and services.config is not None:
            return services.config
        with self._lock:
            return self._configs.get(key, self.config)

    def estimator_for(self, key: MemoryKey) -> TokenEstimator:
        """The token estimator of session `key` (its own, else the system's)."""
        services = self._services.get(key)
        if services is not None and services.token_estimator is not None:
            return services.token_estimator
        return self.estimator

    def summarizer_for(self, key: MemoryKey) -> Summarizer | None:
        """The summarizer of session `key` (its own, else the system's)."""
        services = self._services.get(key)
        if services is not None and services.summarizer is not None:
            return services.summarizer
        return self._summarizer

    def submit_summary(
        self, key: MemoryKey, request: SummaryRequest, reply: Callable[[Any], object]
    ) -> str | None:
        """Queue `request` for the session's summarizer; why not, when it could not be queued."""
        summarizer = self.summarizer_for(key)
        if summarizer is None:
            return "no summarizer configured"
        with self._lock:
            if self._closed:
                return "the memory system is closed"
            if self.pool is None:
                self.pool = self._new_pool()
            pool = self.pool
        if not pool.submit(request, reply, summarizer=summarizer):
            return "summarizer queue is full"
        return None

    def _new_pool(self) -> SummarizerPool:
        workers, queue = self._pool_settings
        return SummarizerPool(
            self._summarizer,
            workers=workers,
            queue_limit=queue,
            call_timeout=self.config.health.summarize_timeout_seconds * 2,
        )

    def cell(self, key: MemoryKey) -> StateCell:
        """The live state cell of `key`, activating the session when needed."""
        return self._entry(key).cell

    def live_cell(self, key: MemoryKey) -> StateCell | None:
        """The state cell of `key` if its session is live (never activates: safe on an event loop)."""
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return None
            self._live.move_to_end(key)
            return entry.cell

    def tell(self, key: MemoryKey, message: Message) -> None:
        """Deliver `message` to the session, activating it when needed."""
        self._deliver(key, message, here=False)

    def claim_live(self, key: MemoryKey, message: Write) -> bool:
        """From an event loop: run `message` right here if the session is live and idle, else queue it
        for a live one; False (nothing done) when the session is not live (activating it reads the log).
        """
        with self._lock:
            entry = None if self._closed else self._live.get(key)
            if entry is None:
                return False
            actor = self._hand(entry, message, here=True)
        if actor is not None:
            actor.run_claimed(message, on_loop=True)
        return True

    def call(self, key: MemoryKey, message: Message) -> None:
        """`tell`, but when the session is idle the calling thread handles `message` itself.

        For a caller that is about to wait for the answer anyway: the message
        runs as the actor's next one, in order, and the caller skips two
        thread hand-offs. Never from an event loop (the message may wait for
        the log, whose answers may need that loop).
        """
        actor = self._deliver(key, message, here=True)
        if actor is not None:
            actor.run_claimed(message)

    def _deliver(self, key: MemoryKey, message: Message, *, here: bool) -> PooledActor | None:
        """Queue `message` for the session (activating it), or with `here` claim it when idle."""
        while True:
            if self._closed:
                _fail(message, SessionClosed("the memory system is closed"))
                return None
            entry = self._entry(key)
            with self._lock:
                if self._live.get(key) is entry:
                    return self._hand(entry, message, here=here)

    def _hand(self, entry: _Live, message: Message, *, here: bool) -> PooledActor | None:
        """`entry`'s actor claimed for the caller (with `here`, when idle), else `message` queued.

        Under the lock, with `entry` live.
        """
        entry.cell.last_used = self.clock.now()
        actor = claim(entry.ref) if here else None
        if actor is None:
            entry.ref.tell(message)
        return actor

    def tell_if_live(self, key: MemoryKey, message: Message) -> bool:
        """Deliver `message` only to a live session (timers and summaries of passivated ones lapse)."""
        with self._lock:
            entry = self._live.get(key)
            if entry is None or self._closed:
                return False
            entry.ref.tell(message)
            return True

    def redeliver(self, key: MemoryKey, message: Message) -> None:
        """Messages left in a stopping actor's inbox go to the next activation."""
        if self._closed:
            _fail(message, SessionClosed("the memory system closed before the message was handled"))
            return
        if isinstance(message, Write | Flush) and not self.dispatcher.submit(lambda: self.tell(key, message)):
            _fail(message, SessionClosed("the memory system closed before the message was handled"))

    def _entry(self, key: MemoryKey) -> _Live:
        while True:
            with self._lock:
                entry = self._live.get(key)
                if entry is not None:
                    self._live.move_to_end(key)
                    return entry
                if self._closed:
                    raise SessionClosed("the memory system is closed")
                key_lock = self._activation_locks.setdefault(key, threading.Lock())
            with key_lock:
                with self._lock:
                    entry = self._live.get(key)
                    if entry is not None:
                        return entry
                    if self._activation_locks.get(key) is not key_lock:
                        # An activation retired this lock while we waited for it: another thread
                        # may hold the current one, so take that, or two actors would start.
                        continue
                    previous = self._stopping.pop(key, None)
                if previous is not None and not previous.actor_stopped.wait(self.timeout):
                    _log.warning("session %s: the previous actor did not stop within %ss", key, self.timeout)
                state, report = self.load(key)
                if report.poison:
                    self.metrics.count("poison_events", len(report.poison))
                cell = StateCell(state, self.clock.now())
                ref = SessionActor.start(self, key, cell)
                evicted: list[_Live] = []
                with self._lock:
                    entry = _Live(ref, cell)
                    self._live[key] = entry
                    # Summary work starts only now that replies (tell_if_live) can find the actor.
                    ref.tell(Wake())
                    self._activation_locks.pop(key, None)
                    excess = len(self._live) - self.max_live_sessions
                    if excess > 0:
                        # Least recently used first, but not a session whose summary or flush is
                        # under way: passivating it would throw the work away and wake it again at
                        # once (sessions then evict each other without end). The bound gives way
                        # until the work is done.
                        idle = ((k, e) for k, e in self._live.items() if k != key and not e.cell.busy())
                        for old_key, old in list(itertools.islice(idle, excess)):
                            del self._live[old_key]
                            self._stopping[old_key] = old.ref
                            evicted.append(old)
                self.metrics.count("activations")
                for old in evicted:
                    self.metrics.count("passivations")
                    old.ref.stop(block=False)
                if self._closed:
                    ref.stop(block=False)
                    raise SessionClosed("the memory system is closed")
                return entry

    def _schedule_sweep(self) -> None:
        when = self.clock.now() + self.idle_seconds / 2
        self._sweep_timer = self.clock.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Passivate sessions idle for `idle_seconds` with no summary work due."""
        now = self.clock.now()
        idle: list[_Live] = []
        with self._lock:
            if self._closed:
                return
            for key, entry in list(self._live.items()):
                cell = entry.cell
                if cell.last_used + self.idle_seconds > now or cell.in_flight:
                    continue
                if next_due_at(cell.state) is not None:
                    continue  # keep healing sessions live; the LRU bound still applies
                del self._live[key]
                self._stopping[key] = entry.ref
                idle.append(entry)
            for key, ref in list(self._stopping.items()):
                if not ref.is_alive():
                    del self._stopping[key]
        for entry in idle:
            self.metrics.count("passivations")
            entry.ref.stop(block=False)
        self._schedule_sweep()

    def notify(self, key: MemoryKey, old: SessionState, new: SessionState, events: list[AnyEvent]) -> None:
        """Count the events and fire the callbacks, off the write path."""
        for event in events:
            if isinstance(event, TurnAdded):
                self.metrics.count("turns")
                self._fire("turn", key, event.turn)
            elif isinstance(event, SummaryProduced):
                self.metrics.count("summaries")
                self._fire("summary", key, old.summary, event.summary)
            elif isinstance(event, HealthChanged):
                self.metrics.count(f"health.{event.new.value}")
                self._fire("health", key, event.old, event.new)

    def _fire(self, kind: str, key: MemoryKey, *args: Any) -> None:
        services = self._services.get(key)
        callback = services.callbacks[kind] if services is not None else None
        if callback is None:
            callback = self._callbacks[kind]
        if callback is None or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the pool shuts down with the system
            self._callback_pool.submit(callback.run, key, *args)


def _appender(log: EventLog) -> Callable[[MemoryKey, list[AnyEvent], int, Settle[int]], None]:
    """How a write begins its append on `log`: on the log's loop, or (a plain log) here, settled at once."""
    if isinstance(log, LoopEventLog):
        loop_log = log

        def start(key: MemoryKey, events: list[AnyEvent], expected_seq: int, settle: Settle[int]) -> None:
            loop_log.start_append(key, events, expected_seq=expected_seq, settle=settle)

        return start

    def append(key: MemoryKey, events: list[AnyEvent], expected_seq: int, settle: Settle[int]) -> None:
        try:
            last = log.append(key, events, expected_seq=expected_seq)
        except Exception as exc:
            settle.set_exception(exc)
        else:
            settle.set_result(last)

    return append


def _fail(message: Message, error: Exception) -> None:
    reply = getattr(message, "reply", None)
    if reply is not None and not reply.done():
        reply.set_exception(error)
