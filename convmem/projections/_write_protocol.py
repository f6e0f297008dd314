"""The write protocol: one write of a session as a pure step machine.

Every rule of a write lives here; whoever carries it out (`SessionActor`)
only does what each step's effect says and reports what happened. Four steps,
each returning the pending write and ONE effect:

    begin(state, command, ...)                  -> the first effect
    acknowledged(pending, last_seq)             -> the log stored the append
    failed(pending, error)                      -> the append failed
    reread(pending, log_state, stored_ids)      -> the log was read, as asked

and three effects:

    Append(events, after)   append these events after this session seq
    ReadLog(reason)         read the log (the session's state, or which of `ids` it holds)
    Done(answer)            the write is over: its answer is what was stored, or the error

Every effect also carries the session's `state` as the write knows it now and,
when the log just stored something, the `published` transition to tell
listeners about; the carrier makes both the session's before anything else.

The rules:

- **Decide, then append after the expected sequence.** The command is decided
  on the state; its events are appended after the state's version. Nothing
  decided: done, nothing stored.
- **Evolve on acknowledgement.** The state changes only by folding
  acknowledged events, so it always equals a replay of the log. The fold is
  the decision's own (`decide_folded` folds its events as it checks them),
  taken once the log acknowledged them: a write evolves its state once.
- **Reread on conflict, up to `MAX_CONFLICT_RETRIES` attempts.** Another
  writer came first: read the log and decide again. When the log did not
  move past the state this write decided on, the log may hold some of our
  ids from an earlier attempt of this command: ask which; any held means
  nothing new is stored.
- **Recheck when the log held our ids.** An acknowledgement of other events
  than ours (the log kept these ids already: a retry) rereads the log and
  answers that nothing was stored.
- **Confirm a refusal against the newest log.** A refusal stands only
  against the log's latest state (a session kept live may be behind another
  process's writes): the log is read (unless its last seq is still the
  state's and nothing is in doubt) and the command decided once more.
- **Doubt.** An append that failed without an answer may have been stored:
  the session is uncertain (its next write reads the log before deciding) and
  the attempt's id is remembered (the newest `DOUBTS_KEPT`).
- **Verify a retried command that was in doubt.** When an attempt whose id
  is in doubt is acknowledged, the log may hold the earlier attempt instead:
  the log's state is the truth; if it differs from ours, nothing was stored.
- **Open a new session first.** A command on a session that has not started
  is decided whole (its refusals come before anything is stored), then the
  session's `StartSession` is appended on its own (id ``<command id>.start``),
  and once that is acknowledged the command is decided on the opened state
  and appended: two appends, one write.

No I/O, no time, no randomness: `decide` and `opening` are given by the
carrier (the actor's `decide` with its clock, and the session's opening).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import msgspec

from convmem.errors import ConcurrencyConflict, ConvmemError, InternalError, SessionClosed
from convmem.events import AnyEvent, MemoryKey
from convmem.projections._commands import AddItems, AddTurn, AdoptTurns, Command, StartSession
from convmem.projections._decide import Decision
from convmem.projections._state import SessionState

__all__ = [
    "DOUBTS_KEPT",
    "MAX_CONFLICT_RETRIES",
    "NO_DOUBTS",
    "Append",
    "Decider",
    "Done",
    "Doubts",
    "Effect",
    "PendingWrite",
    "Published",
    "ReadLog",
    "Reason",
    "Step",
    "acknowledged",
    "begin",
    "failed",
    "reread",
]

MAX_CONFLICT_RETRIES = 20
"""Appends a write tries in all before a conflict is its answer."""

DOUBTS_KEPT = 1024
"""Attempts in doubt a session remembers (the oldest are forgotten)."""

_GROWS = (AddTurn, AddItems, AdoptTurns)
"""Commands that store turns."""

Decider = Callable[[SessionState, Command, str], Decision]
"""`decide_folded(state, command, command_id)` with the carrier's clock and services: the events and
the state they fold `state` into, or a refusal."""


class Reason(enum.Enum):
    """Why a write reads the log."""

    DOUBT = "doubt"
    """An earlier append failed without an answer: the log may hold more than the state shows."""
    CONFLICT = "conflict"
    """Another writer came first: read the state, then decide again."""
    STORED_IDS = "stored ids"
    """After a conflict on an unmoved log: which of our event ids does it hold (an earlier attempt)?"""
    RECHECK = "recheck"
    """The log acknowledged other events than ours (it held these ids): nothing new was stored."""
    CONFIRM = "confirm"
    """The state refused the command: decide once more on the newest log."""
    VERIFY = "verify"
    """An attempt in doubt was acknowledged: the log may hold the earlier attempt instead."""


class Doubts(msgspec.Struct, frozen=True):
    """What a session keeps between writes about appends that failed without an answer."""

    uncertain: bool = False
    """The log may hold more than the state shows: the next write reads it before deciding."""
    ids: tuple[str, ...] = ()
    """Attempts (event id stems) whose append failed without an answer, oldest first."""

    def doubt(self, attempt: str) -> Doubts:
        kept = tuple(i for i in self.ids if i != attempt)[-(DOUBTS_KEPT - 1) :]
        return Doubts(True, (*kept, attempt))

    def settle(self, attempt: str) -> Doubts:
        return Doubts(self.uncertain, tuple(i for i in self.ids if i != attempt))

    def read(self) -> Doubts:
        """The log was read: the state is the log's, nothing more is uncertain."""
        return self if not self.uncertain else Doubts(False, self.ids)


