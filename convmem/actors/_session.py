"""`SessionActor`: a thin shell around `decide` and `evolve` for one live session.

Write path: decide -> append with the expected last seq -> on acknowledgement
evolve, publish the new immutable state, reply; on a concurrency conflict,
reload from the log and decide again. The state changes only by applying an
acknowledged event, so it always equals a replay of the log.

Readers never queue behind writers: they read the latest published state
from the session's `StateCell` directly.

Every message is a `concurrent.futures.Future`-carrying struct from a closed
set; the actor never lets an exception escape into pykka.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from convmem.actors._dispatch import PooledActor
from convmem.actors._pool import SummaryOutcome
from convmem.actors._ports import LoopEventLog, NotifyingEventLog, Snapshot, Timer
from convmem.errors import ConcurrencyConflict, ConvmemError
from convmem.events import AnyEvent, MemoryHealth, MemoryKey
from convmem.projections import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Command,
    SessionState,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    SummarySucceeded,
    decide,
    encode_state,
    next_due_at,
    replay,
    state_hash,
    summary_due,
)

if TYPE_CHECKING:
    from convmem.actors._system import MemorySystem

__all__ = ["Reply", "SessionActor", "StateCell"]

_log = logging.getLogger("convmem.session")

MAX_CONFLICT_RETRIES = 20

_GROWS = (AddTurn, AddItems, AdoptTurns)
"""Commands that store turns."""


class _CommandIds:
    """Log-wide unique command ids: 64 random bits drawn once per process, then a counter.

    As unique as `uuid4().hex` for the log's deduplication (same 32 hex digits)
    without reading the system's random source on every write. A forked child
    draws its own random bits, or parent and child would repeat each other's ids.
    """

    def __init__(self) -> None:
        self._draw()
        os.register_at_fork(after_in_child=self._draw)

    def _draw(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._numbers = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._numbers):016x}"


_new_command_id = _CommandIds()


class StateCell:
    """The latest acknowledged state of a live session, readable from any thread."""

    __slots__ = ("in_flight", "last_used", "state", "view", "waiters")

    def __init__(self, state: SessionState, now: float) -> None:
        self.state = state
        self.last_used = now
        self.in_flight = False
        """A summary of the session is being made."""
        self.waiters = 0
        """Flushes waiting for the session's summary work to settle."""
        self.view: tuple[SessionState, dict[str, Any]] | None = None
        """The context view last built, with the state it was built from."""

    def busy(self) -> bool:
        """Whether passivating the session now would abandon work under way."""
        return self.in_flight or self.waiters > 0


class _EarlyReply:
    """Publishes a write's state and answers its caller from the thread that learns of the ack.

    Called by a `NotifyingEventLog` (on its loop thread) while the actor still
    waits in `append`: the caller is answered without first waking the actor.
    The actor `close`s it when its wait ends, whichever way; a call after that
    does nothing, so the state is never published twice or after a failure.
    """

    __slots__ = ("_base", "_cell", "_closed", "_events", "_lock", "_reply", "state")

    def __init__(
        self,
        cell: StateCell,
        base: SessionState,
        events: list[AnyEvent],
        reply: Reply,
    ) -> None:
        self._cell = cell
        self._base = base
        self._events = events
        self._reply = reply
        self._lock = threading.Lock()
        self._closed = False
        self.state: SessionState | None = None
        """The state published, once answered."""

    def __call__(self, last: int) -> None:
        with self._lock:
            if self._closed or last != self._events[-1].seq or self._reply.done():
                return  # the log answered for another attempt: the actor finds out
            state = replay(self._events, state=self._base)
            self._cell.state = state
            self.state = state
            self._reply.set_result(self._events)

    def close(self) -> bool:
        """No answer from here on; whether one was given."""
        with self._lock:
            self._closed = True
            return self.state is not None


