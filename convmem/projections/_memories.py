"""The conversation-memory spec's memories: buffer, window, summary and entity.

Two faces over one set of rules:

* standalone classes with the spec's API (`BufferMemory`, `WindowMemory`,
  `SummaryMemory`, `EntityMemory`; `create_memory` picks one by `MemoryType`
  through the table in ``_strategies``), for callers that keep a memory in process;
* views over a session's folded state (``_memory_views``: `buffer_messages`,
  `window_messages`, `summary_messages`, `entity_messages`), with the
  settings of `ShortTermMemoryConfig.memories`.

The rules are pure functions over tuples of `MemoryMessage` (and an
immutable `EntityTable`) that both faces share; the classes only hold their
results. Nothing here reads a clock: a message's timestamp is whatever the
caller passes as ``timestamp=`` (a `datetime`), or None. Bad input raises
`InvalidInput` (a `ValueError`) naming the field.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import date, datetime
from typing import Any, ClassVar

import msgspec

from convmem.errors import InvalidInput
from convmem.projections._entities import EntityTable, parse_entities, track_entities

__all__ = [
    "BufferMemory",
    "EntityMemory",
    "Memory",
    "MemoryMessage",
    "MemoryType",
    "MessageSummarizer",
    "Messages",
    "SummaryMemory",
    "WindowMemory",
    "as_llm",
    "buffer_rule",
    "entity_view",
    "newest",
    "summary_view",
    "window_rule",
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
MessageSummarizer = Callable[[list[MemoryMessage], str], str]
"""What `SummaryMemory` folds with: ``summarizer(older_messages, previous_summary) -> new_summary``.

The spec's standalone memory keeps messages, not turns, so it takes this
rather than the runtime's `Summarizer` (a turn payload in, ``{"summary"}`` out).
"""


def as_llm(messages: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    return [m.to_llm() for m in messages]


def newest(messages: Messages, n: int) -> Messages:
    """The last `n` messages (none for n == 0, all when there are fewer)."""
    return messages[max(0, len(messages) - n) :] if n > 0 else ()


# The rules ------------------------------------------------------------------------


def buffer_rule(messages: Messages, max_messages: int | None) -> Messages:
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


def window_rule(messages: Messages, window_size: int) -> Messages:
    """Every system message, then the last `window_size` non-system messages."""
    others = tuple(m for m in messages if m.role != "system")
    return (*(m for m in messages if m.role == "system"), *newest(others, window_size))


def _summary_fold(
    summary: str, recent: Messages, summarizer: MessageSummarizer | None, threshold: int, keep_recent: int
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


def summary_view(summary: str, messages: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    head = [{"role": "system", "content": SUMMARY_PREFIX + summary}] if summary.strip() else []
    return head + as_llm(messages)


def entity_view(table: EntityTable, recent: Iterable[MemoryMessage]) -> list[dict[str, str]]:
    text = table.summary()
    return ([{"role": "system", "content": text}] if text else []) + as_llm(recent)


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
        self._messages = buffer_rule((*self._messages, message), self.max_messages)

    def get_messages(self) -> list[dict[str, str]]:
        return as_llm(self._messages)

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
            self._window = window_rule((*self._window, message), self.window_size)

    def get_messages(self) -> list[dict[str, str]]:
        return as_llm((*self._system, *self._window))

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
        self, summarizer: MessageSummarizer | None = None, threshold: int = 10, keep_recent: int = 4
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
        return as_llm(self._system) + summary_view(self.summary, self._recent)

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
        self._messages = newest((*self._messages, message), self.recent)

    def get_entity(self, name: str) -> dict[str, Any] | None:
        """``{name, kind, attributes, mentions}`` of the entity called `name`, or None."""
        return self._table.get(name)

    def get_messages(self) -> list[dict[str, str]]:
        return entity_view(self._table, self._messages)

    def clear(self) -> None:
        self._table, self._messages = EntityTable(), ()