NO_DOUBTS = Doubts()
"""A session with nothing in doubt."""


class Published(msgspec.Struct, frozen=True):
    """The log stored `events`, taking the session from `old` to `new`: tell who listens."""

    old: SessionState
    new: SessionState
    events: list[AnyEvent]


class Append(msgspec.Struct, frozen=True):
    """Append `events` after the session's seq `after` (the append may be settled before it returns)."""

    events: list[AnyEvent]
    after: int
    state: SessionState
    published: Published | None = None


class ReadLog(msgspec.Struct, frozen=True):
    """Read the log for `reason`: the session's state, or, with `ids`, which of them the log holds.

    With `unless_at`, the carrier may skip the read when the log's last seq is
    still `unless_at`, and report the state it has as the log's.
    """

    reason: Reason
    state: SessionState
    published: Published | None = None
    ids: frozenset[str] | None = None
    unless_at: int | None = None


class Done(msgspec.Struct, frozen=True):
    """The write is over: `answer` is what was stored (maybe nothing), or the error."""

    answer: list[AnyEvent] | Exception
    state: SessionState
    doubts: Doubts
    published: Published | None = None
    grew: bool = False
    """Turns were stored (a summary may fall due)."""


Effect = Append | ReadLog | Done


class PendingWrite(msgspec.Struct, frozen=True):
    """One write on its way: its command, what it knows of the session, and the append under way."""

    key: MemoryKey
    command: Command
    command_id: str
    """The stem of its events' ids (the caller's key scoped to the session, or a fresh one)."""
    decide: Decider
    opening: Callable[[], StartSession]
    """The command that starts the session (with its configuration)."""
    state: SessionState
    doubts: Doubts
    base: SessionState = msgspec.field(default_factory=SessionState)
    """The state the append under way is after."""
    events: list[AnyEvent] = msgspec.field(default_factory=list)
    """The events of the append under way."""
    after: SessionState = msgspec.field(default_factory=SessionState)
    """`base` with `events` folded in (the decision's): the state once the append is stored."""
    opens: bool = False
    """The append under way is the session's opening."""
    attempts: int = 0
    """Appends that met a conflict."""
    confirmed: bool = False
    """A refusal was checked against the log's newest state: the next one is the answer."""
    reading: Reason | None = None
    """Why the log is being read (the `ReadLog` under way)."""

    @property
    def attempt(self) -> str:
        """The id stem of the append under way (the opening's is the command's plus ``.start``)."""
        return self.command_id + ".start" if self.opens else self.command_id


