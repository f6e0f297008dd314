"""`SessionActor`: a thin shell around `decide` and `evolve` for one live session.

Writes go through `Write` (see `convmem.actors._write`): decide, append with
the expected last seq, and on acknowledgement evolve, publish the new
immutable state, answer; on a concurrency conflict, reload from the log and
decide again. The state changes only by applying an acknowledged event, so it
always equals a replay of the log. The actor offers a write what it needs of
the session (`WriteSession`) and schedules what follows it: summaries,
snapshots, flushes.

Readers never queue behind writers: they read the latest published state
from the session's `StateCell` directly.

Every message is of a closed set; the actor never lets an exception escape
into pykka.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any, Protocol

import msgspec
import pykka

from convmem.actors._calls import SummaryOutcome
from convmem.actors._dispatch import Dispatcher, PooledActor
from convmem.actors._metrics import Metrics
from convmem.actors._ports import Clock, Settle, Timer
from convmem.actors._services import ServiceRegistry
from convmem.actors._storage import SessionStorage
from convmem.actors._write import Write
from convmem.events import AnyEvent, MemoryHealth, MemoryKey
from convmem.projections import (
    Command,
    SessionState,
    StartSession,
    SummaryFailed,
    SummaryRequest,
    SummarySucceeded,
    decide,
    next_due_at,
    summary_due,
)

__all__ = ["Message", "SessionActor", "SessionHost", "StateCell"]

_log = logging.getLogger("convmem.session")


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
    """What a session actor sees of the system that runs it (`LiveSessions` is the one).

    Its threads, its clock and metrics, where events and snapshots are kept
    (`storage`), what each session runs with (`services`: configuration,
    estimator, summarizer), the callbacks (`notify`), and the registry's two
    doors: `tell` reaches a live session, `stopped` hands back what a
    stopping actor still held.
    """

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def storage(self) -> SessionStorage: ...

    @property
    def services(self) -> ServiceRegistry: ...

    def notify(self, key: MemoryKey, old: SessionState, new: SessionState, events: list[AnyEvent]) -> None:
        """A write stored `events`, taking the session from `old` to `new`."""
        ...

    def tell(self, key: MemoryKey, message: Message) -> bool:
        """Deliver `message` to the session if it is live; False when it is not."""
        ...

    def stopped(self, key: MemoryKey, ref: pykka.ActorRef[Any], leftovers: list[Message]) -> None:
        """The session's actor `ref` stopped; `leftovers` go to the session's next activation."""
        ...


class SessionActor(PooledActor):
    """One live session. Started and stopped by `LiveSessions` only."""

    starts_idle = True  # a write that activates the session runs at once on the caller's thread

    def __init__(self, host: SessionHost, key: MemoryKey, cell: StateCell) -> None:
        super().__init__()
        self.dispatcher = host.dispatcher
        self._host = host
        self._storage = host.storage
        self._services = host.services
        self._start_append = host.storage.appender(key)
        self.key = key
        self._cell = cell
        self._in_flight: SummaryRequest | None = None
        self._timer: Timer | None = None
        self._timeout_timer: Timer | None = None
        self._flushes: list[concurrent.futures.Future[None]] = []
        self._events_since_snapshot = 0
        self.uncertain = False
        # Commands whose append failed without an answer (bounded: the oldest are forgotten).
        self._doubtful: dict[str, None] = {}

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
            message.run(self)
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
        self._flushes = []
        self._cell.waiters = 0
        self._host.stopped(self.key, self.actor_ref, leftovers)

    # Messages ------------------------------------------------------------------------

    def _dispatch(self, message: Any) -> None:
        self._cell.last_used = self._host.clock.now()
        match message:
            case Write():
                message.run(self)
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
                    limit = self.state.config.health.summarize_timeout_seconds
                    self._finish_summary(message.request, None, f"summarizer timed out after {limit:g}s")
            case Refresh():
                self.reload()
                message.reply.set_result(self.state)
            case SaveSnapshot():
                self._storage.save_snapshot(self.key, message.state, message.event_id)
            case _:
                raise TypeError(f"session actor got an unknown message {type(message).__name__}")

    # What a write needs of the session (`WriteSession`) -----------------------------------

    @property
    def metrics(self) -> Metrics:
        return self._host.metrics

    def decide(self, state: SessionState, command: Command, command_id: str) -> list[AnyEvent]:
        services = self._services
        return decide(
            state,
            command,
            now=self._host.clock.now(),
            command_id=command_id,
            key=self.key,
            config=services.config_for(self.key),
            estimator=services.estimator_for(self.key, state.config if state.started else None),
        )

    def opening(self) -> StartSession:
        return StartSession(key=self.key, config=self._services.config_for(self.key))

    def start_append(self, events: list[AnyEvent], expected_seq: int, settle: Settle[int]) -> None:
        self._start_append(events, expected_seq, settle)

    def reload(self) -> None:
        self._cell.state = self.load()

    def load(self) -> SessionState:
        state, _ = self._storage.load(self.key)
        return state

    def adopt(self, state: SessionState) -> None:
        self._cell.state = state

    def already_stored(self, events: list[AnyEvent]) -> bool:
        ids = {e.event_id for e in events}
        return any(r.event_id in ids for r in self._storage.read(self.key))

    def log_moved_on(self) -> bool:
        return self._storage.log.last_seq(self.key) != self._cell.state.version

    def in_doubt(self, command_id: str) -> bool:
        return command_id in self._doubtful

    def doubt(self, command_id: str) -> None:
        """Remember a command whose append failed without an answer (the oldest are forgotten)."""
        self._doubtful[command_id] = None
        while len(self._doubtful) > 1024:
            del self._doubtful[next(iter(self._doubtful))]

    def settle_doubt(self, command_id: str) -> None:
        self._doubtful.pop(command_id, None)

    def publish(self, state: SessionState, events: list[AnyEvent], old: SessionState) -> None:
        """Make `state` (`old` plus the acknowledged `events`) the session's, and tell who listens."""
        self._cell.state = state
        self._host.notify(self.key, old, state, events)
        self._events_since_snapshot += len(events)
        if self._events_since_snapshot >= self._storage.snapshot_every:
            self._events_since_snapshot = 0
            if self._storage.settles_here:  # settled on the thread that holds the actor: save now
                self._storage.save_snapshot(self.key, state, events[-1].event_id)
            else:  # settled on the log's loop, where saving would wait for that loop: after this write
                self.actor_ref.tell(SaveSnapshot(state, events[-1].event_id))

    def written(self, *, grew: bool) -> None:
        """A write ended: ask for a summary when one fell due, else keep the timers and flushes right."""
        now = self._host.clock.now()
        if self._in_flight is None and summary_due(self.state, now, turn_added=grew) is not None:
            self.actor_ref.tell(Wake(grew))  # a full summarizer queue stores a failure: a write of its own
        else:
            self._schedule()

    # Summaries -----------------------------------------------------------------------

    def _schedule(self, *, turn_added: bool = False) -> None:
        """Ask for a summary when one is due; otherwise set a timer for when it will be."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._in_flight is None:
            clock = self._host.clock
            now = clock.now()
            request = summary_due(self.state, now, turn_added=turn_added)
            if request is not None:
                self._submit(request)
            else:
                due = next_due_at(self.state)
                if due is not None:
                    key, host = self.key, self._host
                    self._timer = clock.call_at(due, lambda: host.tell(key, Wake()))
        self._settle_flushes()

    def _submit(self, request: SummaryRequest) -> None:
        host, key = self._host, self.key
        self._in_flight = request
        self._cell.in_flight = True
        host.metrics.count("summary_calls")
        refused = self._services.summarize(key, request, lambda outcome: host.tell(key, SummaryDone(outcome)))
        if refused is not None:
            self._finish_summary(request, None, refused)
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
        Write(command).run(self)  # what follows it is scheduled when it ends (`written`)

    def _settle_flushes(self) -> None:
        if not self._flushes or self._in_flight is not None:
            return
        state = self.state
        if next_due_at(state) is None or state.health is MemoryHealth.DEGRADED:
            for waiter in self._flushes:
                if not waiter.done():
                    waiter.set_result(None)
            self._flushes = []
            self._cell.waiters = 0
