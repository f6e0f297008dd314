"""The write operations of a session handle, each written once (see `convmem.actors._handles`).

Each checks its arguments and prepares a `_Call`: the command to decide, the
caller's idempotency key, the timeout, and how the stored events read as the
operation's answer. `SessionHandle` runs a call blocking, `AsyncSessionHandle`
awaits it; both offer every operation here under its own name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from convmem.actors._bounds import check_seconds
from convmem.errors import InvalidInput, InvalidTurn
from convmem.events import (
    MAX_TURN_ITEMS,
    AnyEvent,
    ConversationTurn,
    ItemPopped,
    MemoryKey,
    MessageItem,
    ShortTermMemoryConfig,
    TurnAdded,
)
from convmem.projections import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Clear,
    Command,
    PopItem,
    Restore,
    StartSession,
    parse_export,
)

__all__ = [
    "Call",
    "Handle",
    "add_items",
    "add_turn",
    "adopt",
    "call_timeout",
    "clear",
    "from_dict",
    "pop_item",
    "restore",
    "start",
]

R = TypeVar("R")


class Handle(Protocol):
    """What an operation needs of the handle it runs on."""

    key: MemoryKey

    @property
    def starting_config(self) -> ShortTermMemoryConfig: ...


class Call(NamedTuple, Generic[R]):
    """One write prepared by an operation: run by either handle, answered by `answer(events)`."""

    command: Command
    timeout: float | None
    answer: Callable[[list[AnyEvent]], R]
    command_id: str | None = None


def _check_turn(turn: object) -> ConversationTurn:
    if not isinstance(turn, ConversationTurn):
        raise InvalidTurn("turn", f"must be a ConversationTurn, got {type(turn).__name__}")
    return turn


def call_timeout(timeout: float | None) -> float | None:
    """A call's own `timeout`: None (the system's), or seconds from 0 (answered at once, or timed out)
    to a day; `InvalidInput` otherwise, before anything is sent (a wait past about 9.2e9 seconds
    overflowed time_t; a NaN or a negative one timed out a write that was then stored anyway)."""
    if timeout is None:
        return None
    return check_seconds("timeout", timeout, zero=True, error=InvalidInput)


def _check_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidInput("idempotency_key", "must be a non-empty string of at most 200 characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidInput("idempotency_key", "must not contain control characters")
    return value


def _turn_index(events: list[AnyEvent]) -> int:
    for event in events:  # (a loop, not next() over a generator: every add_turn's answer passes here)
        if isinstance(event, TurnAdded):
            return event.index
    return 0


def _popped(events: list[AnyEvent]) -> dict[str, Any] | None:
    return next((event.item.to_agents() for event in events if isinstance(event, ItemPopped)), None)


def _nothing(events: list[AnyEvent]) -> None:
    del events


def add_turn(
    handle: Handle,
    turn: ConversationTurn,
    *,
    timeout: float | None = None,
    idempotency_key: str | None = None,
) -> Call[int]:
    """Store a completed turn; returns its number once the log acknowledged it.

    With `idempotency_key`, a retry of the same call stores the turn once
    (the retry then returns 0: the turn was already stored by the first call).
    """
    if timeout is not None:  # (the common call gives none: no call made for it on the write path)
        timeout = call_timeout(timeout)
    return Call(
        AddTurn(turn=_check_turn(turn)), timeout, _turn_index, _check_idempotency_key(idempotency_key)
    )


def start(
    handle: Handle,
    *,
    injected_summary: str | None = None,
    injected_from: MemoryKey | None = None,
    timeout: float | None = None,
) -> Call[bool]:
    """Open the session now, recording a summary injected from another session.

    Returns False when the session had already started (nothing is written).
    """
    config = handle.starting_config
    command = StartSession(
        key=handle.key, config=config, injected_summary=injected_summary, injected_from=injected_from
    )
    return Call(command, call_timeout(timeout), bool)


def add_items(
    handle: Handle, items: Sequence[Mapping[str, Any] | MessageItem], *, timeout: float | None = None
) -> Call[None]:
    """Store agent items (OpenAI-Agents session items) as they arrive."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidTurn("items", f"must be a list of items, got {type(items).__name__}")
    if len(items) > MAX_TURN_ITEMS:  # before parsing them: the count alone refuses the write
        raise InvalidInput(
            "items", f"{len(items)} items in one write, over {MAX_TURN_ITEMS}: write them in parts"
        )
    parsed = tuple(
        item if isinstance(item, MessageItem) else MessageItem.from_agents(item, field=f"items[{i}]")
        for i, item in enumerate(items)
    )
    if not parsed:
        raise InvalidInput("items", "must not be empty")
    return Call(AddItems(items=parsed), call_timeout(timeout), _nothing)


def pop_item(handle: Handle, *, timeout: float | None = None) -> Call[dict[str, Any] | None]:
    """Remove and return the session's last item (None when the session is empty)."""
    return Call(PopItem(), call_timeout(timeout), _popped)


def clear(
    handle: Handle,
    *,
    timeout: float | None = None,
    moved_to: MemoryKey | None = None,
    through: int | None = None,
    reason: str = "",
    config: ShortTermMemoryConfig | None = None,
) -> Call[None]:
    """Forget the turns and summary (the log keeps them for audit).

    `moved_to` records that the turns now live in that session (see
    `adopt`); with `through`, the clear is refused (`InvalidInput`) if
    turns numbered above it arrived meanwhile. `config`: the session runs with it from
    the clear on (recorded in the `SessionCleared`).
    """
    command = Clear(reason=reason or "cleared by caller", moved_to=moved_to, through=through, config=config)
    return Call(command, call_timeout(timeout), _nothing)


def restore(
    handle: Handle,
    state: Mapping[str, Any],
    *,
    timeout: float | None = None,
    origin: str = "",
    idempotency_key: str | None = None,
) -> Call[bool]:
    """Replace the session's content with a `to_dict()` export; ValueError when invalid.

    `origin` is recorded in the `SessionRestored` event. Returns False when
    `idempotency_key` names a restore the session already stored.
    """
    summary, _health, turns = parse_export(state)
    command = Restore(summary=summary, turns=turns, origin=origin)
    return Call(command, call_timeout(timeout), bool, _check_idempotency_key(idempotency_key))


def adopt(
    handle: Handle,
    source: MemoryKey,
    source_seq: int,
    turns: Sequence[ConversationTurn],
    *,
    timeout: float | None = None,
    idempotency_key: str | None = None,
) -> Call[bool]:
    """Append turns moved here from session `source` (its events up to `source_seq`).

    One `TurnsAdopted` event; False when `idempotency_key` names a move
    the session already stored. Clear `source` with ``moved_to`` after it.
    """
    command = AdoptTurns(source=source, source_seq=source_seq, turns=tuple(_check_turn(t) for t in turns))
    return Call(command, call_timeout(timeout), bool, _check_idempotency_key(idempotency_key))


def from_dict(
    handle: Handle, state: Mapping[str, Any], *, timeout: float | None = None, origin: str = ""
) -> Call[None]:
    """Replace the session's content with a `to_dict()` export; ValueError when invalid.

    `origin` is recorded in the `SessionRestored` event (where the state came from).
    """
    call = restore(handle, state, timeout=timeout, origin=origin)
    return Call(call.command, call_timeout(timeout), _nothing)