Step = tuple[PendingWrite, Effect]


def begin(
    state: SessionState,
    command: Command,
    *,
    key: MemoryKey,
    command_id: str,
    decide: Decider,
    opening: Callable[[], StartSession],
    doubts: Doubts = NO_DOUBTS,
) -> Step:
    """Start a write of `command` on `state`: read the log first when in doubt, else decide.

    The common write (a started session, nothing uncertain) takes the fast lane, `_begin_started`:
    the very step `_begin_general` takes for it (``tests/test_write_protocol.py`` checks the two
    give equal writes and effects), its pending write made once instead of made and then replaced.
    """
    if state.started and not doubts.uncertain:
        return _begin_started(state, command, key, command_id, decide, opening, doubts)
    return _begin_general(state, command, key, command_id, decide, opening, doubts)


def _begin_general(
    state: SessionState,
    command: Command,
    key: MemoryKey,
    command_id: str,
    decide: Decider,
    opening: Callable[[], StartSession],
    doubts: Doubts,
) -> Step:
    """`begin` for any write: the rules as written (`_decide`)."""
    pending = PendingWrite(key, command, command_id, decide, opening, state, doubts)
    if doubts.uncertain:
        return _read(pending, Reason.DOUBT, None)
    return _decide(pending, None)


def _begin_started(
    state: SessionState,
    command: Command,
    key: MemoryKey,
    command_id: str,
    decide: Decider,
    opening: Callable[[], StartSession],
    doubts: Doubts,
) -> Step:
    """`_begin_general` where the session has started and nothing is uncertain (so nothing opens and
    no read comes first): `_decide`'s step with `opens` False, no transition to publish, and the
    pending write built whole. Its refusal and its empty decision end as `_decide`'s do."""
    try:
        decision = decide(state, command, command_id)
    except ConvmemError as refusal:
        return _refused(PendingWrite(key, command, command_id, decide, opening, state, doubts), refusal, None)
    events = decision.events
    if not events:
        return _done(PendingWrite(key, command, command_id, decide, opening, state, doubts), [], None)
    pending = PendingWrite(
        key, command, command_id, decide, opening, state, doubts, state, events, decision.state
    )
    return pending, Append(events, state.version, state, None)


def acknowledged(pending: PendingWrite, last_seq: int) -> Step:
    """The log stored the append under way; the session's last seq is `last_seq`."""
    events = pending.events
    if last_seq != events[-1].seq:  # the log already held these event ids (a retry)
        return _read(pending, Reason.RECHECK, None)
    if pending.doubts.ids and (attempt := pending.attempt) in pending.doubts.ids:  # (none: not asked)
        pending = msgspec.structs.replace(pending, doubts=pending.doubts.settle(attempt))
        return _read(pending, Reason.VERIFY, None)
    new = pending.after  # folded once, by the decision
    published = Published(pending.base, new, events)
    pending = msgspec.structs.replace(pending, state=new)
    if pending.opens:  # the session is open: now the command
        if pending.doubts.uncertain:
            return _read(pending, Reason.DOUBT, published)
        return _decide(pending, published)
    return _done(pending, events, published)


def failed(pending: PendingWrite, error: BaseException) -> Step:
    """The append under way failed: a conflict is tried again; anything else is the answer, in doubt."""
    if not isinstance(error, Exception):
        error = SessionClosed(f"append cut short ({error!r})")
    if isinstance(error, ConcurrencyConflict):
        attempts = pending.attempts + 1
        pending = msgspec.structs.replace(pending, attempts=attempts)
        if attempts < MAX_CONFLICT_RETRIES:
            return _read(pending, Reason.CONFLICT, None)
        error = ConcurrencyConflict(
            key=pending.key.composite(), expected_seq=pending.base.version, actual_seq=-1
        )
    else:  # it may have been stored anyway
        pending = msgspec.structs.replace(pending, doubts=pending.doubts.doubt(pending.attempt))
    return _done(pending, error, None)


