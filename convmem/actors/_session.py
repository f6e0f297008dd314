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
from typing import TYPE_CHECKING, Any

import msgspec

from convmem.actors._dispatch import PooledActor
from convmem.actors._metrics import Metrics
from convmem.actors._pool import SummaryOutcome
from convmem.actors._ports import Settle, Snapshot, Timer
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
    encode_state,
    next_due_at,
    state_hash,
    summary_due,
)

if TYPE_CHECKING:
    from convmem.actors._system import MemorySystem

__all__ = ["Message", "SessionActor", "StateCell"]

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


class SessionActor(PooledActor):
    """One live session. Started and stopped by `MemorySystem` only."""

    def __init__(self, system: MemorySystem, key: MemoryKey, cell: StateCell) -> None:
        super().__init__()
        self.dispatcher = system.dispatcher
        self._system = system
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

    def on_stop(self) -> None:
        for timer in (self._timer, self._timeout_timer):
            if timer is not None:
                timer.cancel()
        self._system.forget_stopped(self.key, self.actor_ref)
        # Anything still queued (sent just before passivation) is handed back to the system.
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            message = envelope.message
            if isinstance(message, Message):
                self._system.redeliver(self.key, message)
        for waiter in self._flushes:
            self._system.redeliver(self.key, Flush(waiter))
        self._flushes = []
        self._cell.waiters = 0

    # Messages ------------------------------------------------------------------------

    def _dispatch(self, message: Any) -> None:
        self._cell.last_used = self._system.clock.now()
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
                self._save_snapshot(message.state, message.event_id)
            case _:
                raise TypeError(f"session actor got an unknown message {type(message).__name__}")

    # What a write needs of the session (`WriteSession`) -----------------------------------

    @property
    def metrics(self) -> Metrics:
        return self._system.metrics

    def decide(self, state: SessionState, command: Command, command_id: str) -> list[AnyEvent]:
        system = self._system
        return decide(
            state,
            command,
            now=system.clock.now(),
            command_id=command_id,
            key=self.key,
            config=system.config_for(self.key),
            estimator=system.estimator_for(self.key),
        )

    def opening(self) -> StartSession:
        return StartSession(key=self.key, config=self._system.config_for(self.key))

    def start_append(self, events: list[AnyEvent], expected_seq: int, settle: Settle[int]) -> None:
        self._system.start_append(self.key, events, expected_seq, settle)

    def reload(self) -> None:
        self._cell.state = self.load()

    def load(self) -> SessionState:
        state, _ = self._system.load(self.key)
        return state

    def adopt(self, state: SessionState) -> None:
        self._cell.state = state

    def already_stored(self, events: list[AnyEvent]) -> bool:
        ids = {e.event_id for e in events}
        return any(r.event_id in ids for r in self._system.log.read(self.key))

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
        self._system.notify(self.key, old, state, events)
        self._events_since_snapshot += len(events)
        if self._events_since_snapshot >= self._system.snapshot_every:
            self._events_since_snapshot = 0
            if self._system.loop_log is None:  # settled on the thread that holds the actor: save now
                self._save_snapshot(state, events[-1].event_id)
            else:  # settled on the log's loop, where saving would wait for that loop: after this write
                self.actor_ref.tell(SaveSnapshot(state, events[-1].event_id))

    def written(self, *, grew: bool) -> None:
        """A write ended: ask for a summary when one fell due, else keep the timers and flushes right."""
        now = self._system.clock.now()
        if self._in_flight is None and summary_due(self.state, now, turn_added=grew) is not None:
            self.actor_ref.tell(Wake(grew))  # a full summarizer queue stores a failure: a write of its own
        else:
            self._schedule()

    def _save_snapshot(self, state: SessionState, event_id: str) -> None:
        store = self._system.snapshots
        if store is None:
            return
        snapshot = Snapshot(
            key=self.key,
            seq=state.version,
            state_hash=state_hash(state),
            data=encode_state(state),
            event_id=event_id,
        )
        try:
            store.save(snapshot)
        except Exception:
            _log.warning("snapshot of %s at seq %s not saved", self.key, state.version, exc_info=True)

    # Summaries -----------------------------------------------------------------------

    def _schedule(self, *, turn_added: bool = False) -> None:
        """Ask for a summary when one is due; otherwise set a timer for when it will be."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._in_flight is None:
            clock = self._system.clock
            now = clock.now()
            request = summary_due(self.state, now, turn_added=turn_added)
            if request is not None:
                self._submit(request)
            else:
                due = next_due_at(self.state)
                if due is not None:
                    key, system = self.key, self._system
                    self._timer = clock.call_at(due, lambda: system.tell_if_live(key, Wake()))
        self._settle_flushes()

    def _submit(self, request: SummaryRequest) -> None:
        system, key = self._system, self.key
        self._in_flight = request
        self._cell.in_flight = True
        refused = system.submit_summary(
            key, request, lambda outcome: system.tell_if_live(key, SummaryDone(outcome))
        )
        if refused is not None:
            self._finish_summary(request, None, refused)
            return
        limit = self.state.config.health.summarize_timeout_seconds
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
