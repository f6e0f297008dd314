"""The fold: `evolve(state, event) -> state` and `replay(events) -> state`.

`evolve` is pure and total over the closed set of event types. An event whose
`seq` is not above the state's `version` was already applied and changes
nothing (redelivery is harmless); an event that skips a `seq` raises
`ReplayError`, because a history with a hole cannot be trusted. The
exceptions come from erasure: `SessionErased`, the fence an erasure puts above
the events it removes, may open a history at any seq; and so may the
`SessionStarted` of a session begun again over that fence once the erasure
removed the fence too (a history can only lose what comes before a start by
an erasure); and `HistoryCompacted`, retention's compaction, which carries
the whole state the fold needs and replaces whatever came before it; and
`SessionRepaired`, an operator's repair of a damaged session, which replaces
the state whole with the one it carries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, assert_never

import msgspec

from convmem.errors import EventDecodeError, ReplayError, UnknownEventType
from convmem.events import (
    AnyEvent,
    BacklogTrimmed,
    ConversationTurn,
    HealthChanged,
    HistoryCompacted,
    ItemPopped,
    ItemsAdded,
    MessageItem,
    SessionCleared,
    SessionErased,
    SessionRepaired,
    SessionRestored,
    SessionStarted,
    SummaryProduced,
    TurnAdded,
    TurnsAdopted,
)
from convmem.projections._entities import EntityTable
from convmem.projections._horizon import bound
from convmem.projections._idempotency import key_prefix, remember_key, remember_keys
from convmem.projections._retention import compacted_state
from convmem.projections._serial import decode_state
from convmem.projections._state import SessionState, TurnRecord, rendered_turn_length

__all__ = ["SkippedEvent", "evolve", "replay", "skipped_from_error"]

_RUN_LIMIT = 4096
"""Turns a replay gathers before it folds them in (and retires what passed the horizon)."""

msgspec_replace = msgspec.structs.replace
_NO_ENTITIES = EntityTable()


class SkippedEvent:
    """Stands in a replay for an event this version cannot read (see `replay`).

    With `opens`, it stands for the events up to its seq that the store lost
    (a gap a reader found and reports as damage), so it may follow any lower seq.
    """

    __slots__ = ("opens", "reason", "seq")

    def __init__(self, seq: int, reason: str, *, opens: bool = False) -> None:
        self.seq = seq
        self.reason = reason
        self.opens = opens

    def __repr__(self) -> str:
        return f"SkippedEvent(seq={self.seq}, reason={self.reason!r})"


def _check_order(state: SessionState, event: AnyEvent | SkippedEvent) -> bool:
    """True when the event is new; False when already applied; raises on a gap."""
    if event.seq <= state.version:
        return False
    if isinstance(event, SessionErased | HistoryCompacted | SessionRepaired) or (
        isinstance(event, SkippedEvent) and event.opens
    ):
        return True
    if state.version == 0 and isinstance(event, SessionStarted):
        return True  # a session begun again after an erasure: what came before it was erased
    if event.seq != state.version + 1:
        raise ReplayError(
            f"event seq {event.seq} follows seq {state.version}: "
            f"{event.seq - state.version - 1} event(s) missing"
        )
    return True


def evolve(state: SessionState, event: AnyEvent | SkippedEvent) -> SessionState:
    """Apply one event; returns the same state object for an already applied event."""
    if not _check_order(state, event):
        return state
    if isinstance(event, SkippedEvent):
        return msgspec_replace(state, version=event.seq)
    if isinstance(event, HistoryCompacted):
        if state.key is not None and state.key != event.key:
            raise ReplayError(f"seq {event.seq} compacts session {event.key}, not {state.key}")
        return compacted_state(event)
    if not state.started and not isinstance(event, SessionStarted | SessionErased | SessionRepaired):
        raise ReplayError(f"event seq {event.seq} ({type(event).__name__}) comes before the session started")
    if isinstance(event, TurnAdded):  # the commonest event, by the rule `replay` folds runs of them with
        return _turns_added(state, (event,))
    common: dict[str, Any] = {"version": event.seq, "last_at": max(state.last_at, event.at)}
    keys = _remembered(state, event)
    if keys is not state.idempotency_keys:
        common["idempotency_keys"] = keys
    match event:
        case SessionStarted():
            if state.started:
                raise ReplayError(f"session started twice (seq {event.seq})")
            if state.key is not None and state.key != event.key:
                raise ReplayError(f"seq {event.seq} starts session {event.key}, not {state.key}")
            return msgspec_replace(
                state,
                key=event.key,
                config=event.config,
                started=True,
                health_since=event.at,
                injected_summary=event.injected_summary,
                injected_from=event.injected_from,
                **common,
            )
        case SummaryProduced():
            return bound(
                msgspec_replace(
                    state,
                    summary=event.summary,
                    summary_through=max(state.summary_through, event.covers_through),
                    **common,
                )
            )
        case HealthChanged():
            return msgspec_replace(
                state, health=event.new, attempt=event.attempt, health_since=event.at, **common
            )
        case BacklogTrimmed():
            return bound(
                msgspec_replace(
                    state, dropped_through=max(state.dropped_through, event.dropped_through), **common
                )
            )
        case SessionCleared():
            mark = max(event.cleared_through, state.next_index - 1)
            return msgspec_replace(
                state,
                turns=(),
                summary="",
                summary_through=mark,
                dropped_through=mark,
                next_index=mark + 1,
                retired_entities=_NO_ENTITIES,
                config=event.config if event.config is not None else state.config,
                **common,
            )
        case SessionRestored():
            include, dated = state.config.include_trajectory_digest, state.config.include_turn_dates
            records = tuple(
                TurnRecord(
                    index=event.first_index + i,
                    turn=turn,
                    at=event.at,
                    rendered_len=rendered_turn_length(turn, include_digest=include, include_date=dated),
                )
                for i, turn in enumerate(event.turns)
            )
            mark = event.first_index - 1
            return bound(
                msgspec_replace(
                    state,
                    turns=records,
                    summary=event.summary,
                    summary_through=mark,
                    dropped_through=mark,
                    next_index=event.first_index + len(records),
                    retired_entities=_NO_ENTITIES,
                    **common,
                )
            )
        case TurnsAdopted():
            if event.first_index < state.next_index:
                raise _reused_turn_number(event.first_index, event.seq, state.next_index)
            include = state.config.include_trajectory_digest
            adopted = tuple(
                TurnRecord(
                    index=event.first_index + i,
                    turn=turn,
                    at=event.at,
                    rendered_len=rendered_turn_length(turn, include_digest=include),
                )
                for i, turn in enumerate(event.turns)
            )
            return bound(
                msgspec_replace(
                    state,
                    turns=(*state.turns, *adopted),
                    next_index=event.first_index + len(adopted),
                    **common,
                )
            )
        case SessionErased():
            return SessionState(key=state.key, version=event.seq, last_at=common["last_at"])
        case SessionRepaired():
            return _repaired(state, event)
        case ItemsAdded():
            turns, next_index = _add_items(state, event)
            return bound(msgspec_replace(state, turns=turns, next_index=next_index, **common))
        case ItemPopped():
            return msgspec_replace(state, turns=_pop_item(state), **common)
        case _:
            assert_never(event)


def _remembered(state: SessionState, event: AnyEvent) -> tuple[str, ...]:
    """The session's remembered idempotency keys after `event` (see ``_idempotency``)."""
    if isinstance(event, SessionStarted):
        return remember_key((), event.event_id, key_prefix(event.key), event.config.idempotency_horizon)
    prefix = key_prefix(state.key)
    if not prefix or not event.event_id.startswith(prefix):
        return state.idempotency_keys  # a write without a key: nothing to remember
    return remember_key(state.idempotency_keys, event.event_id, prefix, state.config.idempotency_horizon)


