"""Decisions: a command, the current state and `now` in; the events to store out.

Nothing here stores anything or reads a clock. The runtime appends what a
decision returns and folds it with `evolve` only after the log acknowledged
it, so every prefix of a decision's events must itself be a valid history.

The health machine (the RFC's, with every interval a setting)::

    HEALTHY --fail--> RETRY(1) --fail--> ... RETRY(n) --fail--> DEGRADED
       ^                 |                                   |  probe every
       |              success                                |  degraded_retry_seconds
       +-----------------+                                   v
       +------ pending drained ------ RECOVERING <--success--+
                                          |--fail--> DEGRADED

Every transition, a failed DEGRADED probe included, is a `HealthChanged`
event, so a replay knows when the next retry is due.
"""

from __future__ import annotations

import msgspec

from convmem.errors import InvalidInput, MemoryBudgetExceeded
from convmem.events import (
    AnyEvent,
    BacklogTrimmed,
    ConversationTurn,
    HealthChanged,
    ItemPopped,
    ItemsAdded,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    SummaryProduced,
    TurnAdded,
    TurnsAdopted,
)
from convmem.projections._budget import TokenEstimator, default_token_estimator, full_tokens
from convmem.projections._evolve import evolve
from convmem.projections._health import (
    SURROGATE,
    SummaryRequest,
    is_stale,
    next_due_at,
    summarizable,
    summary_due,
    summary_problem,
    summary_zone,
)
from convmem.projections._state import SessionState

__all__ = [
    "AddItems",
    "AddTurn",
    "AdoptTurns",
    "Clear",
    "Command",
    "PopItem",
    "Restore",
    "StartSession",
    "SummaryFailed",
    "SummaryRequest",
    "SummarySucceeded",
    "decide",
    "next_due_at",
    "summary_due",
    "summary_problem",
]


class StartSession(msgspec.Struct, frozen=True, kw_only=True):
    """Open a session explicitly (the first other command opens it implicitly)."""

    key: MemoryKey
    config: ShortTermMemoryConfig
    injected_summary: str | None = None
    injected_from: MemoryKey | None = None


class AddTurn(msgspec.Struct, frozen=True, kw_only=True):
    """Store a completed turn."""

    turn: ConversationTurn


class AddItems(msgspec.Struct, frozen=True, kw_only=True):
    """Store agent items as they arrive (see `ItemsAdded`)."""

    items: tuple[MessageItem, ...]


class PopItem(msgspec.Struct, frozen=True, kw_only=True):
    """Remove the session's last item (nothing happens on an empty session)."""


class Clear(msgspec.Struct, frozen=True, kw_only=True):
    """Forget the session's turns and summary (they stay in the log).

    `moved_to` records that the turns were moved to that session (the end of a move);
    `through` refuses the clear (`InvalidInput`) when the session holds turns numbered
    above it, i.e. turns that arrived after the mover read the session.
    """

    reason: str = "cleared by caller"
    moved_to: MemoryKey | None = None
    through: int | None = None


class AdoptTurns(msgspec.Struct, frozen=True, kw_only=True):
    """Append turns moved here from `source` (its events up to `source_seq`); see `TurnsAdopted`."""

    source: MemoryKey
    source_seq: int
    turns: tuple[ConversationTurn, ...]


class Restore(msgspec.Struct, frozen=True, kw_only=True):
    """Replace the session's content with a `to_dict()` export's (see `parse_export`).

    A restored session starts HEALTHY: its pending turns are summarized afresh.
    """

    summary: str
    turns: tuple[ConversationTurn, ...]
    origin: str = ""


class SummarySucceeded(msgspec.Struct, frozen=True, kw_only=True):
    """The summarizer answered `request` with `summary` (not yet validated)."""

    request: SummaryRequest
    summary: str


class SummaryFailed(msgspec.Struct, frozen=True, kw_only=True):
    """The summarizer failed on `request` (exception, timeout, bad output)."""

    request: SummaryRequest
    reason: str


Command = (
    StartSession
    | AddTurn
    | AddItems
    | PopItem
    | Clear
    | Restore
    | AdoptTurns
    | SummarySucceeded
    | SummaryFailed
)


