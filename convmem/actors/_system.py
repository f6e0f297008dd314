"""`MemorySystem`: short-term memory for many sessions, the runtime's public face.

It checks its settings, builds the runtime's parts and hands out session
handles; erasure, forks and closing are its own. The parts:

- `SessionStorage` (`_storage`): the log and the snapshot store;
- `ServiceRegistry` (`_services`): what each session runs with, and the
  summarizer pool;
- `Callbacks` (`_callbacks`): the user's callbacks, off the write path;
- `LiveSessions` (`_live`): the live session actors, their activation,
  eviction and idle sweep, on a dispatcher's threads;
- `RetentionSweeper` (`_retention`): with `retention` policies, a sweep every
  `sweep_every` seconds of the system's clock.
- `Eraser` (`_eraser`): erasures, recorded in the `ErasureJournal` first and
  carried out step by step; a system that starts finishes the pending ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Literal, NamedTuple, Unpack

import msgspec

from convmem.actors._bounds import (
    MAX_ACTOR_THREADS,
    MAX_CACHE_BYTES,
    MAX_LIVE_SESSIONS,
    MAX_QUEUED,
    MAX_SNAPSHOT_EVERY,
    MAX_TIMEOUT_SECONDS,
    check_count,
    check_seconds,
    check_timeout,
)
from convmem.actors._callbacks import Callbacks, callbacks_of
from convmem.actors._clock import SystemClock
from convmem.actors._eraser import Erased, Eraser
from convmem.actors._erasure import ErasureNotice, ErasureWatch, KeyShredder
from convmem.actors._fork import Forked, fork_session
from convmem.actors._handles import AsyncSessionHandle, SessionHandle
from convmem.actors._idle import DEFAULT_IDLE_CACHE_BYTES
from convmem.actors._journal import (
    ErasureRecord,
    ErasureRequest,
    JournaledLog,
    find_erasure,
)
from convmem.actors._live import LiveSessions, SessionActivity
from convmem.actors._load import LoadReport
from convmem.actors._metrics import Metrics
from convmem.actors._pool import SummarizerPool
from convmem.actors._ports import Clock, EventLog, LoopEventLog
from convmem.actors._repair import RepairPlan, repair_session
from convmem.actors._restore import Restored, restore_lost
from convmem.actors._retention import RetentionSweeper, sweep_retention
from convmem.actors._services import ServiceRegistry, SessionServices
from convmem.actors._storage import SessionStorage
from convmem.actors._system_settings import SystemOptions
from convmem.errors import ConvmemError, InvalidConfig, InvalidInput, SessionClosed, UnknownSetting
from convmem.events import MemoryKey, RetentionPolicies, ShortTermMemoryConfig
from convmem.projections import RetentionReport, SessionState, TokenEstimator, default_token_estimator

__all__ = [
    "MAX_ACTOR_THREADS",
    "MAX_LIVE_SESSIONS",
    "MAX_TIMEOUT_SECONDS",
    "Erased",
    "MemorySystem",
    "check_timeout",
]

_log = logging.getLogger("convmem.system")


class _Limits(NamedTuple):
    """The numeric settings, their defaults filled in (`SystemSettings` documents each)."""

    max_live_sessions: int
    idle_seconds: float
    idle_cache_bytes: int
    snapshot_every: int
    actor_threads: int
    on_poison: Literal["skip", "stop"]
    timeout: float


def _checked(options: SystemOptions) -> _Limits:
    """The settings' limits, each given one in range (`_bounds`); an unknown setting is refused."""
    unknown = options.keys() - SystemOptions.__optional_keys__
    if unknown:
        raise UnknownSetting(min(unknown), "is not a MemorySystem setting (SystemOptions lists them)")
    limits = _Limits(
        max_live_sessions=check_count(
            "max_live_sessions", options.get("max_live_sessions", 256), most=MAX_LIVE_SESSIONS
        ),
        idle_seconds=check_seconds("idle_seconds", options.get("idle_seconds", 300.0)),
        idle_cache_bytes=check_count(
            "idle_cache_bytes",
            options.get("idle_cache_bytes", DEFAULT_IDLE_CACHE_BYTES),
            least=0,
            most=MAX_CACHE_BYTES,
        ),
        snapshot_every=check_count(
            "snapshot_every", options.get("snapshot_every", 50), most=MAX_SNAPSHOT_EVERY
        ),
        actor_threads=check_count("actor_threads", options.get("actor_threads", 64), most=MAX_ACTOR_THREADS),
        on_poison=options.get("on_poison", "skip"),
        timeout=check_seconds("timeout", options.get("timeout", 30.0)),  # past a day a wait overflows
    )
    check_count("summarizer_workers", options.get("summarizer_workers", 4), most=MAX_ACTOR_THREADS)
    check_count("summarizer_queue", options.get("summarizer_queue", 1000), most=MAX_QUEUED)
    if (abandoned := options.get("summarizer_abandoned")) is not None:  # each one a thread
        check_count("summarizer_abandoned", abandoned, least=0, most=MAX_ACTOR_THREADS)
    if limits.on_poison not in ("skip", "stop"):
        raise InvalidConfig("on_poison", f"must be 'skip' or 'stop', got {limits.on_poison!r}")
    if (summarizer := options.get("summarizer")) is not None and not callable(summarizer):
        raise InvalidConfig("summarizer", f"must be callable, got {type(summarizer).__name__}")
    return limits


