"""Decisions: a command, the current state and `now` in; the events to store out.

Nothing here stores anything or reads a clock. The runtime appends what a
decision returns and folds it with `evolve` only after the log acknowledged
it, so every prefix of a decision's events must itself be a valid history.

`decide` opens a session that has not started, then matches the command: the
content commands (turns, items, clear, restore, adopted turns) are decided
here; a summarizer's outcome goes through the health machine (`_transitions`).
"""

from __future__ import annotations

from typing import assert_never

import msgspec

from convmem.errors import InvalidInput, MemoryBudgetExceeded
from convmem.events import (
    MAX_TURN_ITEMS,
    AnyEvent,
    ItemPopped,
    ItemsAdded,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    SessionCleared,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    TurnsAdopted,
)
from convmem.projections._budget import TokenEstimator, default_token_estimator
from convmem.projections._commands import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Clear,
    Command,
    EventIds,
    PopItem,
    Restore,
    StartSession,
    SummaryFailed,
    SummarySucceeded,
)
from convmem.projections._context import over_budget
from convmem.projections._evolve import _turns_added, evolve, replay
from convmem.projections._health import SURROGATE
from convmem.projections._idempotency import already_applied
from convmem.projections._state import SessionState
from convmem.projections._transitions import (
    health_changed,
    storable,
    summary_failed,
    summary_succeeded,
    trim_backlog,
)

__all__ = ["Decision", "decide", "decide_folded"]