def _storable(text: str) -> str:
    """`text` with lone surrogates replaced: reasons come from exception messages."""
    return text.encode("utf-8", "replace").decode("utf-8") if SURROGATE.search(text) else text


class _Ids:
    """Event ids and seqs for one decision: ``{command_id}/{tag}/{k}``, seqs after `version`."""

    def __init__(self, command_id: str, version: int) -> None:
        self._command_id = command_id
        self._n = 0
        self._kinds: dict[str, int] = {}
        self.seq = version

    def mark(self) -> tuple[int, int, dict[str, int]]:
        return self._n, self.seq, dict(self._kinds)

    def reset(self, mark: tuple[int, int, dict[str, int]]) -> None:
        self._n, self.seq, kinds = mark
        self._kinds = dict(kinds)

    def next(self, tag: str) -> tuple[int, str]:
        """The next seq, and an id naming the event's kind: a retried command's events
        get the same ids kind by kind, even when the retry decides fewer events."""
        self._n += 1
        self.seq += 1
        self._kinds[tag] = self._kinds.get(tag, 0) + 1
        return self.seq, f"{self._command_id}/{tag}/{self._kinds[tag]}"


def decide(
    state: SessionState,
    command: Command,
    *,
    now: float,
    command_id: str,
    key: MemoryKey | None = None,
    config: ShortTermMemoryConfig | None = None,
    estimator: TokenEstimator = default_token_estimator,
) -> list[AnyEvent]:
    """The events that `command` produces on `state` at `now`.

    A session that has not started is opened first with `key` and `config`
    (or the command's own, for `StartSession`). Raises `MemoryBudgetExceeded`
    for the ``error`` policy and `InvalidInput` for a command that cannot apply.
    """
    if not command_id:
        raise InvalidInput("command_id", "must not be empty")
    ids = _Ids(command_id, state.version)
    events: list[AnyEvent] = []
    if not state.started and isinstance(command, SummarySucceeded | SummaryFailed):
        return []  # a result for a session that no longer exists (erased) is stale
    if not state.started:
        start = command if isinstance(command, StartSession) else None
        start_key = start.key if start else key
        start_config = start.config if start else config
        if start_key is None or start_config is None:
            raise InvalidInput("key", "a session that has not started needs a key and a config")
        seq, event_id = ids.next("session.started")
        opened = SessionStarted(
            seq=seq,
            event_id=event_id,
            at=now,
            key=start_key,
            config=start_config,
            injected_summary=start.injected_summary if start else None,
            injected_from=start.injected_from if start else None,
        )
        events.append(opened)
        state = evolve(state, opened)
    match command:
        case StartSession():
            pass
        case AddTurn():
            seq, event_id = ids.next("turn.added")
            added = TurnAdded(seq=seq, event_id=event_id, at=now, index=state.next_index, turn=command.turn)
            events.extend(_grow(state, added, ids, now, estimator))
        case AddItems():
            if not command.items:
                raise InvalidInput("items", "must not be empty")
            seq, event_id = ids.next("items.added")
            items = ItemsAdded(
                seq=seq, event_id=event_id, at=now, items=command.items, first_index=state.next_index
            )
            events.extend(_grow(state, items, ids, now, estimator))
        case PopItem():
            if state.turns:
                last = state.turns[-1].turn
                item = (
                    last.items[-1]
                    if last.source == "items"
                    else MessageItem.from_agents(last.agent_items()[-1])
                )
                seq, event_id = ids.next("item.popped")
                events.append(ItemPopped(seq=seq, event_id=event_id, at=now, item=item))
        case Clear():
            if command.through is not None and state.next_index - 1 > command.through:
                raise InvalidInput(
                    "through",
                    f"the session holds turns up to {state.next_index - 1}, after {command.through}",
                )
            events.extend(_clear(state, command.reason, ids, now, command.moved_to))
        case Restore():
            events.extend(_restore(state, command, ids, now, estimator))
        case AdoptTurns():
            events.extend(_adopt(state, command, ids, now, estimator))
        case SummarySucceeded():
            events.extend(_summary_succeeded(state, command, ids, now, estimator))
        case SummaryFailed():
            events.extend(_summary_failed(state, command.request, command.reason, ids, now))
    return events