def items_turn(items: tuple[MessageItem, ...]) -> ConversationTurn:
    """The turn that agent items form: its user text, its assistant text, every item."""
    first = items[0]
    user = first.content if first.kind == "message" and first.role == "user" else ""
    said = [i.content for i in items if i.kind == "message" and i.role == "assistant" and i.content]
    return ConversationTurn(
        user_message=user, assistant_response="\n".join(said), items=items, source="items"
    )


def _items_record(state: SessionState, index: int, items: tuple[MessageItem, ...], at: float) -> TurnRecord:
    turn = items_turn(items)
    include, dated = state.config.include_trajectory_digest, state.config.include_turn_dates
    return TurnRecord(
        index=index,
        turn=turn,
        at=at,
        rendered_len=rendered_turn_length(turn, include_digest=include, include_date=dated),
    )


def _joined_record(state: SessionState, last: TurnRecord, joining: list[MessageItem]) -> TurnRecord:
    """`last` (a turn built from items) with the `joining` items: built and checked once per run.

    Rebuilding and checking the whole turn once per joining item made a write of n
    items cost n² (a hostile tenant's 20,000 items held a service worker for
    minutes); once per run it is linear in the turn's items, which `MAX_TURN_ITEMS`
    bounds. The turn is the one item-by-item joining made: `items_turn` of all the
    items, and the first item that breaks a rule is the one named.
    """
    return _items_record(state, last.index, (*last.turn.items, *joining), last.at)


