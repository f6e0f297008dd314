"""`SessionActor`: a thin shell around `decide` and `evolve` for one live session.

A write's rules are the pure step machine of `convmem.projections._write_protocol`;
the actor carries out each effect it returns (append; read the log; done:
publish, answer) and reports what the log said, so the state always equals a
replay of the log and a caller is answered only after the log acknowledged.
How an effect is carried out is the performance machinery: a write runs on
whoever holds the actor (a caller's thread or event loop that claimed it, or a
dispatcher thread); an append on a `LoopEventLog` is settled on the log's loop
while the actor stays held; the log is never read on an event loop (the write
goes back to the actor's own thread as its next message, `PooledActor.requeue`).
The actor also schedules what follows a write: summaries, snapshots, flushes.

Readers never queue behind writers: they read the latest published state
from the session's `StateCell` directly. Every message is of a closed set;
the actor never lets an exception escape into pykka.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Protocol

import msgspec
import pykka

from convmem.actors._calls import SummaryOutcome
from convmem.actors._dispatch import Dispatcher, PooledActor
from convmem.actors._ids import new_command_id
from convmem.actors._metrics import Metrics
from convmem.actors._ports import Clock, Settle, Timer
from convmem.actors._services import ServiceRegistry
from convmem.actors._storage import SessionStorage
from convmem.errors import ConcurrencyConflict, ConvmemError, InternalError, SessionClosed
from convmem.events import AnyEvent, MemoryHealth, MemoryKey, ShortTermMemoryConfig
from convmem.projections import (
    Command,
    Decision,
    SessionState,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    SummarySucceeded,
    command_id_for,
    decide_folded,
    next_due_at,
    snapshot_due,
    summary_plan,
)
from convmem.projections._write_protocol import (
    NO_DOUBTS,
    Done,
    Effect,
    PendingWrite,
    ReadLog,
    Reason,
    acknowledged,
    begin,
    failed,
    reread,
)

__all__ = ["Message", "SessionActor", "SessionHost", "StateCell", "Write"]

_log = logging.getLogger("convmem.session")

_WROTE: dict[type, str] = {}
"""The counter of each command's stored writes (``writes.AddTurn``...), made once."""
_FAILED: dict[type, str] = {}
"""The counter of each error's failed writes (``write_errors.InvalidInput``...), made once."""


def _write_count(kind: type, failure: bool) -> str:
    """The counter a write's end adds to, kept for the next (a closed set of commands and errors)."""
    names = _FAILED if failure else _WROTE
    name = names[kind] = f"write_errors.{kind.__name__}" if failure else f"writes.{kind.__name__}"
    return name


class StateCell:
    """The latest acknowledged state of a live session, readable from any thread."""

    __slots__ = ("counted_bytes", "in_flight", "last_used", "state", "view", "waiters")

    def __init__(self, state: SessionState, now: float) -> None:
        self.state = state
        self.last_used = now
        self.counted_bytes = 0
        """What the idle cache last counted keeping the cell costs (0: never counted)."""
        self.in_flight = False
        """A summary of the session is being made."""
        self.waiters = 0
        """Flushes waiting for the session's summary work to settle."""
        self.view: tuple[SessionState, dict[str, Any]] | None = None
        """The context view last built, with the state it was built from."""

    def busy(self) -> bool:
        """Whether passivating the session now would abandon work under way."""
        return self.in_flight or self.waiters > 0


class Write:
    """A write for the session: its command, its caller's answer (None for the session's own, whose
    failures are logged), the caller's idempotency key, and, while it waits to read the log on the
    actor's thread, the step machine's write and the read it resumes with."""

    __slots__ = ("command", "command_id", "pending", "reading", "reply")

    def __init__(
        self, command: Command, reply: Settle[list[AnyEvent]] | None = None, command_id: str | None = None
    ) -> None:
        self.command = command
        self.reply = reply
        self.command_id = command_id
        self.pending: PendingWrite | None = None
        self.reading: ReadLog | None = None


class _Appending:
    """The settle of one append under way (the log reports its outcome here, once); it holds the actor."""

    __slots__ = ("_actor", "_open", "pending", "started", "write")

    def __init__(self, actor: SessionActor, write: Write, pending: PendingWrite) -> None:
        self._actor = actor
        self.write = write
        self.pending = pending
        self.started = time.perf_counter()
        self._open = True

    def set_running_or_notify_cancel(self) -> bool:
        return True  # an append is never cancelled once it is decided

    def done(self) -> bool:
        return not self._open

    def cancel(self) -> bool:
        """The append will never start (the log closed first): the write fails."""
        self.set_exception(SessionClosed("the event log closed before the write's append started"))
        return True

    def set_result(self, last: int, /) -> None:
        if self._open:
            self._open = False
            self._actor._settled(self, last)

    def set_exception(self, exception: BaseException, /) -> None:
        if self._open:
            self._open = False
            self._actor._settled(self, exception)


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