class Decision(msgspec.Struct, frozen=True):
    """What `decide_folded` returns: the events, and the state they fold the given state into."""

    events: list[AnyEvent]
    state: SessionState
    """``replay(events, state=given)``: the state the log will hold once it stored `events`."""


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
    A repeat of a keyed write that the session remembers (`command_id_for`) decides nothing.
    """
    return _decided(state, command, now, command_id, key, config, estimator)[0]


def decide_folded(
    state: SessionState,
    command: Command,
    *,
    now: float,
    command_id: str,
    key: MemoryKey | None = None,
    config: ShortTermMemoryConfig | None = None,
    estimator: TokenEstimator = default_token_estimator,
) -> Decision:
    """`decide`, with the state its events fold `state` into (what an acknowledgement makes the session's).

    A decision folds most of its events already (a new turn's budget is checked on
    the state after it): those are not folded twice, so a write evolves its state
    once, on deciding, rather than again when the log acknowledged it.
    """
    events, folded, through = _decided(state, command, now, command_id, key, config, estimator)
    if through < len(events):
        folded = replay(events[through:], state=folded)
    return Decision(events, folded)


def _decided(
    state: SessionState,
    command: Command,
    now: float,
    command_id: str,
    key: MemoryKey | None,
    config: ShortTermMemoryConfig | None,
    estimator: TokenEstimator,
) -> tuple[list[AnyEvent], SessionState, int]:
    """The events, and the given state folded through the first `through` of them (the rest are not)."""
    if not command_id:
        raise InvalidInput("command_id", "must not be empty")
    if already_applied(state.idempotency_keys, state.key, command_id):
        return [], state, 0  # a retry of a keyed write the session stored already, however long ago
    ids = EventIds(command_id, state.version)
    events: list[AnyEvent] = []
    if not state.started and isinstance(command, SummarySucceeded | SummaryFailed):
        return [], state, 0  # a result for a session that no longer exists (erased) is stale
    if not state.started:
        opened = _opening(command, ids, now, key, config)
        events.append(opened)
        state = evolve(state, opened)
    folded, through = state, len(events)
    match command:
        case StartSession():
            pass
        case AddTurn():
            seq, event_id = ids.next("turn.added")
            added = TurnAdded(seq=seq, event_id=event_id, at=now, index=state.next_index, turn=command.turn)
            folded = _grow(state, added, ids, now, estimator, events)
            through += 1
        case AddItems():
            _check_item_count(len(command.items))
            seq, event_id = ids.next("items.added")
            items = ItemsAdded(
                seq=seq, event_id=event_id, at=now, items=command.items, first_index=state.next_index
            )
            folded = _grow(state, items, ids, now, estimator, events)
            _refuse_oversized_turn(folded)
            through += 1
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
            events.extend(_clear(state, command.reason, ids, now, command.moved_to, command.config))
        case Restore():
            events.extend(_restore(state, command, ids, now, estimator))
        case AdoptTurns():
            folded = _adopt(state, command, ids, now, estimator, events)
            through += 1
        case SummarySucceeded():
            events.extend(summary_succeeded(state, command, ids, now, estimator))
        case SummaryFailed():
            events.extend(summary_failed(state, command.request, command.reason, ids, now))
        case _:
            assert_never(command)
    return events, folded, through


def _opening(
    command: Command, ids: EventIds, now: float, key: MemoryKey | None, config: ShortTermMemoryConfig | None
) -> SessionStarted:
    """The event that starts a session: the command's own start, or `key` and `config`."""
    start = command if isinstance(command, StartSession) else None
    start_key = start.key if start else key
    start_config = start.config if start else config
    if start_key is None or start_config is None:
        raise InvalidInput("key", "a session that has not started needs a key and a config")
    seq, event_id = ids.next("session.started")
    return SessionStarted(
        seq=seq,
        event_id=event_id,
        at=now,
        key=start_key,
        config=start_config,
        injected_summary=start.injected_summary if start else None,
        injected_from=start.injected_from if start else None,
    )


# Turns ---------------------------------------------------------------------------


def _grow(
    state: SessionState,
    added: TurnAdded | ItemsAdded,
    ids: EventIds,
    now: float,
    estimator: TokenEstimator,
    events: list[AnyEvent],
) -> SessionState:
    """Store new content: refused under the ``error`` policy when over budget; trims a DEGRADED backlog.

    Appends the events to `events`; returns the state after `added` (the trim is not folded in).
    """
    # A turn: `evolve`'s own fold of it, less its order checks (it is the next seq of a started
    # session). Items: `evolve`, which also validates item turns (a result needs its call first).
    after = _turns_added(state, (added,)) if isinstance(added, TurnAdded) else evolve(state, added)
    _refuse_over_budget(after, estimator)
    events.append(added)
    trimmed = trim_backlog(after, ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return after


def _check_item_count(count: int) -> None:
    if not count:
        raise InvalidInput("items", "must not be empty")
    if count > MAX_TURN_ITEMS:
        raise InvalidInput("items", f"{count} items in one write, over {MAX_TURN_ITEMS}: write them in parts")


def _refuse_oversized_turn(state: SessionState) -> None:
    """The last turn may hold at most `MAX_TURN_ITEMS` items (only the last one grows by a write)."""
    if state.turns and len(state.turns[-1].turn.items) > MAX_TURN_ITEMS:
        raise InvalidInput(
            "items",
            f"the turn would hold {len(state.turns[-1].turn.items)} items, over {MAX_TURN_ITEMS}; "
            "a user message opens the next turn",
        )


def _refuse_over_budget(state: SessionState, estimator: TokenEstimator) -> None:
    tokens = over_budget(state, estimator)
    if tokens is not None:
        raise MemoryBudgetExceeded(tokens=tokens, budget=state.config.budget.total_max_tokens)


def _clear(
    state: SessionState,
    reason: str,
    ids: EventIds,
    now: float,
    moved_to: MemoryKey | None = None,
    config: ShortTermMemoryConfig | None = None,
) -> list[AnyEvent]:
    events: list[AnyEvent] = []
    if state.health is not MemoryHealth.HEALTHY:
        healed = health_changed(state, MemoryHealth.HEALTHY, "session cleared", 0, ids, now)
        events.append(healed)
        state = evolve(state, healed)
    seq, event_id = ids.next("session.cleared")
    events.append(
        SessionCleared(
            seq=seq,
            event_id=event_id,
            at=now,
            cleared_through=state.next_index - 1,
            reason=storable(reason),
            moved_to=moved_to,
            config=config,
        )
    )
    return events


def _restore(
    state: SessionState, command: Restore, ids: EventIds, now: float, estimator: TokenEstimator
) -> list[AnyEvent]:
    if "\x00" in command.summary:
        raise InvalidInput("summary", "contains a NUL character")
    if SURROGATE.search(command.summary):
        raise InvalidInput("summary", "contains a lone surrogate, which cannot be stored")
    events: list[AnyEvent] = []
    if state.health is not MemoryHealth.HEALTHY:
        healed = health_changed(state, MemoryHealth.HEALTHY, "session restored", 0, ids, now)
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
        origin=storable(command.origin),
    )
    _refuse_over_budget(evolve(state, restored), estimator)
    events.append(restored)
    return events


def _adopt(
    state: SessionState,
    command: AdoptTurns,
    ids: EventIds,
    now: float,
    estimator: TokenEstimator,
    events: list[AnyEvent],
) -> SessionState:
    """Append moved turns; under the ``error`` policy refused, like a restore, when over budget.

    Appends the events to `events`; returns the state after the adoption (a trim is not folded in).
    """
    if command.source == state.key:
        raise InvalidInput("source", "a session cannot adopt its own turns")
    source_seq = command.source_seq
    if isinstance(source_seq, bool) or not isinstance(source_seq, int) or not 1 <= source_seq <= 2**63 - 1:
        # past 2**63 - 1 the event could not be encoded: a bare OverflowError, not the caller's error
        raise InvalidInput(
            "source_seq", f"must be a whole number from 1 to 2**63 - 1, got {source_seq!r:.60}"
        )
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
    events.append(adopted)
    trimmed = trim_backlog(after, ids, now)
    if trimmed is not None:
        events.append(trimmed)
    return after
