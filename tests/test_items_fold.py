"""Agent items fold in time linear in their number, and a turn of items is bounded.

A tenant's single ``add_items`` of 20,000 items held a service worker for minutes: each item that
joined a turn rebuilt and checked the whole turn again (n² for n items). These tests pin that a
turn built from items is exactly the turn its items make however they arrive, that a write checks
each item once, and that the write and the turn are bounded (`MAX_TURN_ITEMS`).
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import item_batches

from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
from convmem.errors import InvalidInput, InvalidTurn
from convmem.events import MAX_TURN_ITEMS, MemoryKey, MessageItem, ShortTermMemoryConfig
from convmem.projections import AddItems, SessionState, StartSession, decide, rendered_turn_length, replay
from convmem.projections._evolve import items_turn

KEY = MemoryKey("t", "u", "items")
CONFIG = ShortTermMemoryConfig(strategy="truncation", include_turn_dates=True)


def _started() -> SessionState:
    opening = StartSession(key=KEY, config=CONFIG)
    return replay(decide(SessionState(), opening, now=1.0, command_id="open", key=KEY, config=CONFIG))


def _written(
    state: SessionState, batches: list[tuple[MessageItem, ...]]
) -> tuple[SessionState, list[tuple[MessageItem, ...]]]:
    """The state after the writes, and the batches kept (a batch that breaks a rule is refused)."""
    kept = []
    for n, batch in enumerate(batches):
        try:
            events = decide(state, AddItems(items=batch), now=2.0, command_id=f"w{n}", key=KEY, config=CONFIG)
        except InvalidTurn:
            continue  # e.g. a call id still open in the turn: refused, nothing changes
        state = replay(events, state=state)
        kept.append(batch)
    return state, kept


def _turns_of(items: list[MessageItem]) -> list[tuple[MessageItem, ...]]:
    """The items of each turn: a user message opens one, every other item joins the last."""
    groups: list[list[MessageItem]] = []
    for item in items:
        if not groups or (item.kind == "message" and item.role == "user"):
            groups.append([item])
        else:
            groups[-1].append(item)
    return [tuple(group) for group in groups]


@given(st.lists(item_batches(), min_size=1, max_size=8))
def test_a_turn_of_items_is_the_turn_its_items_make_however_they_arrive(
    batches: list[tuple[MessageItem, ...]],
) -> None:
    """Given items written in any split into writes, then each turn is `items_turn` of its items
    (user text, the assistant texts joined, every item) with that turn's rendered length, and the
    state equals the one a single write of all the items makes."""
    state, kept = _written(_started(), batches)
    items = [item for batch in kept for item in batch]
    expected = _turns_of(items)
    assert [record.turn for record in state.turns] == [items_turn(group) for group in expected]
    for record in state.turns:
        assert record.rendered_len == rendered_turn_length(
            record.turn, include_digest=False, include_date=True
        )
    if items:
        at_once, _ = _written(_started(), [tuple(items)])
        assert at_once.turns == state.turns


def test_a_write_checks_each_item_once_not_once_per_item_already_in_the_turn() -> None:
    """Given a write of 2,000 items joining one turn, when it is decided, then the turn's items are
    checked as a whole a bounded number of times (it was once per item: 2,000 checks of up to
    2,000 items each)."""
    state, _ = _written(_started(), [(MessageItem(kind="message", role="user", content="go"),)])
    joining = tuple(MessageItem(kind="reasoning", content=f"step {n}") for n in range(2000))
    profile = cProfile.Profile()
    profile.enable()
    decide(state, AddItems(items=joining), now=3.0, command_id="many", key=KEY, config=CONFIG)
    profile.disable()
    checks = sum(
        row[1]
        for (_file, _line, name), row in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
        if name in ("check_items_of", "items_turn")
    )
    assert checks <= 4


@pytest.fixture
def memory() -> Iterator[MemorySystem]:
    system = MemorySystem(ShortTermMemoryConfig(strategy="truncation"), log=InMemoryEventLog())
    yield system
    system.close()


def test_a_write_of_more_items_than_a_turn_may_hold_is_refused_before_anything_is_stored(
    memory: MemorySystem,
) -> None:
    session = memory.session(KEY)
    session.add_items([{"role": "user", "content": "hi"}])
    version = session.snapshot_state().version
    with pytest.raises(InvalidInput) as refused:
        session.add_items([{"type": "reasoning", "content": "x"}] * (MAX_TURN_ITEMS + 1))
    assert refused.value.field == "items"
    assert f"over {MAX_TURN_ITEMS}" in str(refused.value)
    assert session.snapshot_state().version == version


def test_a_turn_that_would_grow_past_the_bound_is_refused_and_a_user_message_opens_the_next(
    memory: MemorySystem,
) -> None:
    session = memory.session(KEY)
    session.add_items([{"role": "user", "content": "hi"}])
    session.add_items([{"role": "assistant", "content": "step"}] * (MAX_TURN_ITEMS - 1))
    version = session.snapshot_state().version
    with pytest.raises(InvalidInput) as refused:
        session.add_items([{"role": "assistant", "content": "one more"}])
    assert refused.value.field == "items"
    assert "a user message opens the next turn" in str(refused.value)
    assert session.snapshot_state().version == version
    assert len(session.snapshot_state().turns[-1].turn.items) == MAX_TURN_ITEMS
    session.add_items([{"role": "user", "content": "next"}, {"role": "assistant", "content": "ok"}])
    assert [len(record.turn.items) for record in session.snapshot_state().turns] == [MAX_TURN_ITEMS, 2]