class SessionHost(Protocol):
    """What a session actor sees of the system that runs it (`LiveSessions`): its threads, clock,
    metrics, storage and services; `notify` fires the callbacks, `tell` reaches a live session,
    `stopped` hands back what a stopping actor still held."""

    dispatcher: Dispatcher
    clock: Clock
    metrics: Metrics
    storage: SessionStorage
    services: ServiceRegistry

    def notify(
        self, key: MemoryKey, old: SessionState, new: SessionState, events: list[AnyEvent]
    ) -> None: ...

    def tell(self, key: MemoryKey, message: Message, *, here: bool = False) -> bool: ...

    def stopped(self, key: MemoryKey, ref: pykka.ActorRef[Any], leftovers: list[Message]) -> None: ...


class SessionActor(PooledActor):
    """One live session. Started and stopped by `LiveSessions` only."""

    starts_idle = True  # a write that activates the session runs at once on the caller's thread

    def __init__(self, host: SessionHost, key: MemoryKey, cell: StateCell) -> None:
        super().__init__()
        self.dispatcher = host.dispatcher
        self._host = host
        self._storage = host.storage
        self._services = host.services
        self.key = key
        self._cell = cell
        self._in_flight: SummaryRequest | None = None
        self._timer: Timer | None = None
        self._timeout_timer: Timer | None = None
        self._flushes: tuple[concurrent.futures.Future[None], ...] = ()
        """Flushes waiting (the empty tuple, shared and untracked, while none waits)."""
        self._doubts = NO_DOUBTS
        """Appends that failed without an answer (the step machine's rules use it; kept between writes)."""
        self._config_seen: ShortTermMemoryConfig | None = None
        self._quiet = False
        """`_config_seen` (the configuration of the state `_end` saw last) never summarizes."""

    @property
    def state(self) -> SessionState:
        """The latest acknowledged state."""
        return self._cell.state

    # pykka hooks -------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        try:
            self._dispatch(message)
        except Exception:  # the last line of defence: never let pykka stop the actor
            _log.exception("session %s failed to handle %s", self.key, type(message).__name__)
        return None

    def on_claimed(self, message: Any) -> None:
        """A message run by the thread (or loop) that claimed the idle actor: a write, straight away."""
        if isinstance(message, Write):  # `LiveSessions` set `last_used` as it claimed the actor
            self._write(message)
        else:
            self.on_receive(message)

    def on_stop(self) -> None:
        for timer in (self._timer, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        # Anything still queued (sent just before passivation) goes to the next activation.
        leftovers: list[Message] = []
        while not self.actor_inbox.empty():
            message = self.actor_inbox.get().message
            if isinstance(message, Message):
                leftovers.append(message)
        leftovers.extend(Flush(waiter) for waiter in self._flushes)
        self._flushes = ()
        self._cell.waiters = 0
        self._host.stopped(self.key, self.actor_ref, leftovers)

    # Messages ------------------------------------------------------------------------

    def _dispatch(self, message: Any) -> None:
        self._cell.last_used = self._host.clock.now()
        match message:
            case Write():
                self._write(message)
            case Flush():  # the waiters whose callers gave up (a timeout) are dropped, not kept
                self._flushes = (*(w for w in self._flushes if not w.done()), message.reply)
                self._cell.waiters = len(self._flushes)
                self._settle_flushes()
            case Wake():
                self._schedule(turn_added=message.turn_added)
            case SummaryDone():
                self._summary_done(message.outcome)
            case SummaryTimedOut():
                if self._in_flight is message.request:
                    limit = self.state.config.health.summarize_timeout_seconds
                    self._finish_summary(message.request, None, f"summarizer timed out after {limit:g}s")
            case Refresh():
                self._cell.state = self._load()
                message.reply.set_result(self.state)
            case SaveSnapshot():
                self._storage.save_snapshot(self.key, message.state, message.event_id)
            case _:
                raise InternalError(f"session actor got an unknown message {type(message).__name__}")

    # Writes: the step machine's effects, carried out ------------------------------------

    def _write(self, write: Write) -> None:
        """Begin `write`, or resume it after the read it came back for, where the actor is held."""
        pending, reading = write.pending, write.reading
        effect: Effect
        if pending is not None and reading is not None:
            effect = reading
        else:
            if write.reply is not None and not write.reply.set_running_or_notify_cancel():
                return  # its caller gave up before it started
            given = write.command_id
            try:
                pending, effect = begin(
                    self.state,
                    write.command,
                    key=self.key,
                    command_id=command_id_for(self.key, given) if given else new_command_id(),
                    decide=self._decide,
                    opening=self._opening,
                    doubts=self._doubts,
                )
            except Exception as exc:  # the last line of defence (a refusal is an effect, not an error)
                self._end(write, self._unexpected(None, exc))
                return
        self._carry_out(write, pending, effect, can_read=not self.on_loop, held=False)

    def _carry_out(
        self, write: Write, pending: PendingWrite, effect: Effect, *, can_read: bool, held: bool
    ) -> None:
        """Do what `effect` says, and what follows, until the write waits for the log or is done.

        `held`: the caller (an append's settle) holds the actor for this write, and this passes the
        hold on or lets it go. The log is read only where `can_read` (the actor's own thread).
        """
        while True:
            try:
                if effect.published is not None:
                    self._publish(effect.published.old, effect.published.new, effect.published.events)
                elif effect.state is not self._cell.state:
                    self._cell.state = effect.state
                if not (isinstance(effect, ReadLog) and can_read):
                    break
                pending, effect = self._read(pending, effect)
            except Exception as exc:  # the log could not be read, or the last line of defence
                self._end(write, self._unexpected(pending, exc), held=held)
                return
        if isinstance(effect, Done):
            self._end(write, effect, held=held)
            return
        if isinstance(effect, ReadLog):  # it runs next, on a dispatcher thread, and lets go of the hold
            write.pending, write.reading = pending, msgspec.structs.replace(effect, published=None)
            if not held:
                self.hold()
            self.requeue(write)
            return
        appending = _Appending(self, write, pending)
        if not held:
            self.hold()
        try:
            self._storage.start_append(self.key, effect.events, effect.after, appending)
        except Exception as exc:  # refused before it started (a closed log, bad input): not stored
            appending.set_exception(exc)
        except BaseException:  # the caller's interrupt (it stops the actor): nothing to settle
            if not appending.done():
                appending._open = False
                self.let_go()
            raise

    def _read(self, pending: PendingWrite, effect: ReadLog) -> tuple[PendingWrite, Effect]:
        """Read the log as `effect` asks (blocking; on the actor's thread) and report it."""
        if effect.ids is not None:
            held = {r.event_id for r in self._storage.read(self.key)}
            return reread(pending, None, effect.ids & held)
        if effect.unless_at is not None and self._storage.log.last_seq(self.key) == effect.unless_at:
            return reread(pending, self.state, None)  # nobody else wrote: the log's state is ours
        return reread(pending, self._load(), None)

    def _settled(self, appending: _Appending, outcome: int | BaseException) -> None:
        """The log settled the append (on whichever thread learns of it), the actor still held for it."""
        try:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, ConcurrencyConflict):
                    self._host.metrics.count("conflicts")
                pending, effect = failed(appending.pending, outcome)
            else:
                pending, effect = acknowledged(appending.pending, outcome)
                if isinstance(
                    effect, Done
                ):  # the common end: `_carry_out`'s one pass, its latency counted at the end
                    self._ended(appending, pending, effect)
                    return
                if not (isinstance(effect, ReadLog) and effect.reason is Reason.RECHECK):
                    self._host.metrics.observe_append(time.perf_counter() - appending.started)
        except Exception as exc:  # the last line of defence, as a handler's
            self._end(appending.write, self._unexpected(appending.pending, exc), held=True)
            return
        self._carry_out(appending.write, pending, effect, can_read=False, held=True)

    def _ended(self, appending: _Appending, pending: PendingWrite, done: Done) -> None:
        """An acknowledgement that ended the write: what `_carry_out` does with a `Done`, the append's
        latency and the write's count taken together (`_end`)."""
        appended = time.perf_counter() - appending.started
        try:
            if done.published is not None:
                self._publish(done.published.old, done.published.new, done.published.events)
            elif done.state is not self._cell.state:
                self._cell.state = done.state
        except Exception as exc:  # the last line of defence
            self._host.metrics.observe_append(appended)
            self._end(appending.write, self._unexpected(pending, exc), held=True)
            return
        self._end(appending.write, done, held=True, appended=appended)

    def _unexpected(self, pending: PendingWrite | None, error: Exception) -> Done:
        """The end of a write cut short by `error`: the log could not be read, or a bug (logged)."""
        if not isinstance(error, ConvmemError):
            _log.error("session %s: unexpected failure of a write", self.key, exc_info=error)
        return Done(error, self.state, self._doubts if pending is None else pending.doubts)

    def _end(self, write: Write, done: Done, *, held: bool = False, appended: float | None = None) -> None:
        """The write is over: ask for a summary when one fell due, else keep the timers and flushes right;
        let go of the actor when `held`; answer the caller last (writing again at once, it finds the
        session free). `appended`: the seconds its acknowledged append took, counted with the write.

        A session whose configuration never summarizes, with no timer set and no flush waiting,
        skips the summary checks: `summary_plan` is (None, None) for every state of such
        a configuration (``tests/test_write_protocol.py`` checks it), so nothing would be asked,
        set or settled.
        """
        self._doubts, outcome = done.doubts, done.answer
        failure = isinstance(outcome, Exception)
        kind = type(outcome if failure else write.command)
        name = (_FAILED if failure else _WROTE).get(kind) or _write_count(kind, failure)
        metrics = self._host.metrics
        if appended is None:
            metrics.count(name)
        else:
            metrics.wrote(name, appended)
        state = self._cell.state
        if state.config is not self._config_seen:
            self._config_seen, self._quiet = state.config, not state.config.summarizes
        if not self._quiet or self._timer is not None or self._flushes:
            self._schedule(turn_added=done.grew)  # asks the pool here: a refusal comes back as a message
        if held:
            self.let_go()
        reply = write.reply
        if reply is None:
            if failure:
                _log.warning("session %s: %s not stored: %s", self.key, type(write.command).__name__, outcome)
        elif reply.done():
            pass  # answered already (the caller's answer was cancelled: it gave up waiting)
        elif isinstance(outcome, Exception):
            reply.set_exception(outcome)
        else:
            reply.set_result(outcome)

    def _decide(self, state: SessionState, command: Command, command_id: str) -> Decision:
        services = self._services
        started = state.started  # a started session's decision needs no starting configuration
        return decide_folded(
            state,
            command,
            now=self._host.clock.now(),
            command_id=command_id,
            key=self.key,
            config=None if started else services.config_for(self.key),
            estimator=services.estimator_for(self.key, state.config if started else None),
        )

    def _opening(self) -> StartSession:
        return StartSession(key=self.key, config=self._services.config_for(self.key))

    def _load(self) -> SessionState:
        state, _ = self._storage.load(self.key)
        return state

    def _publish(self, old: SessionState, state: SessionState, events: list[AnyEvent]) -> None:
        """Make `state` (`old` plus the acknowledged `events`) the session's, and tell who listens."""
        self._cell.state = state
        self._host.notify(self.key, old, state, events)
        if snapshot_due(self.key, self._storage.snapshot_every, old.version, state.version, len(state.turns)):
            if self._storage.settles_here:  # settled on the thread that holds the actor: save now
                self._storage.save_snapshot(self.key, state, events[-1].event_id)
            else:  # settled on the log's loop, where saving would wait for that loop: after this write
                self.actor_ref.tell(SaveSnapshot(state, events[-1].event_id))

    # Summaries -----------------------------------------------------------------------

    def _schedule(self, *, turn_added: bool = False) -> None:
        """Ask for a summary when one is due; otherwise set a timer for when it will be.

        `turn_added`: a turn was just stored (a DEGRADED session with no probe interval probes then).
        """
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._in_flight is None:
            clock, state = self._host.clock, self.state
            estimator = self._services.estimator_for(self.key, state.config if state.started else None)
            request, due = summary_plan(state, clock.now(), turn_added=turn_added, estimator=estimator)
            if request is not None:
                self._submit(request)
            elif due is not None:
                key, host = self.key, self._host
                self._timer = clock.call_at(due, lambda: host.tell(key, Wake()))
        self._settle_flushes()

    def _submit(self, request: SummaryRequest) -> None:
        """Hand `request` to the summarizer pool; its answer comes back as a `SummaryDone`.

        Never writes here: it runs at a write's end too, on whichever thread (or loop) settled the
        write, so a refusal (a full queue, a closed pool) is told to the actor as the outcome, which
        stores the failure as a write of its own, as it stores an answer.
        """
        host, key = self._host, self.key
        self._in_flight = request
        self._cell.in_flight = True
        host.metrics.count("summary_calls")
        refused = self._services.summarize(
            key, request, lambda outcome: host.tell(key, SummaryDone(outcome), here=True)
        )
        if refused is not None:
            self.actor_ref.tell(SummaryDone(SummaryOutcome(request=request, error=refused)))
            return
        limit = self.state.config.health.summarize_timeout_seconds
        self._timeout_timer = host.clock.call_at(
            host.clock.now() + limit, lambda: host.tell(key, SummaryTimedOut(request))
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
            self._host.metrics.count("summary_failures")
        self._write(Write(command))  # what follows it is scheduled when it ends (`written`)

    def _settle_flushes(self) -> None:
        if not self._flushes or self._in_flight is not None:
            return
        state = self.state
        if next_due_at(state) is None or state.health is MemoryHealth.DEGRADED:
            for waiter in self._flushes:
                if not waiter.done():
                    waiter.set_result(None)
            self._flushes = ()
            self._cell.waiters = 0