# Turns ---------------------------------------------------------------------------


def _grow(
    state: SessionState,
    added: TurnAdded | ItemsAdded,
    ids: _Ids,
    now: float,
    estimator: TokenEstimator,
) -> list[AnyEvent]:
    """Store new content: refused under the ``error`` policy when over budget; trims a DEGRADED backlog."""
    after = evolve(state, added)  # also validates item turns (a result needs its call first)
    _refuse_over_budget(after, estimator)
    events: list[AnyEvent] = [added]
    trimmed = _trim_backlog(after, ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return events


def _over_budget(state: SessionState, estimator: TokenEstimator) -> int | None:
    """Tokens of the state's full content when the ``error`` policy refuses it, else None.

    A `total_max_tokens` of 0 sets no budget, so nothing is refused.
    """
    budget = state.config.budget
    if budget.overflow_policy != "error" or state.config.strategy == "none" or not budget.total_max_tokens:
        return None
    tokens = full_tokens(state, estimator)
    return tokens if tokens > budget.total_max_tokens else None


def _refuse_over_budget(state: SessionState, estimator: TokenEstimator) -> None:
    tokens = _over_budget(state, estimator)
    if tokens is not None:
        raise MemoryBudgetExceeded(tokens=tokens, budget=state.config.budget.total_max_tokens)


def _trim_backlog(state: SessionState, ids: _Ids, now: float) -> BacklogTrimmed | None:
    """In DEGRADED, keep at most `recovery_backlog_limit` unsummarized evicted turns."""
    if state.health is not MemoryHealth.DEGRADED or not state.config.summarizes:
        return None
    backlog = state.pending()
    excess = len(backlog) - state.config.recovery_backlog_limit
    if excess <= 0:
        return None
    seq, event_id = ids.next("backlog.trimmed")
    return BacklogTrimmed(
        seq=seq,
        event_id=event_id,
        at=now,
        dropped_through=backlog[excess - 1].index,
        reason=f"backlog over recovery_backlog_limit={state.config.recovery_backlog_limit}",
    )


def _health(
    state: SessionState, new: MemoryHealth, reason: str, attempt: int, ids: _Ids, now: float
) -> HealthChanged:
    seq, event_id = ids.next("health.changed")
    return HealthChanged(
        seq=seq,
        event_id=event_id,
        at=now,
        old=state.health,
        new=new,
        reason=_storable(reason),
        attempt=attempt,
    )


def _clear(
    state: SessionState, reason: str, ids: _Ids, now: float, moved_to: MemoryKey | None = None
) -> list[AnyEvent]:
    events: list[AnyEvent] = []
    if state.health is not MemoryHealth.HEALTHY:
        healed = _health(state, MemoryHealth.HEALTHY, "session cleared", 0, ids, now)
        events.append(healed)
        state = evolve(state, healed)
    seq, event_id = ids.next("session.cleared")
    events.append(
        SessionCleared(
            seq=seq,
            event_id=event_id,
            at=now,
            cleared_through=state.next_index - 1,
            reason=_storable(reason),
            moved_to=moved_to,
        )
    )
    return events


def _restore(
    state: SessionState, command: Restore, ids: _Ids, now: float, estimator: TokenEstimator
) -> list[AnyEvent]:
    if "\x00" in command.summary:
        raise InvalidInput("summary", "contains a NUL character")
    if SURROGATE.search(command.summary):
        raise InvalidInput("summary", "contains a lone surrogate, which cannot be stored")
    events: list[AnyEvent] = []
    if state.health is not MemoryHealth.HEALTHY:
        healed = _health(state, MemoryHealth.HEALTHY, "session restored", 0, ids, now)
        events.append(healed)
        state = evolve(state, healed)
    seq, event_id = ids.next("session.restored")
    restored = SessionRestored(
        seq=seq,
        event_id=event_id,
        at=now,
        summary=command.summary,
        turns=command.turns,
        first_index=state.next_index,
        origin=_storable(command.origin),
    )
    _refuse_over_budget(evolve(state, restored), estimator)
    events.append(restored)
    return events


def _adopt(
    state: SessionState, command: AdoptTurns, ids: _Ids, now: float, estimator: TokenEstimator
) -> list[AnyEvent]:
    """Append moved turns; under the ``error`` policy refused, like a restore, when over budget."""
    if command.source == state.key:
        raise InvalidInput("source", "a session cannot adopt its own turns")
    if command.source_seq < 1:
        raise InvalidInput("source_seq", f"must be >= 1, got {command.source_seq}")
    seq, event_id = ids.next("turns.adopted")
    adopted = TurnsAdopted(
        seq=seq,
        event_id=event_id,
        at=now,
        source=command.source,
        source_seq=command.source_seq,
        turns=command.turns,
        first_index=state.next_index,
    )
    after = evolve(state, adopted)
    _refuse_over_budget(after, estimator)
    events: list[AnyEvent] = [adopted]
    trimmed = _trim_backlog(after, ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return events


# Summaries and the health machine ---------------------------------------------------


def _summary_succeeded(
    state: SessionState,
    result: SummarySucceeded,
    ids: _Ids,
    now: float,
    estimator: TokenEstimator,
) -> list[AnyEvent]:
    request = result.request
    if is_stale(state, request):
        return []
    problem = summary_problem(result.summary, state.config, estimator)
    if problem is not None:
        return _summary_failed(state, request, problem, ids, now)
    mark = ids.mark()
    seq, event_id = ids.next("summary.produced")
    produced = SummaryProduced(
        seq=seq,
        event_id=event_id,
        at=now,
        # summary_max_tokens=0 keeps no summary text; the summary still covers its turns.
        summary=result.summary if state.config.budget.summary_max_tokens else "",
        covers_from=request.covers_from,
        covers_through=request.covers_through,
    )
    events: list[AnyEvent] = [produced]
    after = evolve(state, produced)
    budget = state.config.budget
    if _over_budget(after, estimator) is not None:
        ids.reset(mark)
        return _summary_failed(
            state,
            request,
            f"summary would put the context over total_max_tokens={budget.total_max_tokens}",
            ids,
            now,
        )
    _, trigger = summary_zone(state.config)
    drained = len(summarizable(after)) < trigger
    match state.health:
        case MemoryHealth.HEALTHY:
            pass
        case MemoryHealth.RETRY:
            events.append(_health(after, MemoryHealth.HEALTHY, "summarizer recovered", 0, ids, now))
        case MemoryHealth.DEGRADED:
            recovering = _health(
                after, MemoryHealth.RECOVERING, "summarizer answered a recovery probe", 0, ids, now
            )
            events.append(recovering)
            if drained:
                after = evolve(after, recovering)
                events.append(_health(after, MemoryHealth.HEALTHY, "backlog summarized", 0, ids, now))
        case MemoryHealth.RECOVERING:
            if drained:
                events.append(_health(after, MemoryHealth.HEALTHY, "backlog summarized", 0, ids, now))
    return events


def _summary_failed(
    state: SessionState, request: SummaryRequest, reason: str, ids: _Ids, now: float
) -> list[AnyEvent]:
    if is_stale(state, request) or (request.health, request.attempt) != (state.health, state.attempt):
        return []  # stale, or a late or repeated failure that the health machine already counted
    retries = state.config.retry_attempts
    match state.health:
        case MemoryHealth.HEALTHY:
            if retries >= 1:
                return [_health(state, MemoryHealth.RETRY, reason, 1, ids, now)]
            return _degrade(state, reason, ids, now)
        case MemoryHealth.RETRY:
            if state.attempt < retries:
                return [_health(state, MemoryHealth.RETRY, reason, state.attempt + 1, ids, now)]
            return _degrade(state, reason, ids, now)
        case MemoryHealth.DEGRADED:
            return [_health(state, MemoryHealth.DEGRADED, reason, state.attempt + 1, ids, now)]
        case MemoryHealth.RECOVERING:
            return _degrade(state, reason, ids, now)


def _degrade(state: SessionState, reason: str, ids: _Ids, now: float) -> list[AnyEvent]:
    degraded = _health(state, MemoryHealth.DEGRADED, reason, 1, ids, now)
    events: list[AnyEvent] = [degraded]
    trimmed = _trim_backlog(evolve(state, degraded), ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return events
