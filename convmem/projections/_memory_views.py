"""The conversation-memory spec's memories as views over a session's folded state.

The same rules as the standalone memories (``_memories``), applied to the
live turns with the settings of `ShortTermMemoryConfig.memories`: each turn
gives a user message and an assistant message (when not empty).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from convmem.projections._entities import EntityTable, track_entities
from convmem.projections._memories import (
    MemoryMessage,
    Messages,
    as_llm,
    buffer_rule,
    entity_view,
    newest,
    summary_view,
    window_rule,
)
from convmem.projections._state import SessionState, TurnRecord

__all__ = ["buffer_messages", "entity_messages", "entity_table", "summary_messages", "window_messages"]


def _turn_messages(records: Iterable[TurnRecord]) -> Messages:
    out: list[MemoryMessage] = []
    for record in records:
        if record.turn.user_message:
            out.append(MemoryMessage("user", record.turn.user_message))
        if record.turn.assistant_response:
            out.append(MemoryMessage("assistant", record.turn.assistant_response))
    return tuple(out)


def _last_messages(records: Sequence[TurnRecord], n: int) -> Messages:
    """The last `n` messages of the turns, reading only as many turns as needed."""
    start, found = len(records), 0
    while start > 0 and found < n:
        start -= 1
        found += len(_turn_messages((records[start],)))
    return newest(_turn_messages(records[start:]), n)


def buffer_messages(state: SessionState) -> list[dict[str, str]]:
    """Every live turn's messages, at most `memories.max_messages` of them (the newest)."""
    limit = state.config.memories.max_messages
    messages = _turn_messages(state.turns) if limit is None else _last_messages(state.turns, limit)
    return as_llm(buffer_rule(messages, limit))


def window_messages(state: SessionState) -> list[dict[str, str]]:
    """The last `memories.window_size` messages of the live turns."""
    size = state.config.memories.window_size
    return as_llm(window_rule(_last_messages(state.turns, size), size))


def summary_messages(state: SessionState) -> list[dict[str, str]]:
    """The session's summary as a system message (if any), then the unsummarized turns' messages."""
    return summary_view(state.summary, _turn_messages(state.unsummarized()))


def entity_table(state: SessionState) -> EntityTable:
    """The entities of every turn since the last clear, tracked with `memories.entity_max` and its
    eviction rule: the table of the turns past the live horizon, then the live turns' mentions."""
    table = state.retired_entities
    for record in state.turns:
        table = track_entities(table, record.turn.entities, state.config.memories.entity_max)
    return table


def entity_messages(state: SessionState) -> list[dict[str, str]]:
    """The entity summary as a system message, then the last `memories.entity_recent_messages` messages."""
    recent = _last_messages(state.turns, state.config.memories.entity_recent_messages)
    return entity_view(entity_table(state), recent)