class Reply(Protocol):
    """How a write is answered: a `concurrent.futures.Future`, or an asyncio caller's stand-in for one."""

    def set_running_or_notify_cancel(self) -> bool: ...

    def running(self) -> bool: ...

    def done(self) -> bool: ...

    def cancel(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException | None, /) -> None: ...


class Write(msgspec.Struct, frozen=True):
    command: Command
    reply: Reply
    command_id: str | None = None


class Flush(msgspec.Struct, frozen=True):
    reply: concurrent.futures.Future[None]


class Wake(msgspec.Struct, frozen=True):
    turn_added: bool = False
    """A turn was just stored (a DEGRADED session with no probe interval probes then)."""


class SummaryTimedOut(msgspec.Struct, frozen=True):
    request: SummaryRequest


class SummaryDone(msgspec.Struct, frozen=True):
    outcome: SummaryOutcome


class Refresh(msgspec.Struct, frozen=True):
    reply: concurrent.futures.Future[SessionState]


class SaveSnapshot(msgspec.Struct, frozen=True):
    """A snapshot fell due on the log's loop, where saving it would block: the actor's thread saves it."""

    state: SessionState
    event_id: str
    """The id of the event at the state's seq."""


Message = Write | Flush | Wake | SummaryTimedOut | SummaryDone | Refresh | SaveSnapshot