def _add_items(state: SessionState, event: ItemsAdded) -> tuple[tuple[TurnRecord, ...], int]:
    """A user message opens a turn; any other item joins the last turn if it was built from
    items and no summary covers it yet."""
    if event.first_index < state.next_index:
        raise ReplayError(f"item turn number {event.first_index} at seq {event.seq} is reused")
    turns = list(state.turns)
    index = event.first_index
    joining: list[MessageItem] = []  # items that join the last turn, folded in once at the run's end
    for item in event.items:
        opens = item.kind == "message" and item.role == "user"
        # A summarized turn is closed: an item joining it would never be shown again.
        closed = not turns or turns[-1].turn.source != "items" or turns[-1].index <= state.watermark
        if opens or closed:
            if joining:
                turns[-1], joining = _joined_record(state, turns[-1], joining), []
            turns.append(_items_record(state, index, (item,), event.at))
            index += 1
        else:
            joining.append(item)
    if joining:
        turns[-1] = _joined_record(state, turns[-1], joining)
    return tuple(turns), max(index, state.next_index)


def _pop_item(state: SessionState) -> tuple[TurnRecord, ...]:
    """Remove the session's last item; a turn left with no item leaves the context."""
    if not state.turns:
        return state.turns
    last = state.turns[-1]
    if last.turn.source == "items":
        items = last.turn.items[:-1]
    else:
        items = tuple(MessageItem.from_agents(i) for i in last.turn.agent_items())[:-1]
    if not items:
        return state.turns[:-1]
    return (*state.turns[:-1], _items_record(state, last.index, items, last.at))


def _turns_added(state: SessionState, run: Sequence[TurnAdded]) -> SessionState:
    """The state after turns added at the next seqs of a started session: one (`evolve`) or a run.

    `replay` folds a run of them in at once by this same rule: within a run
    the watermarks stand still, so the horizon (`bound`) applied at its end
    retires the turns each event would have retired, in order, and the state
    and its turn tuple are copied once per run rather than once per event.
    """
    config = state.config
    include, dated = config.include_trajectory_digest, config.include_turn_dates
    next_index, last_at = state.next_index, state.last_at
    records = []
    for event in run:
        if event.index < next_index:
            raise _reused_turn_number(event.index, event.seq, next_index)
        records.append(
            TurnRecord(
                index=event.index,
                turn=event.turn,
                at=event.at,
                rendered_len=rendered_turn_length(event.turn, include_digest=include, include_date=dated),
            )
        )
        next_index = event.index + 1
        if event.at > last_at:  # noqa: PLR1730 - max(last_at, at), without max()'s 50 ns call
            last_at = event.at
    keys, prefix = state.idempotency_keys, key_prefix(state.key)
    keyed = [event.event_id for event in run if event.event_id.startswith(prefix)] if prefix else []
    if keyed:
        keys = remember_keys(keys, keyed, prefix, config.idempotency_horizon)
    return bound(
        msgspec_replace(
            state,
            turns=(*state.turns, *records),
            version=run[-1].seq,
            next_index=next_index,
            last_at=last_at,
            idempotency_keys=keys,
        )
    )


def _repaired(state: SessionState, event: SessionRepaired) -> SessionState:
    """The state a repair restored, at the repair's seq."""
    try:
        restored = decode_state(event.state)
    except EventDecodeError as exc:
        raise ReplayError(f"the repair at seq {event.seq} carries no readable state: {exc}") from None
    return msgspec_replace(
        restored, key=state.key or restored.key, version=event.seq, last_at=max(restored.last_at, event.at)
    )


def _reused_turn_number(index: int, seq: int, next_index: int) -> ReplayError:
    return ReplayError(f"turn number {index} at seq {seq} is not above {next_index - 1}")


def replay(
    events: Iterable[AnyEvent | SkippedEvent],
    *,
    state: SessionState | None = None,
    on_skipped: Callable[[SkippedEvent], None] | None = None,
) -> SessionState:
    """`evolve` folded over `events`, from `state` (a snapshot) or from scratch.

    `SkippedEvent` stand-ins advance the version (so no gap is reported) and
    are passed to `on_skipped`; build them from `UnknownEventType` with
    `skipped_from_error`. A run of turns, each at the next seq, goes in at once
    (`_turns_added`, the rule `evolve` applies to each), up to `_RUN_LIMIT` at a time.
    """
    current = state if state is not None else SessionState()
    run: list[TurnAdded] = []
    for event in events:
        if isinstance(event, TurnAdded) and current.started and event.seq == current.version + len(run) + 1:
            run.append(event)
            if len(run) == _RUN_LIMIT:  # folded in now and then: a replay holds about one horizon
                current, run = _turns_added(current, run), []
            continue
        if run:
            current, run = _turns_added(current, run), []
        if isinstance(event, SkippedEvent) and on_skipped is not None and event.seq > current.version:
            on_skipped(event)
        current = evolve(current, event)
    return _turns_added(current, run) if run else current


def skipped_from_error(error: UnknownEventType) -> SkippedEvent:
    """The stand-in for an event of an unknown tag, when its envelope gave its seq."""
    if error.event_seq is None:
        raise ReplayError(f"cannot skip event of unknown type {error.tag!r}: it carries no seq")
    return SkippedEvent(error.event_seq, f"unknown event type {error.tag!r}")
