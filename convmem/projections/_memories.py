"""The conversation-memory spec's memories: buffer, window, summary and entity.

Two faces over one set of rules:

* standalone classes with the spec's API (`BufferMemory`, `WindowMemory`,
  `SummaryMemory`, `EntityMemory`, `create_memory`), for callers that keep a
  memory in process;
* views over a session's folded state (`buffer_messages`, `window_messages`,
  `summary_messages`, `entity_messages`), with the settings of
  `ShortTermMemoryConfig.memories`.

The rules are private pure functions over tuples of `MemoryMessage` (and an
immutable `EntityTable`) that both faces share; the classes only hold their
results. Nothing here reads a clock: a message's timestamp is whatever the
caller passes as ``timestamp=`` (a `datetime`), or None. Bad input raises
`InvalidInput` (a `ValueError`) naming the field.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import date, datetime
from typing import Any, ClassVar

import msgspec

from convmem.errors import InvalidInput
from convmem.projections._entities import (
    EntityRecord,
    EntityTable,
    parse_entities,
    track_entities,
)
from convmem.projections._state import SessionState, TurnRecord

__all__ = [
    "BufferMemory",
    "EntityMemory",
    "EntityRecord",
    "EntityTable",
    "Memory",
    "MemoryMessage",
    "MemoryType",
    "Summarizer",
    "SummaryMemory",
    "WindowMemory",
    "buffer_messages",
    "create_memory",
    "entity_messages",
    "entity_table",
    "parse_entities",
    "summary_messages",
    "window_messages",
]

ROLES = ("user", "assistant", "system")
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def _check_count(field: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(field, f"must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class MemoryMessage:
    """One message of a memory (the spec's fields); validated on construction."""

    role: str
    content: str
    timestamp: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    token_count: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidInput("role", f"must be user, assistant or system, got {self.role!r}")
        if not isinstance(self.content, str):
            raise InvalidInput("content", f"must be a string, got {type(self.content).__name__}")
        if self.timestamp is not None and not isinstance(self.timestamp, datetime):
            raise InvalidInput("timestamp", f"must be a datetime or None, got {self.timestamp!r}")
        if self.token_count is not None:
            _check_count("token_count", self.token_count, minimum=0)

    @classmethod
    def create(cls, role: str, content: str, metadata: Mapping[str, Any]) -> MemoryMessage:
        """A message from `add_message` arguments: ``timestamp`` and ``token_count`` leave the metadata."""
        rest = dict(metadata)
        timestamp, token_count = rest.pop("timestamp", None), rest.pop("token_count", None)
        return cls(role, content, timestamp, rest, token_count)

    def to_llm(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Messages = tuple[MemoryMessage, ...]
Summarizer = Callable[[list[MemoryMessage], str], str]
"""``summarizer(older_messages, previous_summary) -> new_summary``."""


def _as_llm(messages: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    return [m.to_llm() for m in messages]


def _last(messages: Messages, n: int) -> Messages:
    """The last `n` messages (none for n == 0, all when there are fewer)."""
    return messages[max(0, len(messages) - n) :] if n > 0 else ()


# The rules ------------------------------------------------------------------------


def _buffer_rule(messages: Messages, max_messages: int | None) -> Messages:
    """Drop the oldest non-system messages until at most `max_messages` remain (None: keep all)."""
    if max_messages is None:
        return messages
    excess = sum(1 for m in messages if m.role != "system") - max_messages
    kept: list[MemoryMessage] = []
    for m in messages:
        if m.role != "system" and excess > 0:
            excess -= 1
        else:
            kept.append(m)
    return tuple(kept)


def _window_rule(messages: Messages, window_size: int) -> Messages:
    """Every system message, then the last `window_size` non-system messages."""
    others = tuple(m for m in messages if m.role != "system")
    return (*(m for m in messages if m.role == "system"), *_last(others, window_size))


def _summary_fold(
    summary: str, recent: Messages, summarizer: Summarizer | None, threshold: int, keep_recent: int
) -> tuple[str, Messages]:
    """Once `recent` holds `threshold` messages, fold all but the last `keep_recent` into the summary.

    A no-op without a summarizer. A summarizer that raises leaves nothing changed.
    """
    if summarizer is None or len(recent) < threshold:
        return summary, recent
    split = len(recent) - keep_recent
    new = summarizer(list(recent[:split]), summary)
    if not isinstance(new, str):
        raise InvalidInput("summary", f"the summarizer returned {type(new).__name__}, not a string")
    return new, recent[split:]


def _summary_view(summary: str, messages: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    head = [{"role": "system", "content": SUMMARY_PREFIX + summary}] if summary.strip() else []
    return head + _as_llm(messages)


def _entity_view(table: EntityTable, recent: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    text = table.summary()
    return ([{"role": "system", "content": text}] if text else []) + _as_llm(recent)


# The standalone memories -------------------------------------------------------------


class MemoryType(enum.Enum):
    """The memories `create_memory` builds."""

    BUFFER = "buffer"
    WINDOW = "window"
    SUMMARY = "summary"
    ENTITY = "entity"


def _json_default(obj: object) -> Any:
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    if isinstance(obj, MemoryMessage):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    if isinstance(obj, msgspec.Struct):
        return msgspec.to_builtins(obj)
    if isinstance(obj, set | frozenset):
        return list(obj)
    return str(obj)


class Memory(ABC):
    """The spec's interface: add messages, read them as ``{role, content}`` dicts, clear, export."""

    memory_type: ClassVar[MemoryType]

    @abstractmethod
    def add_message(self, role: str, content: str, **metadata: Any) -> None:
        """Store a message; ``timestamp=`` (a datetime) and ``token_count=`` become its fields."""

    @abstractmethod
    def get_messages(self) -> list[dict[str, str]]:
        """The messages to put in front of the model."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything."""

    def to_json(self) -> str:
        """The memory's type, settings and content as JSON (the summarizer callable left out).

        Metadata values that JSON cannot hold are written as their ``str()``.
        """
        body = {name.lstrip("_"): value for name, value in vars(self).items() if not callable(value)}
        body["memory_type"] = self.memory_type.value
        return json.dumps(body, ensure_ascii=False, sort_keys=True, default=_json_default)


class BufferMemory(Memory):
    """Every message; over `max_messages` non-system messages, the oldest non-system ones go."""

    memory_type = MemoryType.BUFFER

    def __init__(self, max_messages: int | None = None) -> None:
        if max_messages is not None:
            _check_count("max_messages", max_messages, minimum=1)
        self.max_messages = max_messages
        self._messages: Messages = ()

    def add_message(self, role: str, content: str, **metadata: Any) -> None:
        message = MemoryMessage.create(role, content, metadata)
        self._messages = _buffer_rule((*self._messages, message), self.max_messages)

    def get_messages(self) -> list[dict[str, str]]:
        return _as_llm(self._messages)

    def clear(self) -> None:
        self._messages = ()


class WindowMemory(Memory):
    """System messages kept apart; the last `window_size` other messages."""

    memory_type = MemoryType.WINDOW

    def __init__(self, window_size: int = 10) -> None:
        _check_count("window_size", window_size, minimum=1)
        self.window_size = window_size
        self._system: Messages = ()
        self._window: Messages = ()

    def add_message(self, role: str, content: str, **metadata: Any) -> None:
        message = MemoryMessage.create(role, content, metadata)
        if message.role == "system":
            self._system = (*self._system, message)
        else:
            self._window = _window_rule((*self._window, message), self.window_size)

    def get_messages(self) -> list[dict[str, str]]:
        return _as_llm((*self._system, *self._window))

    def clear(self) -> None:
        self._system, self._window = (), ()


class SummaryMemory(Memory):
    """A running summary of older messages plus the recent unsummarized ones.

    When `threshold` messages are recent, all but the last `keep_recent` are
    folded into the summary by `summarizer` (no summarizer: nothing is folded).
    System messages are never summarized: they stay in front.
    """

    memory_type = MemoryType.SUMMARY

    def __init__(
        self, summarizer: Summarizer | None = None, threshold: int = 10, keep_recent: int = 4
    ) -> None:
        _check_count("threshold", threshold, minimum=1)
        _check_count("keep_recent", keep_recent, minimum=0)
        if keep_recent >= threshold:
            raise InvalidInput("keep_recent", f"{keep_recent} must be below threshold={threshold}")
        self.summarizer = summarizer
        self.threshold = threshold
        self.keep_recent = keep_recent
        self.summary = ""
        self._system: Messages = ()
        self._recent: Messages = ()

    def add_message(self, role: str, content: str, **metadata: Any) -> None:
        message = MemoryMessage.create(role, content, metadata)
        if message.role == "system":
            self._system = (*self._system, message)
            return
        self._recent = (*self._recent, message)
        if len(self._recent) >= self.threshold:
            self._update_summary()

    def _update_summary(self) -> None:
        self.summary, self._recent = _summary_fold(
            self.summary, self._recent, self.summarizer, self.threshold, self.keep_recent
        )

    def get_messages(self) -> list[dict[str, str]]:
        return _as_llm(self._system) + _summary_view(self.summary, self._recent)

    def clear(self) -> None:
        self.summary, self._system, self._recent = "", (), ()


class EntityMemory(Memory):
    """Entities from ``metadata["entities"]`` with mention counts, plus the last `recent` messages."""

    memory_type = MemoryType.ENTITY

    def __init__(self, max_entities: int = 50, recent: int = 10) -> None:
        _check_count("max_entities", max_entities, minimum=1)
        _check_count("recent", recent, minimum=0)
        self.max_entities = max_entities
        self.recent = recent
        self._table = EntityTable()
        self._messages: Messages = ()

    def add_message(self, role: str, content: str, **metadata: Any) -> None:
        message = MemoryMessage.create(role, content, metadata)
        mentions = parse_entities(message.metadata.get("entities"))
        self._table = track_entities(self._table, mentions, self.max_entities)
        self._messages = _last((*self._messages, message), self.recent)

    def get_entity(self, name: str) -> dict[str, Any] | None:
        """``{name, kind, attributes, mentions}`` of the entity called `name`, or None."""
        return self._table.get(name)

    def get_messages(self) -> list[dict[str, str]]:
        return _entity_view(self._table, self._messages)

    def clear(self) -> None:
        self._table, self._messages = EntityTable(), ()


_MEMORIES: dict[MemoryType, type[Memory]] = {
    MemoryType.BUFFER: BufferMemory,
    MemoryType.WINDOW: WindowMemory,
    MemoryType.SUMMARY: SummaryMemory,
    MemoryType.ENTITY: EntityMemory,
}


def create_memory(memory_type: MemoryType, **kwargs: Any) -> Memory:
    """A new memory of `memory_type`, built with `kwargs`; `ValueError` for anything else."""
    memory_class = _MEMORIES.get(memory_type) if isinstance(memory_type, MemoryType) else None
    if memory_class is None:
        raise InvalidInput("memory_type", f"unsupported memory type {memory_type!r}; use a MemoryType member")
    return memory_class(**kwargs)


# Views over a session's state ----------------------------------------------------------


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
    return _last(_turn_messages(records[start:]), n)


def buffer_messages(state: SessionState) -> list[dict[str, str]]:
    """Every live turn's messages, at most `memories.max_messages` of them (the newest)."""
    limit = state.config.memories.max_messages
    messages = _turn_messages(state.turns) if limit is None else _last_messages(state.turns, limit)
    return _as_llm(_buffer_rule(messages, limit))


def window_messages(state: SessionState) -> list[dict[str, str]]:
    """The last `memories.window_size` messages of the live turns."""
    size = state.config.memories.window_size
    return _as_llm(_window_rule(_last_messages(state.turns, size), size))


def summary_messages(state: SessionState) -> list[dict[str, str]]:
    """The session's summary as a system message (if any), then the unsummarized turns' messages."""
    return _summary_view(state.summary, _turn_messages(state.unsummarized()))


def entity_table(state: SessionState) -> EntityTable:
    """The entities of every live turn, tracked with `memories.entity_max` and its eviction rule."""
    table = EntityTable()
    for record in state.turns:
        table = track_entities(table, record.turn.entities, state.config.memories.entity_max)
    return table


def entity_messages(state: SessionState) -> list[dict[str, str]]:
    """The entity summary as a system message, then the last `memories.entity_recent_messages` messages."""
    recent = _last_messages(state.turns, state.config.memories.entity_recent_messages)
    return _entity_view(entity_table(state), recent)
