"""`Write`: one write of a session, carried from its decision to its answer, wherever it runs.

A write is begun by whoever holds the session's actor at that moment: the
caller's own thread (a blocking handle that claimed the idle actor), the
caller's event loop (an asyncio handle that claimed it, when the log runs its
appends on a loop), or a dispatcher thread (a busy session's queued write, a
summary's outcome). From there it is one path:

    decide(state, command) -> events
    start the append after the state's version; the actor stays held  -> the log settles the write
    settled with the events' last seq: evolve, publish the state, answer the caller, let go

The log's only part is to settle the write (`Write` is the `Settle[int]` that
`LoopEventLog.start_append` is given; a plain `EventLog.append` settles it
before it returns). What follows is the write's own code, run where the
settle lands (for the JetStream log, on its loop thread as the
acknowledgement is read) with the actor still held, so it never runs beside
another message of the session and no thread waits for the network.

Anything that must read the log first goes to the actor's own thread as its
next message (`PooledActor.requeue`), and resumes there: a session in doubt
after a failed append rereads the log before deciding; a conflict (another
writer came first) rereads it and decides again; an acknowledgement of other
events (the log held these ids: a retry) rereads it and answers that nothing
was stored; a retried command whose earlier append failed without an answer
is checked against the log once stored. A session that has not started is
opened by the same write: its `SessionStarted` is appended first, and the
command is decided once that is settled.

The state changes only by applying acknowledged events, so it always equals a
replay of the log. A caller is answered only after the log acknowledged.
"""

from __future__ import annotations

import logging
import time

from convmem.actors._ids import new_command_id
from convmem.actors._ports import Settle
from convmem.actors._write_session import WriteSession
from convmem.errors import ConcurrencyConflict, ConvmemError, SessionClosed
from convmem.events import AnyEvent
from convmem.projections import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Command,
    SessionState,
    StartSession,
    command_id_for,
    replay,
)

__all__ = ["MAX_CONFLICT_RETRIES", "Write", "WriteSession"]

_log = logging.getLogger("convmem.session")

MAX_CONFLICT_RETRIES = 20

_GROWS = (AddTurn, AddItems, AdoptTurns)
"""Commands that store turns."""


class _Step:
    """Where a write resumes on the actor's thread after a settle that needs the log read."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_DECIDE = _Step("decide")
"""Decide (rereading the log first when the session is in doubt) and start the append."""
_RETRY = _Step("retry")
"""Another writer came first: reread the log, then decide again (or find our events stored)."""
_RECHECK = _Step("recheck")
"""The log acknowledged other events (it held these ids): reread it; nothing new was stored."""
_CONFIRM = _Step("confirm")
"""The state refused the command: reread the log, which another writer may have moved, and decide again."""
_VERIFY = _Step("verify")
"""A retried command, stored: the log may hold the earlier attempt instead; take the log's state."""