def reread(
    pending: PendingWrite, log_state: SessionState | None, stored_ids: frozenset[str] | None = None
) -> Step:
    """The log was read as the last `ReadLog` asked: its state of the session, or which ids it holds.

    When the append was the session's opening, the write goes on to its
    command whatever the log says (the session is open now, by this attempt,
    an earlier one, or another writer).
    """
    reason = pending.reading
    if reason is Reason.STORED_IDS:
        if stored_ids is None:
            raise InternalError("a read of stored ids must report them")
        if stored_ids:  # the log kept some of these ids from an earlier attempt: nothing new stored
            return _done(pending, [], None)
        return _decide(pending, None)
    if log_state is None:
        raise InternalError(f"a read for {reason} must report the log's state")
    if reason is Reason.VERIFY:
        mine = pending.after
        published = None
        if log_state == mine:
            published = Published(pending.base, mine, pending.events)
        pending = msgspec.structs.replace(pending, state=log_state if published is None else mine)
        if pending.opens:
            return _decide(pending, published)
        return _done(pending, pending.events if published is not None else [], published)
    pending = msgspec.structs.replace(pending, state=log_state, doubts=pending.doubts.read())
    if pending.opens:
        return _decide(pending, None)
    if reason is Reason.RECHECK:  # the log held these events already: a retry stores nothing
        return _done(pending, [], None)
    if reason is Reason.CONFLICT and log_state.version == pending.base.version:
        return _read(pending, Reason.STORED_IDS, None, ids=frozenset(e.event_id for e in pending.events))
    return _decide(pending, None)


def _decide(pending: PendingWrite, published: Published | None) -> Step:
    state = pending.state
    command, command_id = pending.command, pending.command_id
    opens = not state.started and not isinstance(command, StartSession)
    try:
        if opens:
            # Open the session on its own: a lone event is one plain publish, where the two events
            # of an opening decision would be an atomic batch. Deciding the whole command first
            # keeps its refusals before anything is stored.
            pending.decide(state, command, command_id)
            command, command_id = pending.opening(), command_id + ".start"
        decision = pending.decide(state, command, command_id)
        events = decision.events
    except ConvmemError as refusal:
        return _refused(msgspec.structs.replace(pending, opens=opens), refusal, published)
    if not events:
        return _done(pending, [], published)
    pending = msgspec.structs.replace(
        pending, base=state, events=events, after=decision.state, opens=opens, reading=None
    )
    return pending, Append(events, state.version, state, published)


def _refused(pending: PendingWrite, refusal: ConvmemError, published: Published | None) -> Step:
    """The state refused the command: confirmed once against the newest log, then the answer."""
    if pending.confirmed:
        return _done(pending, refusal, published)
    pending = msgspec.structs.replace(pending, confirmed=True)
    # Refusals are rare, so the log is read only for them (and only when it moved on).
    unless = None if pending.doubts.uncertain else pending.state.version
    return _read(pending, Reason.CONFIRM, published, unless_at=unless)


def _read(
    pending: PendingWrite,
    reason: Reason,
    published: Published | None,
    *,
    ids: frozenset[str] | None = None,
    unless_at: int | None = None,
) -> Step:
    pending = msgspec.structs.replace(pending, reading=reason)
    return pending, ReadLog(reason, pending.state, published, ids, unless_at)


def _done(pending: PendingWrite, answer: list[AnyEvent] | Exception, published: Published | None) -> Step:
    grew = not isinstance(answer, Exception) and bool(answer) and isinstance(pending.command, _GROWS)
    return pending, Done(answer, pending.state, pending.doubts, published, grew)