class SessionActor(PooledActor):
    """One live session. Started and stopped by `MemorySystem` only."""

    def __init__(self, system: MemorySystem, key: MemoryKey, cell: StateCell) -> None:
        super().__init__()
        self.dispatcher = system.dispatcher
        self._system = system
        self._key = key
        self._cell = cell
        self._in_flight: SummaryRequest | None = None
        self._timer: Timer | None = None
        self._timeout_timer: Timer | None = None
        self._flushes: list[concurrent.futures.Future[None]] = []
        self._events_since_snapshot = 0
        self._uncertain = False
        # Commands whose append failed without an answer (bounded: the oldest are forgotten).
        self._doubtful: dict[str, None] = {}
        self._notifying = isinstance(system.log, NotifyingEventLog)

    @property
    def _state(self) -> SessionState:
        return self._cell.state

    # pykka hooks -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        try:
            self._dispatch(message)
        except Exception:  # the last line of defence: never let pykka stop the actor
            _log.exception("session %s failed to handle %s", self._key, type(message).__name__)
        return None

    def on_stop(self) -> None:
        for timer in (self._timer, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        self._system.forget_stopped(self._key, self.actor_ref)
        # Anything still queued (sent just before passivation) is handed back to the system.
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            message = envelope.message
            if isinstance(message, Message):
                self._system.redeliver(self._key, message)
        for waiter in self._flushes:
            self._system.redeliver(self._key, Flush(waiter))
        self._flushes = []
        self._cell.waiters = 0

    # Messages ------------------------------------------------------------------------

    def _dispatch(self, message: Any) -> None:
        self._cell.last_used = self._system.clock.now()
        match message:
            case Write():
                self._write(message)
            case Flush():
                self._flushes.append(message.reply)
                self._cell.waiters = len(self._flushes)
                self._settle_flushes()
            case Wake():
                self._schedule(turn_added=message.turn_added)
            case SummaryDone():
                self._summary_done(message.outcome)
            case SummaryTimedOut():
                if self._in_flight is message.request:
                    limit = self._state.config.health.summarize_timeout_seconds
                    self._finish_summary(message.request, None, f"summarizer timed out after {limit:g}s")
            case Refresh():
                self._reload()
                message.reply.set_result(self._state)
            case SaveSnapshot():
                self._save_snapshot(message.state, message.event_id)
            case _:
                raise TypeError(f"session actor got an unknown message {type(message).__name__}")

    def _command_id(self, message: Write) -> str:
        # Event ids are log-wide message ids: a caller's idempotency key is scoped to the session.
        given = message.command_id
        return f"{'.'.join(self._key.tokens())}/{given}" if given else _new_command_id()

    def _write(self, message: Write) -> None:
        reply = message.reply
        # Running already: handed over by `write_on_loop`, which checked for a cancelled caller.
        if not reply.running() and not reply.set_running_or_notify_cancel():
            return
        command_id = self._command_id(message)
        try:
            result = self._apply(message.command, command_id, reply)
        except ConvmemError as exc:
            reply.set_exception(exc)
        except Exception as exc:
            _log.exception("session %s: unexpected failure", self._key)
            reply.set_exception(exc)
        else:
            if not reply.done():  # else answered as soon as the log acknowledged (`_EarlyReply`)
                reply.set_result(result)
            if result and isinstance(message.command, _GROWS):
                self._schedule(turn_added=True)
                return
        self._schedule()

    # Writes on the log's loop -------------------------------------------------------

    async def write_on_loop(self, message: Write, log: LoopEventLog) -> None:
        """Handle `message` on `log`'s loop, the actor held (claimed) by the caller until it is done.

        The plain write (a started session, nothing in doubt) is decided here,
        its append started, and it is finished from the log's answer, on the
        loop: no thread waits or wakes. Anything else (the session to open, a
        conflict, a retry the log already holds) goes to the actor's own
        thread as a normal message, behind nothing: it is next in line.
        """
        finished = True
        try:
            finished = await self._begin_on_loop(message, log)
        except BaseException as exc:
            if isinstance(exc, Exception):  # else the loop is closing: it answers the caller itself
                _log.exception("session %s: a write on the loop failed", self._key)
                if not message.reply.done():
                    message.reply.set_exception(exc)
            self.release()
            raise
        if not finished:
            self.actor_ref.tell(message)  # queued while still held, so nothing overtakes it
            self.release()

    async def _begin_on_loop(self, message: Write, log: LoopEventLog) -> bool:
        """Start the write; False when it must go to the actor's thread instead."""
        command_id = self._command_id(message)
        state = self._state
        if self._uncertain or command_id in self._doubtful or not state.started:
            return False
        reply = message.reply
        self._cell.last_used = self._system.clock.now()
        try:
            events = self._decide(state, message.command, command_id)
        except ConvmemError as exc:  # refused: nothing to store
            reply.set_exception(exc)
            self.release()
            return True
        if not events:
            reply.set_result([])
            self.release()
            return True
        started = time.perf_counter()

        def done(result: int | Exception) -> None:
            self._end_on_loop(message, state, events, command_id, started, result)

        try:
            await log.begin_append(self._key, events, expected_seq=state.version, done=done)
        except Exception as exc:  # `done` never comes; a publish cut short may have gone out
            self._uncertain = True
            self._doubt(command_id)
            reply.set_exception(exc)
            self.release()
        return True

    def _end_on_loop(
        self,
        message: Write,
        state: SessionState,
        events: list[AnyEvent],
        command_id: str,
        started: float,
        result: int | Exception,
    ) -> None:
        """The log answered a write started on the loop (on the loop, the actor still held)."""
        reply = message.reply
        try:
            if isinstance(result, ConcurrencyConflict) or (
                isinstance(result, int) and result != events[-1].seq
            ):
                # Another writer came first, or the log already held these ids (a retry): the
                # actor's thread reloads and decides again, as `_apply` does.
                self._uncertain = True
                self.actor_ref.tell(message)
                return
            if isinstance(result, Exception):
                self._uncertain = True  # it may have been stored anyway
                self._doubt(command_id)
                reply.set_exception(result)
                return
            self._system.metrics.observe_append(time.perf_counter() - started)
            self._publish(replay(events, state=state), events, old=state, on_loop=True)
            reply.set_result(events)
            grew = isinstance(message.command, _GROWS)
            now = self._system.clock.now()
            if self._in_flight is None and summary_due(self._state, now, turn_added=grew) is not None:
                self.actor_ref.tell(Wake(grew))  # a full summarizer queue stores a failure: not on the loop
            else:
                self._schedule()
        except Exception as exc:  # the last line of defence, as in `on_receive`
            _log.exception("session %s: finishing a write on the loop failed", self._key)
            if not reply.done():
                reply.set_exception(exc)
        finally:
            self.release()

    def _doubt(self, command_id: str) -> None:
        """Remember a command whose append failed without an answer (the oldest are forgotten)."""
        self._doubtful[command_id] = None
        while len(self._doubtful) > 1024:
            del self._doubtful[next(iter(self._doubtful))]

    def _apply(
        self,
        command: Command,
        command_id: str,
        reply: Reply | None = None,
    ) -> list[AnyEvent]:
        """Decide, append, evolve; on a conflict reload and decide again.

        When an earlier append of the same command (a caller's retry with its
        idempotency key) failed without an answer, the log may hold that
        attempt's events under the same ids, decided at another time; the log
        then answers the retry as already stored, so the state is confirmed
        against the log instead of trusting this attempt's decision.
        """
        system = self._system
        if not self._state.started and not isinstance(command, StartSession):
            # Open the session on its own: a lone event is one plain publish, where the two
            # events of an opening decision would be an atomic batch (fsynced by the server).
            # Deciding the whole command first keeps its refusals before anything is stored.
            self._decide(self._state, command, command_id)
            self._apply(
                StartSession(key=self._key, config=system.config_for(self._key)), command_id + ".start"
            )
        for _ in range(MAX_CONFLICT_RETRIES):
            if self._uncertain:
                # An earlier append failed without an answer: it may have been stored anyway.
                # Read the log before deciding, so the live state never diverges from it.
                self._reload()
                self._uncertain = False
            state = self._state
            events = self._decide(state, command, command_id)
            if not events:
                return []
            started = time.perf_counter()
            early = self._early_reply(state, events, command_id, reply)
            try:
                last = self._append(events, state.version, early)
            except ConcurrencyConflict:
                system.metrics.count("conflicts")
                self._reload()
                if self._state.version == state.version and self._already_stored(events):
                    # Nobody else wrote: the log kept some of these event ids from an earlier
                    # attempt of this command (a retry whose decision has changed since).
                    return []
                continue
            except Exception:
                self._uncertain = True
                self._doubt(command_id)
                raise
            system.metrics.observe_append(time.perf_counter() - started)
            if early is not None and early.state is not None:  # published and answered on the ack
                self._publish(early.state, events, old=state)
                return events
            if last != events[-1].seq:
                # The log already held these event ids (a retried command): trust the log.
                self._reload()
                return []
            state = replay(events, state=state)
            if command_id in self._doubtful:
                del self._doubtful[command_id]
                stored, _ = system.load(self._key)
                if stored != state:  # the log kept the earlier attempt: it is the truth
                    self._cell.state = stored
                    return []
            self._publish(state, events)
            return events
        raise ConcurrencyConflict(key=self._key.composite(), expected_seq=self._state.version, actual_seq=-1)

    def _early_reply(
        self,
        state: SessionState,
        events: list[AnyEvent],
        command_id: str,
        reply: Reply | None,
    ) -> _EarlyReply | None:
        """An answer to give from the log's own thread, when the log can and the outcome is plain.

        Not when the caller runs this message itself: it is awake as soon as the append returns.
        """
        if reply is None or self.on_caller_thread or not self._notifying or command_id in self._doubtful:
            return None
        return _EarlyReply(self._cell, state, events, reply)

    def _append(self, events: list[AnyEvent], expected_seq: int, early: _EarlyReply | None) -> int:
        log = self._system.log
        if early is None:
            return log.append(self._key, events, expected_seq=expected_seq)
        assert isinstance(log, NotifyingEventLog)
        try:
            last = log.append_notifying(self._key, events, expected_seq=expected_seq, on_stored=early)
        except Exception:
            if not early.close():
                raise
            return events[-1].seq  # the ack came in as the wait gave up: stored, published and answered
        early.close()
        return last

    def _decide(self, state: SessionState, command: Command, command_id: str) -> list[AnyEvent]:
        system = self._system
        return decide(
            state,
            command,
            now=system.clock.now(),
            command_id=command_id,
            key=self._key,
            config=system.config_for(self._key),
            estimator=system.estimator_for(self._key),
        )

    def _already_stored(self, events: list[AnyEvent]) -> bool:
        """Whether the log holds one of these events' ids (an earlier attempt of the command)."""
        ids = {e.event_id for e in events}
        return any(r.event_id in ids for r in self._system.log.read(self._key))

    def _reload(self) -> None:
        state, _ = self._system.load(self._key)
        self._cell.state = state

    def _publish(
        self,
        state: SessionState,
        events: list[AnyEvent],
        *,
        old: SessionState | None = None,
        on_loop: bool = False,
    ) -> None:
        if old is None:
            old = self._cell.state
        self._cell.state = state
        self._system.notify(self._key, old, state, events)
        self._events_since_snapshot += len(events)
        if self._events_since_snapshot >= self._system.snapshot_every:
            self._events_since_snapshot = 0
            last_id = events[-1].event_id
            if on_loop:
                self.actor_ref.tell(SaveSnapshot(state, last_id))
            else:
                self._save_snapshot(state, last_id)

    def _save_snapshot(self, state: SessionState, event_id: str) -> None:
        store = self._system.snapshots
        if store is None:
            return
        snapshot = Snapshot(
            key=self._key,
            seq=state.version,
            state_hash=state_hash(state),
            data=encode_state(state),
            event_id=event_id,
        )
        try:
            store.save(snapshot)
        except Exception:
            _log.warning("snapshot of %s at seq %s not saved", self._key, state.version, exc_info=True)

    # Summaries -----------------------------------------------------------------------

    def _schedule(self, *, turn_added: bool = False) -> None:
        """Ask for a summary when one is due; otherwise set a timer for when it will be."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._in_flight is None:
            clock = self._system.clock
            now = clock.now()
            request = summary_due(self._state, now, turn_added=turn_added)
            if request is not None:
                self._submit(request)
            else:
                due = next_due_at(self._state)
                if due is not None:
                    key, system = self._key, self._system
                    self._timer = clock.call_at(due, lambda: system.tell_if_live(key, Wake()))
        self._settle_flushes()

    def _submit(self, request: SummaryRequest) -> None:
        system, key = self._system, self._key
        self._in_flight = request
        self._cell.in_flight = True
        refused = system.submit_summary(
            key, request, lambda outcome: system.tell_if_live(key, SummaryDone(outcome))
        )
        if refused is not None:
            self._finish_summary(request, None, refused)
            return
        limit = self._state.config.health.summarize_timeout_seconds
        self._timeout_timer = system.clock.call_at(
            system.clock.now() + limit, lambda: system.tell_if_live(key, SummaryTimedOut(request))
        )

    def _summary_done(self, outcome: SummaryOutcome) -> None:
        if self._in_flight is not outcome.request:
            return  # a late answer to a request that already timed out
        self._finish_summary(outcome.request, outcome.summary, outcome.error)

    def _finish_summary(self, request: SummaryRequest, summary: str | None, error: str | None) -> None:
        self._in_flight = None
        self._cell.in_flight = False
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
            self._timeout_timer = None
        command: Command
        if summary is not None:
            command = SummarySucceeded(request=request, summary=summary)
        else:
            command = SummaryFailed(request=request, reason=error or "summarizer failed")
            self._system.metrics.count("summary_failures")
        try:
            self._apply(command, _new_command_id())
        except ConvmemError:
            _log.warning("session %s: summary outcome not stored", self._key, exc_info=True)
        self._schedule()

    def _settle_flushes(self) -> None:
        if not self._flushes or self._in_flight is not None:
            return
        state = self._state
        if next_due_at(state) is None or state.health is MemoryHealth.DEGRADED:
            for waiter in self._flushes:
                if not waiter.done():
                    waiter.set_result(None)
            self._flushes = []
            self._cell.waiters = 0