class Write:
    """One write of one session: its command, its caller's answer, and where it stands.

    `reply` is the caller's answer (settled with the stored events, or the
    error); None for the session's own writes (a summary's outcome), whose
    failures are logged. `command_id` is the caller's idempotency key.
    """

    __slots__ = (
        "_appending",
        "_attempts",
        "_base",
        "_confirmed",
        "_events",
        "_id",
        "_opening",
        "_session",
        "_started",
        "_step",
        "command",
        "command_id",
        "reply",
    )

    def __init__(
        self, command: Command, reply: Settle[list[AnyEvent]] | None = None, command_id: str | None = None
    ) -> None:
        self.command = command
        self.reply = reply
        self.command_id = command_id
        self._id = ""
        """The stem of the events' ids, once the write began (the caller's key scoped to the session)."""
        self._step = _DECIDE
        self._opening = False
        self._attempts = 0
        self._confirmed = False
        """A refusal was checked against the log's latest state: the next one is the answer."""
        self._appending = False
        self._session: WriteSession | None = None
        self._base = SessionState()
        self._events: list[AnyEvent] = []
        self._started = 0.0

    def __repr__(self) -> str:
        return f"Write({type(self.command).__name__}, step={self._step!r})"

    # Run by whoever holds the actor ------------------------------------------------------

    def run(self, session: WriteSession) -> None:
        """Take the write on from where it stands, on the thread or loop holding the session's actor."""
        if not self._id:
            if self.reply is not None and not self.reply.set_running_or_notify_cancel():
                return  # its caller gave up before it started
            given = self.command_id
            self._id = command_id_for(session.key, given) if given else new_command_id()
        self._session = session
        try:
            self._go(session, can_read=not session.on_loop)
        except Exception as exc:  # refused (nothing stored), or the log could not be read
            if not isinstance(exc, ConvmemError):
                _log.exception("session %s: unexpected failure", session.key)
            self._end(session, exc)

    def _go(self, session: WriteSession, *, can_read: bool) -> None:
        step = self._step
        if step is not _DECIDE or session.uncertain:
            if not can_read:  # the log is read on the actor's thread, never on an event loop
                session.hold()
                session.requeue(self)
                return
            self._step = _DECIDE
            if self._reread(session, step):
                return
        try:
            self._decide(session)
        except ConvmemError:
            # A refusal stands only against the log's latest state: a session this process keeps
            # live may be behind another process's writes (optimistic concurrency catches a stale
            # append, not a stale refusal). Refusals are rare, so the log is read only for them.
            if self._confirmed:
                raise
            self._confirmed = True
            self._step = _CONFIRM
            self._go(session, can_read=can_read)

    def _reread(self, session: WriteSession, step: _Step) -> bool:
        """Read the log as `step` needs before deciding again; True when the write got its answer.

        When the append was the session's opening, the write goes on to its
        command whatever the log says (the session is open now, by this
        attempt, an earlier one, or another writer).
        """
        opening = self._opening
        if step is _VERIFY:
            stored, state = session.load(), replay(self._events, state=self._base)
            if stored == state:
                session.publish(state, self._events, self._base)
            else:  # the earlier attempt is the truth, and this one stored nothing
                session.adopt(stored)
            if not opening:
                self._end(session, self._events if stored == state else [])
            return not opening
        if step is _CONFIRM and not session.uncertain and not session.log_moved_on():
            return False  # nobody else wrote: deciding again on this state refuses again
        session.reload()
        session.uncertain = False
        if opening:
            return False
        if step is _RECHECK:
            self._end(session, [])  # the log held these events already: a retry stores nothing
            return True
        unmoved = session.state.version == self._base.version
        if step is _RETRY and unmoved and session.already_stored(self._events):
            # Nobody else wrote: the log kept some of these event ids from an earlier attempt of this
            # command (a retry whose decision has changed since).
            self._end(session, [])
            return True
        return False

    def _decide(self, session: WriteSession) -> None:
        state = session.state
        command, command_id = self.command, self._id
        self._opening = not state.started and not isinstance(command, StartSession)
        if self._opening:
            # Open the session on its own: a lone event is one plain publish, where the two events
            # of an opening decision would be an atomic batch (fsynced by the server). Deciding the
            # whole command first keeps its refusals before anything is stored.
            session.decide(state, command, command_id)
            command, command_id = session.opening(), command_id + ".start"
        events = session.decide(state, command, command_id)
        if not events:
            self._end(session, [])
            return
        self._base, self._events = state, events
        self._started = time.perf_counter()
        self._appending = True
        session.hold()
        try:
            session.start_append(events, state.version, self)
        except Exception as exc:  # refused before it started (a closed log, bad input): not stored
            if self._appending:
                self.set_exception(exc)
        except BaseException:  # the caller's interrupt (it stops the actor): nothing to settle
            self._appending = False
            session.let_go()
            raise

    # The log settles the append (from whichever thread learns of it) -----------------------

    def set_running_or_notify_cancel(self) -> bool:
        """The append starts (a write is never cancelled once it is decided)."""
        return True

    def done(self) -> bool:
        """Whether the append under way was settled."""
        return not self._appending

    def cancel(self) -> bool:
        """The append will never start (the log closed first): the write fails."""
        self.set_exception(SessionClosed("the event log closed before the write's append started"))
        return True

    def set_result(self, last: int, /) -> None:
        """The log stored the events; the session's last seq is `last`."""
        session = self._settled()
        if session is None:
            return
        try:
            events = self._events
            attempt = self._attempt_id()
            if last != events[-1].seq:
                self._resume(session, _RECHECK)  # the log already held these event ids (a retry)
                return
            session.metrics.observe_append(time.perf_counter() - self._started)
            if session.in_doubt(attempt):
                session.settle_doubt(attempt)
                self._resume(session, _VERIFY)
                return
            session.publish(replay(events, state=self._base), events, self._base)
            if self._opening:
                self._go(session, can_read=False)  # the session is open: now the command, right here
                session.let_go()
                return
        except Exception as exc:  # the last line of defence, as a handler's
            _log.exception("session %s: finishing a write failed", session.key)
            self._end(session, exc, held=True)
            return
        self._end(session, events, held=True)

    def set_exception(self, exception: BaseException, /) -> None:
        """The append failed: a conflict is tried again; anything else is the caller's error."""
        session = self._settled()
        if session is None:
            return
        error = (
            exception
            if isinstance(exception, Exception)
            else SessionClosed(f"append cut short ({exception!r})")
        )
        if isinstance(error, ConcurrencyConflict):
            session.metrics.count("conflicts")
            self._attempts += 1
            if self._attempts < MAX_CONFLICT_RETRIES:
                self._resume(session, _RETRY)
                return
            error = ConcurrencyConflict(
                key=session.key.composite(), expected_seq=self._base.version, actual_seq=-1
            )
        else:
            session.uncertain = True  # it may have been stored anyway
            session.doubt(self._attempt_id())
        self._end(session, error, held=True)

    def _settled(self) -> WriteSession | None:
        """The session, once per append: None when the append was settled already (or none is under way)."""
        if not self._appending:
            return None
        self._appending = False
        return self._session

    # Ends -------------------------------------------------------------------------------

    def _attempt_id(self) -> str:
        return self._id + ".start" if self._opening else self._id

    def _resume(self, session: WriteSession, step: _Step) -> None:
        """Go on at `step` on the actor's thread, as its next message (it reads the log)."""
        self._step = step
        session.requeue(self)

    def _end(self, session: WriteSession, outcome: list[AnyEvent] | Exception, *, held: bool = False) -> None:
        """Let the session schedule what follows, let go of it when this write `held` it, answer the caller.

        The answer goes last: a caller that writes again at once finds the session free.
        """
        failed = isinstance(outcome, Exception)
        if failed:
            session.metrics.count(f"write_errors.{type(outcome).__name__}")
        else:
            session.metrics.count(f"writes.{type(self.command).__name__}")
        session.written(grew=not failed and bool(outcome) and isinstance(self.command, _GROWS))
        if held:
            session.let_go()
        reply = self.reply
        if reply is None:
            if failed:
                _log.warning(
                    "session %s: %s not stored: %s", session.key, type(self.command).__name__, outcome
                )
        elif reply.done():
            pass  # answered already (the caller's answer was cancelled: it gave up waiting)
        elif isinstance(outcome, Exception):
            reply.set_exception(outcome)
        else:
            reply.set_result(outcome)
