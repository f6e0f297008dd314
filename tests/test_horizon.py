"""The live horizon: a session keeps what its views show, and the log keeps the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import given
from strategies import History, histories

from convmem.actors import MemorySystem
from convmem.adapters import ConvmemSession, InMemoryEventLog
from convmem.events import (
    AgentsMemoryConfig,
    ConversationMemoryConfig,
    ConversationTurn,
    EntityMention,
    ItemPopped,
    ItemsAdded,
    MemoryBudget,
    MemoryKey,
    SessionCleared,
    SessionErased,
    SessionRestored,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
)
from convmem.projections import (
    AddTurn,
    EntityTable,
    SessionState,
    agent_items,
    decide,
    encode_state,
    entity_messages,
    entity_table,
    evolve,
    full_tokens,
    live_horizon,
    llm_context,
    next_due_at,
    replay,
    summary_due,
    summary_messages,
    to_dict,
    window_messages,
)
from convmem.projections._entities import track_entities

_KEEP_ALL = {"live_turns": None}


def _unbounded(history: History) -> SessionState:
    """The same history folded with no horizon: every turn since the last reset stays live."""
    events = [
        msgspec.structs.replace(e, config=msgspec.structs.replace(e.config, **_KEEP_ALL))
        if isinstance(e, SessionStarted)
        else e
        for e in history.events
    ]
    return replay(events)


@given(histories(items=False))
def test_every_view_but_the_whole_list_is_the_unbounded_sessions(history: History) -> None:
    """Bounding changes no view that shows a window: context, export, summaries, Agents trimming
    and summarizing, the window, summary and entity memories are those of the unbounded fold."""
    bounded, full = history.state, _unbounded(history)
    assert llm_context(bounded) == llm_context(full)
    assert full_tokens(bounded) == full_tokens(full)  # what the ``error`` policy measures
    assert to_dict(bounded) == {**to_dict(full), "config_snapshot": to_dict(bounded)["config_snapshot"]}
    assert next_due_at(bounded) == next_due_at(full)
    now = bounded.last_at + 3600
    assert summary_due(bounded, now) == summary_due(full, now)
    assert window_messages(bounded) == window_messages(full)
    assert entity_messages(bounded) == entity_messages(full)
    assert entity_table(bounded) == entity_table(full)
    if bounded.config.agents.strategy in ("trimming", "summarizing"):
        assert agent_items(bounded) == agent_items(full)
    if bounded.config.summarizes:
        assert summary_messages(bounded) == summary_messages(full)


@given(histories())
def test_the_entity_table_counts_every_mention_since_the_last_reset(history: History) -> None:
    """Mentions of turns past the horizon still count: the table is the fold over every turn."""
    mentions: list[EntityMention] = []
    for event in history.events:
        match event:
            case TurnAdded():
                mentions.extend(event.turn.entities)
            case SessionCleared() | SessionErased():
                mentions = []
            case SessionRestored():
                mentions = [m for t in event.turns for m in t.entities]
            case ItemPopped():
                # A pop replaces the last turn by what is left of its items, or removes it when none
                # is left (a turn of one message): the model above does not follow that.
                return
    state = history.state
    if any(r.turn.source == "items" for r in state.turns):
        return  # an item turn replaces what it joined or popped: the model above does not follow it
    expected = track_entities(EntityTable(), mentions, state.config.memories.entity_max)
    assert entity_table(state) == expected


KEY = MemoryKey("acme", "ada", "long")


def _turn(n: int) -> ConversationTurn:
    return ConversationTurn(
        user_message=f"question {n}", assistant_response=f"answer {n}", entities=(EntityMention(name="Ada"),)
    )


def _session(config: ShortTermMemoryConfig, turns: int) -> SessionState:
    """A session of `turns` turns, each decided and folded as the runtime does."""
    state = SessionState()
    for n in range(turns):
        command = AddTurn(turn=_turn(n))
        for event in decide(state, command, now=1000.0 + n, command_id=f"c{n}", key=KEY, config=config):
            state = evolve(state, event)
    return state


def test_a_long_session_keeps_its_horizon_and_a_snapshot_of_the_same_size() -> None:
    """1,000 turns keep the last `live_turns` turns live: the state and its snapshot are those of
    a session of `live_turns` turns, give or take the numbers."""
    config = ShortTermMemoryConfig(strategy="truncation", live_turns=20)
    short, long = _session(config, 20), _session(config, 1000)
    assert [r.index for r in long.turns] == list(range(981, 1001))
    assert long.retired_through == 980
    assert len(encode_state(long)) <= len(encode_state(short)) + 200
    assert entity_table(long).get("ada") == {"name": "Ada", "kind": None, "attributes": {}, "mentions": 1000}


def test_the_horizon_never_drops_what_another_setting_shows() -> None:
    """The horizon is raised to the full zone, the Agents turn counts and the memory windows."""
    base = ShortTermMemoryConfig(live_turns=3)
    assert live_horizon(base) == 10  # the window memory's 10 messages need up to 10 turns
    wide = ShortTermMemoryConfig(
        live_turns=3,
        budget=MemoryBudget(full_zone_turns=40),
        agents=AgentsMemoryConfig(max_turns=50, context_limit=60, keep_last_n_turns=5),
        memories=ConversationMemoryConfig(max_messages=70),
    )
    assert live_horizon(wide) == 70
    assert live_horizon(ShortTermMemoryConfig(live_turns=None)) is None
    assert live_horizon(ShortTermMemoryConfig()) == 100


def test_unsummarized_turns_stay_live_past_the_horizon() -> None:
    """A summarizing session keeps every turn a summary has yet to cover, whatever the horizon."""
    config = ShortTermMemoryConfig(
        strategy="rolling_summary", live_turns=1, memories=ConversationMemoryConfig(window_size=1)
    )
    state = _session(config, 30)
    assert len(state.turns) == 30
    assert state.retired_through == 0
    assert summary_due(state, 5000.0) is not None


def test_a_replay_folds_long_runs_in_as_it_goes() -> None:
    """A replay of a long run of turns equals the event-by-event fold (runs are folded in chunks)."""
    config = ShortTermMemoryConfig(strategy="truncation", live_turns=10)
    started = SessionStarted(seq=1, event_id="s", at=1.0, key=KEY, config=config)
    turns = [TurnAdded(seq=n + 2, event_id=f"t{n}", at=2.0, index=n + 1, turn=_turn(n)) for n in range(9000)]
    stepwise = SessionState()
    for event in [started, *turns]:
        stepwise = evolve(stepwise, event)
    assert replay([started, *turns]) == stepwise
    assert [r.index for r in stepwise.turns] == list(range(8991, 9001))
    assert replay(turns[5000:], state=replay([started, *turns[:5000]])) == stepwise


@pytest.mark.parametrize("live_turns", [0, -1, True, 2.5])
def test_a_bad_horizon_is_refused_naming_the_setting(live_turns: object) -> None:
    """`live_turns` must be a positive integer or None."""
    with pytest.raises(ValueError, match="live_turns"):
        ShortTermMemoryConfig(live_turns=live_turns)  # type: ignore[arg-type]


def test_agents_get_items_reads_past_the_horizon_from_the_log() -> None:
    """With the Agents `none` strategy, `get_items()` returns every item, as `SQLiteSession` does:
    the live state keeps the last `live_turns` turns and the rest is read from the log;
    `pop_item` stops at the live turns (the items before them stay, and are listed)."""
    config = ShortTermMemoryConfig(live_turns=100)
    log = InMemoryEventLog()

    async def talk(memory: MemorySystem) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        session = ConvmemSession("chat", memory, tenant_id="acme", user_id="ada", config=config)
        for n in range(130):
            await session.add_items(
                [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
            )
        shown, last = await session.get_items(), await session.get_items(limit=4)
        within = await session.get_items(limit=200)  # the live turns hold the last 200 items
        for _ in range(201):
            await session.pop_item()
        return shown, last, within, await session.get_items()

    with MemorySystem(log=log) as memory:
        shown, last, within, after_pops = asyncio.run(talk(memory))
    assert [item["content"] for item in shown] == [f"{k}{n}" for n in range(130) for k in "qa"]
    assert [item["content"] for item in last] == ["q128", "a128", "q129", "a129"]
    assert within == shown[60:]
    assert [item["content"] for item in after_pops] == [f"{k}{n}" for n in range(30) for k in "qa"]
    events = [decode_event(r.data) for r in log.read_all()]
    stored = [i for e in events if isinstance(e, ItemsAdded) for i in e.items]
    assert len(stored) == 260