_Config = ShortTermMemoryConfig | None
_Services = SessionServices | None


class MemorySystem:
    """Short-term memory for many sessions, each a fold over its events in `log`."""

    def __init__(
        self, config: ShortTermMemoryConfig | None = None, *, log: EventLog, **options: Unpack[SystemOptions]
    ) -> None:
        """A system on `log`; `options` are its settings (`SystemOptions`, each with its default)."""
        limits = _checked(options)
        token_counter, token_estimator = options.get("token_counter"), options.get("token_estimator")
        self.config = _with_counter(config if config is not None else ShortTermMemoryConfig(), token_counter)
        if callable(token_counter):
            if token_estimator is not None:
                raise InvalidConfig("token_counter", "give token_counter or token_estimator, not both")
            token_estimator = token_counter
        checked_retention = _policies(options.get("retention"))
        defaults = callbacks_of(
            options.get("on_turn_added"), options.get("on_summary_updated"), options.get("on_health_changed")
        )
        snapshots, journal, metrics = options.get("snapshots"), options.get("journal"), options.get("metrics")
        timeout = limits.timeout
        self.log = log
        self.snapshots = snapshots
        self.estimator: TokenEstimator = token_estimator or default_token_estimator
        self.timeout = timeout
        self.metrics = Metrics(sink=metrics)
        clock = options.get("clock")
        self._own_clock = clock is None
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._services = ServiceRegistry(
            self.config,
            self.estimator,
            options.get("summarizer"),
            workers=options.get("summarizer_workers", 4),
            queue_limit=options.get("summarizer_queue", 1000),
            max_abandoned=options.get("summarizer_abandoned"),
            loop=_running_loop() if (loop := options.get("summarizer_loop")) is None else loop,
        )
        if journal is None and isinstance(log, JournaledLog):
            journal = log.erasure_journal()
        self.journal = journal
        """Where erasures are recorded before anything is deleted (the log's own when not given)."""
        self._storage = SessionStorage(
            log, snapshots, on_poison=limits.on_poison, snapshot_every=limits.snapshot_every, journal=journal
        )
        self._callbacks = Callbacks(defaults, self.metrics, self._services.callbacks_for)
        self._sessions = LiveSessions(
            storage=self._storage,
            services=self._services,
            callbacks=self._callbacks,
            clock=self.clock,
            metrics=self.metrics,
            max_live_sessions=limits.max_live_sessions,
            idle_seconds=limits.idle_seconds,
            actor_threads=limits.actor_threads,
            timeout=timeout,
            idle_cache_bytes=limits.idle_cache_bytes,
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._on_close = options.get("on_close")
        # Erasures made by other processes (or other systems on this log) reach us as notices;
        # the live sessions they name are dropped on this one thread, off the log's loop.
        self._erasures = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="convmem-erasure")
        self._unwatch = log.watch_erasures(self._on_erasure) if isinstance(log, ErasureWatch) else None
        self._eraser = (
            Eraser(
                journal=journal,
                log=log,
                snapshots=snapshots,
                clock=self.clock,
                drop=self.forget,
                exports=options.get("exports"),
                hook=options.get("erasure_hook"),
            )
            if journal is not None
            else None
        )
        self.unfinished_erasures: ConvmemError | None = None
        """Why the erasures left pending could not be finished as this system started (None: they
        were, or there were none); they stay pending (`SessionDamaged`: a copy it could not remove)."""
        if self._eraser is not None:
            self._finish_on_start()
        self.retention = checked_retention
        """The retention policies this system sweeps with (None: it keeps everything, never sweeps)."""
        self.retention_sweeper: RetentionSweeper | None = None
        if self.retention is not None and not self.retention.empty:
            policies = self.retention
            self.retention_sweeper = RetentionSweeper(
                policies, self.clock, lambda stop: self.sweep_retention(policies=policies, stop=stop)
            )
            self.retention_sweeper.start()
        if metrics is not None:
            metrics.watch(self)

    def _finish_on_start(self) -> None:
        """Finish the erasures a crashed process left pending: here, or beside the log's own loop
        when the system is made on it (a blocking call there would deadlock)."""
        if self._storage.on_loop_thread():
            threading.Thread(target=self._finish_logged, name="convmem-erasure-resume", daemon=True).start()
        else:
            self._finish_logged()

    def _finish_logged(self) -> None:
        try:
            finished = self.finish_erasures()
        except ConvmemError as exc:
            self.unfinished_erasures = exc
            _log.warning("pending erasures not finished at start (they stay pending)", exc_info=True)
            return
        if finished:
            _log.warning("finished %d erasure(s) left pending by an earlier process", len(finished))

    @property
    def loop_log(self) -> LoopEventLog | None:
        """The log, when its appends run on a loop of its own (`LoopEventLog`); else None."""
        return self._storage.loop_log

    @property
    def pool(self) -> SummarizerPool | None:
        """The summarizer pool: started with the system when it has a summarizer, else when a
        session with a summarizer of its own first needs one (`SessionServices`)."""
        return self._services.pool

    # Sessions ---------------------------------------------------------------------------

    def session(self, key: MemoryKey, *, config: _Config = None, services: _Services = None) -> SessionHandle:
        """A blocking handle on the session `key` (for threads).

        `config` applies when the session starts; a started session keeps the
        configuration its `SessionStarted` event recorded. `services` gives the
        session its own summarizer, estimator, callbacks (and starting config)
        for as long as the caller keeps that object; the latest registration wins.
        """
        self._register(key, config, services)
        return SessionHandle(self._sessions, key)

    def async_session(
        self, key: MemoryKey, *, config: _Config = None, services: _Services = None
    ) -> AsyncSessionHandle:
        """An asyncio handle on the session `key` (awaitables never block the loop); see `session`."""
        return self.session(key, config=config, services=services).aio

    def _register(
        self, key: MemoryKey, config: ShortTermMemoryConfig | None, services: SessionServices | None
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        if self._closed:
            raise SessionClosed("the memory system is closed")
        self._services.register(key, config, services)

    def live_sessions(self) -> int:
        """How many sessions have a live actor now."""
        return self._sessions.count()

    def live_health(self) -> dict[str, int]:
        """How many live sessions are in each health state, by state name (``ok``, ``degraded``...)."""
        return self._sessions.health_counts()

    def is_live(self, key: MemoryKey) -> bool:
        """Whether `key` has a live actor now."""
        return self._sessions.is_live(key)

    def is_cached(self, key: MemoryKey) -> bool:
        """Whether `key` is in the idle cache: no actor, its state and view kept for reads and writes."""
        return self._sessions.is_cached(key)

    def cached_sessions(self) -> tuple[int, int]:
        """(sessions in the idle cache, the bytes they are estimated to hold; at most `idle_cache_bytes`)."""
        return self._sessions.cached()

    def activity(self, key: MemoryKey) -> SessionActivity | None:
        """What the live session `key` is doing now, or None when it is not live.

        For tests, health checks and operators: it reads a moment's facts
        (a summary under way, flushes waiting, a message running or queued)
        and never waits or activates the session.
        """
        return self._sessions.activity(key)

    def passivate(self, key: MemoryKey) -> bool:
        """Stop the session's actor now and drop its cached state: its next call reloads it from the log.

        True when the session was live or cached.
        """
        return self._sessions.passivate(key)

    def load(self, key: MemoryKey) -> tuple[SessionState, LoadReport]:
        """Rebuild `key` from its snapshot and the log (what activation does)."""
        return self._storage.load(key)

    # Erasure and forks --------------------------------------------------------------------

    def erase(self, key: MemoryKey, *, by: str = "", if_held: bool = False) -> Erased:
        """Remove a session's events and snapshot from the store (erasure of personal data).

        The erasure is recorded in the journal first (`by`: who asked, kept
        in the receipt), then carried out step by step (`convmem.actors._eraser`);
        if this process dies meanwhile, the next system to start on the
        journal, or ``convmem erase --resume``, finishes it. When it returns,
        reads through this system see nothing of the session, and the log has
        told every other process using it (see `forget`). A stale writer
        elsewhere conflicts instead of writing the erased history back; the
        session may start afresh.

        With `if_held`, an erasure that would find nothing to remove (`Eraser.finds_nothing`, and
        no live or cached copy here) is answered as one would be and recorded nowhere: every
        receipt is kept for good, so the service's tenants, who may name any session, could
        otherwise grow the journal every tenant shares without end.
        """
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        return self._erase(key.tenant_id, key.user_id, key.session_id, by, if_held=if_held)

    def erase_user(self, tenant_id: str, user_id: str, *, by: str = "", if_held: bool = False) -> Erased:
        """`erase` every session of one user: those with events, a snapshot or a part of one."""
        MemoryKey(tenant_id, user_id, "-")  # the ids are checked as a key's would be
        return self._erase(tenant_id, user_id, None, by, if_held=if_held)

    def shred_user(self, tenant_id: str, user_id: str) -> list[str]:
        """Delete the user's data keys when the log encrypts per user (`KeyShredder`); the ids deleted.

        From then on no copy of their encrypted events or snapshots can be
        read (replicas, backups, mirrors, old snapshots): each reads as erased.
        Erasing one session does not shred: the key is the user's. A user's
        erasure does it as its step right after the record (``shred_key``).
        """
        if isinstance(self.log, KeyShredder):
            return self.log.shred_user(tenant_id, user_id)
        return []

    def _erase(
        self, tenant_id: str, user_id: str, session_id: str | None, by: str, *, if_held: bool = False
    ) -> Erased:
        eraser = self._need_eraser()
        request = ErasureRequest.of(tenant_id, user_id, session_id, by=by, at=self.clock.now())
        key = request.key
        if (
            if_held
            and (key is None or not (self.is_live(key) or self.is_cached(key)))
            and eraser.finds_nothing(request)
        ):
            return Erased(events_purged=0, sessions=0 if key is None else 1)  # what its steps would say
        return eraser.erase(request)

    def finish_erasures(self) -> list[Erased]:
        """Finish every erasure left pending in the journal (by a process that died), oldest first."""
        return self._need_eraser().finish_pending()

    def pending_erasures(self) -> list[ErasureRequest]:
        """The erasures recorded and not finished yet (empty without a journal)."""
        return self.journal.pending() if self.journal is not None else []

    def erasure_record(self, key: MemoryKey) -> ErasureRecord | None:
        """The journal's record of an erasure that covers `key` (pending or done), or None.

        Nothing is deleted as erased unless this answers with a record.
        """
        return find_erasure(self.journal, key)

    def restore_lost(self, key: MemoryKey) -> Restored:
        """Write the kept snapshot of a lost session (`SessionLost`) back into the log as events.

        See `convmem.actors._restore`: a `SessionRestored` records it; the
        snapshot is deleted once the log holds its content.
        """
        self.passivate(key)
        return restore_lost(self.log, self.snapshots, key, now=self.clock.now())

    def _need_eraser(self) -> Eraser:
        if self._eraser is None:
            raise InvalidConfig(
                "journal",
                "erasure needs an erasure journal, recorded before anything is deleted: this log "
                "keeps none; pass journal=",
            )
        if self._closed:
            raise SessionClosed("the memory system is closed")
        return self._eraser

    def sweep_retention(
        self,
        *,
        dry_run: bool = False,
        policies: RetentionPolicies | None = None,
        tenant_id: str | None = None,
        stop: threading.Event | None = None,
    ) -> RetentionReport:
        """Apply the retention policies (this system's, or `policies`) now, by the system's clock.

        Idle sessions are erased through `erase`; histories over a cap are
        compacted (see `convmem.actors._retention`). A dry run writes nothing.
        """
        chosen = policies if policies is not None else self.retention
        if chosen is None:
            raise InvalidConfig("retention", "this system has no retention policies; pass policies=")
        if self._closed:
            raise SessionClosed("the memory system is closed")
        return sweep_retention(
            self.log,
            chosen,
            now=self.clock.now(),
            dry_run=dry_run,
            snapshots=self.snapshots,
            erase=lambda key: self.erase(key, by=_RETENTION_BY(key)).events_purged,
            passivate=self.passivate,
            tenant_id=tenant_id,
            stop=stop,
        )

    def repair(
        self, key: MemoryKey, *, method: Literal["auto", "snapshot", "cut"] = "auto", reason: str = ""
    ) -> RepairPlan:
        """Repair a damaged session (see `convmem.actors.repair_session`); a sound one is left as it is.

        The session's live actor and cached state are dropped first, so its next call loads the
        repaired state.
        """
        self.passivate(key)
        plan = repair_session(
            self.log,
            self.snapshots,
            key,
            at=self.clock.now(),
            method=method,
            reason=reason or "repaired by an operator",
        )
        self.passivate(key)
        return plan

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
        dropped = self._sessions.forget(matches)
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

    # Closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """`close` from a coroutine: on a worker thread, as stopping the sessions waits for them."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop every session actor (after its queued messages), the pool and the timers."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.retention_sweeper is not None:
            self.retention_sweeper.close()
        if self._unwatch is not None:
            self._unwatch()
        self._erasures.shutdown(wait=True)
        self._sessions.close()
        self._services.close()
        self._callbacks.close()
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


def _RETENTION_BY(key: MemoryKey) -> str:
    """Who asks for a retention erasure, in its receipt (never the erased user's or session's id)."""
    return "retention" if "retention" not in (key.user_id, key.session_id) else "retention sweep"


def _policies(retention: RetentionPolicies | Mapping[str, object] | None) -> RetentionPolicies | None:
    """The policies given, checked: a mapping is parsed (errors name the bad key)."""
    if retention is None or isinstance(retention, RetentionPolicies):
        return retention
    if isinstance(retention, Mapping):
        return RetentionPolicies.parse(retention)
    raise InvalidConfig(
        "retention", f"must be RetentionPolicies or a mapping of them, got {type(retention).__name__}"
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop of the caller making the system, if it is on one (coroutine summarizers run there)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _with_counter(config: ShortTermMemoryConfig, token_counter: object) -> ShortTermMemoryConfig:
    """`config` counting with `token_counter` when that is an encoding name (recorded with each session)."""
    if token_counter is None or callable(token_counter):
        return config
    if not isinstance(token_counter, str):
        raise InvalidConfig(
            "token_counter",
            f"must be a callable str -> int or a tiktoken encoding name, got {type(token_counter).__name__}",
        )
    if config.token_counter not in (None, token_counter):
        raise InvalidConfig(
            "token_counter",
            f"{token_counter!r} differs from the config's token_counter={config.token_counter!r}",
        )
    return msgspec.structs.replace(config, token_counter=token_counter)
