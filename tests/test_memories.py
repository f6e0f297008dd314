"""The buffer, window, summary and entity memories (seed 004): classes and state views."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convmem.errors import InvalidInput
from convmem.events import (
    ConversationMemoryConfig,
    ConversationTurn,
    EntityMention,
    MemoryKey,
    ShortTermMemoryConfig,
)
from convmem.projections import (
    AddTurn,
    BufferMemory,
    EntityMemory,
    Memory,
    MemoryMessage,
    MemoryType,
    SessionState,
    SummaryMemory,
    SummarySucceeded,
    WindowMemory,
    buffer_messages,
    create_memory,
    decide,
    entity_messages,
    entity_table,
    evolve,
    parse_entities,
    summary_due,
    summary_messages,
    window_messages,
)

KEY = MemoryKey("acme", "alice", "s1")


def contents(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages]


# MemoryMessage and validation ------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "content", "metadata", "field"),
    [
        ("tool", "hi", {}, "role"),
        ("user", 42, {}, "content"),
        ("user", "hi", {"timestamp": "2026-03-01"}, "timestamp"),
        ("user", "hi", {"token_count": -1}, "token_count"),
    ],
)
def test_add_message_rejects_bad_input_naming_the_field(
    role: str, content: Any, metadata: dict[str, Any], field: str
) -> None:
    """Role user/assistant/system, content a str, timestamp a datetime; else ValueError naming the field."""
    for memory in (BufferMemory(), WindowMemory(), SummaryMemory(), EntityMemory()):
        with pytest.raises(ValueError, match=field) as caught:
            memory.add_message(role, content, **metadata)
        assert isinstance(caught.value, InvalidInput)
        assert caught.value.field == field
        assert memory.get_messages() == []


def test_timestamp_and_token_count_come_from_the_caller_not_a_clock() -> None:
    """A message's timestamp is the caller's ``timestamp=`` (or None); it leaves the metadata."""
    memory = BufferMemory()
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    memory.add_message("user", "hi", timestamp=when, token_count=2, lang="en")
    memory.add_message("assistant", "hello")
    stored = json.loads(memory.to_json())["messages"]
    assert stored[0] == {
        "role": "user",
        "content": "hi",
        "timestamp": "2026-03-01T12:00:00+00:00",
        "metadata": {"lang": "en"},
        "token_count": 2,
    }
    assert stored[1]["timestamp"] is None
    assert MemoryMessage("user", "x").timestamp is None


# Buffer and window -------------------------------------------------------------------


def test_buffer_keeps_every_message_without_a_limit() -> None:
    """BufferMemory with max_messages=None keeps all messages as {role, content} dicts."""
    memory = BufferMemory()
    for i in range(30):
        memory.add_message("user" if i % 2 == 0 else "assistant", f"m{i}")
    assert len(memory.get_messages()) == 30
    assert memory.get_messages()[0] == {"role": "user", "content": "m0"}


def test_buffer_trims_oldest_non_system_messages() -> None:
    """Over max_messages, the oldest non-system messages go; system messages stay where they are."""
    memory = BufferMemory(max_messages=2)
    memory.add_message("system", "be brief")
    for i in range(4):
        memory.add_message("user", f"m{i}")
    assert contents(memory.get_messages()) == ["be brief", "m2", "m3"]


def test_window_keeps_system_messages_apart_and_the_last_window() -> None:
    """WindowMemory: system messages first, then the last window_size other messages."""
    memory = WindowMemory(window_size=2)
    memory.add_message("user", "m0")
    memory.add_message("system", "be brief")
    memory.add_message("assistant", "m1")
    memory.add_message("user", "m2")
    assert memory.get_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": "m1"},
        {"role": "user", "content": "m2"},
    ]


@pytest.mark.parametrize(
    ("make", "field"), [(lambda: BufferMemory(0), "max_messages"), (lambda: WindowMemory(0), "window_size")]
)
def test_sizes_must_be_positive(make: Any, field: str) -> None:
    """A size below 1 is refused with a ValueError naming it."""
    with pytest.raises(ValueError, match=field):
        make()


# Summary -------------------------------------------------------------------------------


class RecordingSummarizer:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []

    def __call__(self, messages: list[MemoryMessage], previous: str) -> str:
        self.calls.append(([m.content for m in messages], previous))
        return f"{previous}+{len(messages)}" if previous else f"S{len(messages)}"


def test_summary_without_summarizer_is_a_no_op() -> None:
    """SummaryMemory._update_summary does nothing without a summarizer: all messages stay recent."""
    memory = SummaryMemory(threshold=3, keep_recent=1)
    for i in range(5):
        memory.add_message("user", f"m{i}")
    assert contents(memory.get_messages()) == ["m0", "m1", "m2", "m3", "m4"]
    assert memory.summary == ""


def test_summary_folds_older_messages_at_the_threshold() -> None:
    """At threshold recent messages, all but keep_recent fold into the summary, shown as a system message."""
    summarizer = RecordingSummarizer()
    memory = SummaryMemory(summarizer, threshold=3, keep_recent=1)
    for i in range(3):
        memory.add_message("user", f"m{i}")
    assert summarizer.calls == [(["m0", "m1"], "")]
    messages = memory.get_messages()
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].endswith("S2")
    assert messages[1:] == [{"role": "user", "content": "m2"}]


def test_summary_folds_again_from_the_previous_summary() -> None:
    """The next fold gets the previous summary, so nothing summarized is forgotten."""
    summarizer = RecordingSummarizer()
    memory = SummaryMemory(summarizer, threshold=3, keep_recent=1)
    for i in range(5):
        memory.add_message("user", f"m{i}")
    assert summarizer.calls[1] == (["m2", "m3"], "S2")
    assert memory.summary == "S2+2"
    assert contents(memory.get_messages())[1:] == ["m4"]


def test_summary_never_summarizes_system_messages() -> None:
    """System messages stay in front, verbatim, whatever is summarized."""
    summarizer = RecordingSummarizer()
    memory = SummaryMemory(summarizer, threshold=2, keep_recent=0)
    memory.add_message("system", "be brief")
    memory.add_message("user", "m0")
    memory.add_message("assistant", "m1")
    assert summarizer.calls == [(["m0", "m1"], "")]
    assert contents(memory.get_messages()) == ["be brief", "Summary of the earlier conversation:\nS2"]


def test_a_failing_summarizer_loses_no_message() -> None:
    """A summarizer that raises propagates, and every message stays for the next attempt."""

    def broken(messages: list[MemoryMessage], previous: str) -> str:
        raise RuntimeError("LLM down")

    memory = SummaryMemory(broken, threshold=2, keep_recent=1)
    memory.add_message("user", "m0")
    with pytest.raises(RuntimeError):
        memory.add_message("user", "m1")
    assert contents(memory.get_messages()) == ["m0", "m1"]


def test_summarizer_must_return_text() -> None:
    """A summarizer returning something else than a string is refused, naming the summary."""
    memory = SummaryMemory(lambda messages, previous: None, threshold=1, keep_recent=0)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="summary"):
        memory.add_message("user", "m0")


def test_summary_keep_recent_must_be_below_threshold() -> None:
    """keep_recent >= threshold would never fold anything: refused."""
    with pytest.raises(ValueError, match="keep_recent"):
        SummaryMemory(threshold=3, keep_recent=3)


# Entities ------------------------------------------------------------------------------


def test_entities_are_counted_from_names_or_mappings() -> None:
    """metadata["entities"] may list names or {name, kind, attributes}; mentions and attributes add up."""
    memory = EntityMemory()
    memory.add_message("user", "Alice lives in Oslo", entities=["Alice", {"name": "Oslo", "kind": "city"}])
    memory.add_message(
        "user", "alice moved", entities=[{"name": "alice", "kind": "person", "attributes": {"city": "Paris"}}]
    )
    memory.add_message("user", "again", entities=[{"name": "Alice", "attributes": {"role": "dev"}}])
    assert memory.get_entity("ALICE") == {
        "name": "Alice",
        "kind": "person",
        "attributes": {"city": "Paris", "role": "dev"},
        "mentions": 3,
    }
    assert memory.get_entity("Oslo") == {"name": "Oslo", "kind": "city", "attributes": {}, "mentions": 1}
    assert memory.get_entity("Bob") is None


def test_the_least_mentioned_entity_is_evicted() -> None:
    """At max_entities, a new entity evicts the least mentioned one."""
    memory = EntityMemory(max_entities=2)
    memory.add_message("user", "x", entities=["A", "A", "B"])
    memory.add_message("user", "y", entities=["C"])
    assert memory.get_entity("B") is None
    assert memory.get_entity("A") is not None
    assert memory.get_entity("C") is not None


def test_eviction_ties_go_to_the_oldest_last_mention() -> None:
    """Among equally mentioned entities, the one mentioned longest ago is evicted."""
    memory = EntityMemory(max_entities=2)
    memory.add_message("user", "x", entities=["A", "B"])
    memory.add_message("user", "y", entities=["B", "A"])
    memory.add_message("user", "z", entities=["C"])
    assert memory.get_entity("B") is None
    assert memory.get_entity("A") is not None


def test_entity_messages_are_the_summary_then_the_last_ten() -> None:
    """get_messages: the entity summary as a system message, then the last 10 messages."""
    memory = EntityMemory()
    for i in range(12):
        memory.add_message("user", f"m{i}", entities=["Oslo"] if i < 2 else ["Alice"])
    messages = memory.get_messages()
    assert messages[0]["role"] == "system"
    summary = messages[0]["content"].splitlines()
    assert summary[1:] == ["- Alice, mentioned 10 times", "- Oslo, mentioned 2 times"]
    assert contents(messages[1:]) == [f"m{i}" for i in range(2, 12)]


def test_entity_memory_without_entities_shows_no_summary() -> None:
    """No entity, no entity system message."""
    memory = EntityMemory(recent=1)
    memory.add_message("user", "m0")
    memory.add_message("user", "m1")
    assert memory.get_messages() == [{"role": "user", "content": "m1"}]


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("Alice", "entities"),
        ({"name": "Alice"}, "entities"),
        ([""], "entities[0].name"),
        (["ok", 3], "entities[1]"),
        ([{"name": "A", "kind": 1}], "entities[0].kind"),
        ([{"name": "A", "attributes": {"age": 3}}], "entities[0].attributes"),
        ([{"name": "A", "atributes": {}}], "entities[0]"),
    ],
)
def test_bad_entities_are_refused_naming_the_field(value: object, field: str) -> None:
    """Malformed metadata["entities"] raises ValueError naming where it is wrong."""
    with pytest.raises(InvalidInput) as caught:
        EntityMemory().add_message("user", "x", entities=value)
    assert caught.value.field == field


def test_parse_entities_gives_turn_entity_mentions() -> None:
    """The metadata forms parse into the EntityMention vocabulary turns carry."""
    assert parse_entities(["A", {"name": "B", "kind": "k", "attributes": {"x": "1"}}]) == (
        EntityMention(name="A"),
        EntityMention(name="B", kind="k", attributes={"x": "1"}),
    )


# Factory, clear, to_json -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_type", "kwargs", "cls"),
    [
        (MemoryType.BUFFER, {"max_messages": 3}, BufferMemory),
        (MemoryType.WINDOW, {"window_size": 3}, WindowMemory),
        (MemoryType.SUMMARY, {"threshold": 4, "keep_recent": 2}, SummaryMemory),
        (MemoryType.ENTITY, {"max_entities": 3}, EntityMemory),
    ],
)
def test_create_memory_builds_each_type(
    memory_type: MemoryType, kwargs: dict[str, Any], cls: type[Memory]
) -> None:
    """create_memory(MemoryType, **kwargs) picks the class and passes the settings."""
    memory = create_memory(memory_type, **kwargs)
    assert type(memory) is cls
    memory.add_message("user", "hello", entities=["A"])
    dumped = json.loads(memory.to_json())
    assert dumped["memory_type"] == memory_type.value
    assert all(dumped[k] == v for k, v in kwargs.items())
    memory.clear()
    assert memory.get_messages() == []


@pytest.mark.parametrize("bad", ["buffer", None, 3, "BUFFER"])
def test_create_memory_refuses_anything_but_a_memory_type(bad: Any) -> None:
    """Unsupported types, wrong value types included, raise ValueError."""
    with pytest.raises(ValueError, match="memory_type"):
        create_memory(bad)


def test_memory_is_abstract() -> None:
    """Memory is the interface; only the four strategies implement it."""
    with pytest.raises(TypeError):
        Memory()  # type: ignore[abstract]


# Views over a session's state ------------------------------------------------------------


def turn(
    n: int, *, user: bool = True, assistant: bool = True, entities: tuple[str, ...] = ()
) -> ConversationTurn:
    return ConversationTurn(
        user_message=f"u{n}" if user else "",
        assistant_response=f"a{n}" if assistant else "",
        entities=tuple(EntityMention(name=e) for e in entities),
    )


def state_of(turns: list[ConversationTurn], summarize: bool = False, **memories: Any) -> SessionState:
    cfg = ShortTermMemoryConfig(
        strategy="rolling_summary" if summarize else "none", memories=ConversationMemoryConfig(**memories)
    )
    state = SessionState()
    for i, t in enumerate(turns):
        for event in decide(state, AddTurn(turn=t), now=float(i), command_id=f"c{i}", key=KEY, config=cfg):
            state = evolve(state, event)
    return state


def test_buffer_view_is_user_then_assistant_per_turn_skipping_empty_ones() -> None:
    """State view: each live turn gives its user then assistant message; empty ones are skipped."""
    state = state_of([turn(1), turn(2, user=False), turn(3, assistant=False)])
    assert buffer_messages(state) == [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"},
    ]


def test_buffer_view_keeps_the_newest_max_messages() -> None:
    """memories.max_messages bounds the buffer view to the newest messages."""
    state = state_of([turn(n) for n in range(1, 5)], max_messages=3)
    assert contents(buffer_messages(state)) == ["a3", "u4", "a4"]


def test_window_view_shows_the_last_window_size_messages() -> None:
    """memories.window_size messages of the live turns, newest last."""
    state = state_of([turn(n) for n in range(1, 8)], window_size=3)
    assert contents(window_messages(state)) == ["a6", "u7", "a7"]


def test_summary_view_is_the_summary_then_unsummarized_turns() -> None:
    """State view: the session summary as a system message, then the turns after summary_through."""
    state = state_of([turn(n) for n in range(1, 8)], summarize=True)
    assert contents(summary_messages(state)) == [c for n in range(1, 8) for c in (f"u{n}", f"a{n}")]
    request = summary_due(state, 10.0)
    assert request is not None
    for event in decide(state, SummarySucceeded(request=request, summary="S"), now=10.0, command_id="sum"):
        state = evolve(state, event)
    assert state.summary_through == 2
    view = summary_messages(state)
    assert view[0] == {"role": "system", "content": "Summary of the earlier conversation:\nS"}
    assert contents(view[1:]) == [c for n in range(3, 8) for c in (f"u{n}", f"a{n}")]


def test_entity_view_tracks_entities_across_live_turns() -> None:
    """State view: entities of every live turn with counts and eviction, then the recent messages."""
    turns = [turn(1, entities=("Oslo", "Alice")), turn(2, entities=("Alice",)), turn(3, entities=("Bob",))]
    state = state_of(turns, entity_max=2, entity_recent_messages=2)
    table = entity_table(state)
    assert table.get("oslo") is None  # least mentioned when Bob arrived
    assert table.get("Alice") == {"name": "Alice", "kind": None, "attributes": {}, "mentions": 2}
    view = entity_messages(state)
    assert view[0]["content"].splitlines()[1:] == ["- Alice, mentioned 2 times", "- Bob, mentioned once"]
    assert contents(view[1:]) == ["u3", "a3"]


def test_entity_view_with_no_recent_messages_shows_only_the_summary() -> None:
    """entity_recent_messages=0 shows the entity summary alone."""
    state = state_of([turn(1, entities=("Alice",))], entity_recent_messages=0)
    assert [m["role"] for m in entity_messages(state)] == ["system"]


# Properties ----------------------------------------------------------------------------------

roles = st.sampled_from(["user", "assistant", "system"])
message_lists = st.lists(st.tuples(roles, st.text(max_size=5)), max_size=30)


@given(message_lists, st.integers(1, 8))
def test_buffer_keeps_system_messages_and_the_newest_others(
    messages: list[tuple[str, str]], limit: int
) -> None:
    """Buffer: every system message stays, and the newest max_messages others, in order."""
    memory = BufferMemory(max_messages=limit)
    for role, content in messages:
        memory.add_message(role, content)
    others = [(r, c) for r, c in messages if r != "system"]
    keep = others[len(others) - min(limit, len(others)) :]
    shown = [(m["role"], m["content"]) for m in memory.get_messages()]
    assert [m for m in shown if m[0] == "system"] == [m for m in messages if m[0] == "system"]
    assert [m for m in shown if m[0] != "system"] == keep


@given(message_lists, st.integers(1, 8))
def test_window_is_system_then_last_window(messages: list[tuple[str, str]], size: int) -> None:
    """Window: all system messages, then the last window_size others."""
    memory = WindowMemory(window_size=size)
    for role, content in messages:
        memory.add_message(role, content)
    others = [(r, c) for r, c in messages if r != "system"]
    expected = [m for m in messages if m[0] == "system"] + others[max(0, len(others) - size) :]
    assert [(m["role"], m["content"]) for m in memory.get_messages()] == expected


@given(st.lists(st.lists(st.sampled_from("ABCDEFG"), max_size=4), max_size=20), st.integers(1, 4))
def test_entity_table_stays_bounded_and_counts_no_more_than_mentions(
    mentions: list[list[str]], max_entities: int
) -> None:
    """Entities never exceed max_entities; a count never exceeds the entity's real mentions."""
    memory = EntityMemory(max_entities=max_entities)
    for names in mentions:
        memory.add_message("user", "x", entities=names)
    tracked = [name for name in "ABCDEFG" if memory.get_entity(name) is not None]
    assert len(tracked) <= max_entities
    flat = [n for names in mentions for n in names]
    for name in tracked:
        entity = memory.get_entity(name)
        assert entity is not None
        assert 1 <= entity["mentions"] <= flat.count(name)
    if flat:
        assert memory.get_entity(flat[-1]) is not None  # the latest mention is always tracked
