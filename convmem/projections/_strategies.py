"""Every memory strategy, one entry each, and how the three vocabularies relate.

convmem speaks the three vocabularies of its seed documents. Each names the
same few ways to show a conversation, as views of one stored history:

=================================================  ==================  ===============  ==========
what the model sees (`Shown`)                      `Strategy`          `AgentsStrategy` `MemoryType`
=================================================  ==================  ===============  ==========
no memory                                          ``none``
every turn                                                             ``none``         ``buffer``
the last turns                                     ``truncation``      ``trimming``     ``window``
a summary, then the turns it does not cover        ``rolling_summary`` ``summarizing``  ``summary``
every turn, older tool results as placeholders                         ``compacting``
the entities mentioned, then the last messages                                          ``entity``
=================================================  ==================  ===============  ==========

* `Strategy` (PenguiFlow's, ``config.strategy``) drives `llm_context` and the
  summarizer: only ``rolling_summary`` asks for summaries (`strategy_summarizes`).
* `AgentsStrategy` (OpenAI-Agents', ``config.agents.strategy``) drives
  `agent_items`; ``summarizing`` shows the summaries ``rolling_summary`` makes
  (`strategy_reads_summaries`) and sets when they are made (its summary zone).
* `MemoryType` (the conversation-memory spec's) is no setting: each is a view
  (`buffer_messages`, ...) and a standalone class (`create_memory`).

`strategy_table` derives the table above from the entries below, and the
README's table is checked against it.

Adding a strategy: add its name to the `Strategy` or `AgentsStrategy`
literal (``convmem/events/_config.py``) or a member to `MemoryType`, then run
mypy: every ``assert_never`` that must handle it fails until it does (its
entry here, and the facts the stored configuration needs in ``_config``).
A new name is stored in `SessionStarted`'s configuration: CHANGELOG.md marks
it as a schema change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar, assert_never, get_args

from convmem.errors import InvalidInput
from convmem.events import AgentsMemoryConfig, AgentsStrategy, MemoryHealth, Strategy
from convmem.projections._agents import (
    compacted_items,
    every_item,
    summarized_items,
    summarizing_zone,
    trimmed_items,
)
from convmem.projections._budget import ContextSelection
from convmem.projections._memories import (
    BufferMemory,
    EntityMemory,
    Memory,
    MemoryType,
    SummaryMemory,
    WindowMemory,
)
from convmem.projections._memory_views import (
    buffer_messages,
    entity_messages,
    summary_messages,
    window_messages,
)
from convmem.projections._state import SessionState

__all__ = [
    "AGENTS_STRATEGIES",
    "CONTEXT_STRATEGIES",
    "MEMORY_VIEWS",
    "AgentsView",
    "ContextStrategy",
    "MemoryView",
    "Shown",
    "agent_items",
    "create_memory",
    "strategy_table",
]


class Shown(enum.Enum):
    """What the model sees: the idea that each vocabulary names in its own words."""

    NOTHING = "no memory"
    EVERY_TURN = "every turn"
    LAST_TURNS = "the last turns"
    SUMMARY_THEN_TURNS = "a summary, then the turns it does not cover"
    COMPACTED = "every turn, older tool results as placeholders"
    ENTITIES = "the entities mentioned, then the last messages"


View = Callable[[SessionState], ContextSelection]
N = TypeVar("N")


@dataclass(frozen=True, slots=True)
class ContextStrategy:
    """A PenguiFlow `Strategy`: which of the session's turns its `llm_context` offers.

    `view` is what the context shows before the budget applies (None: no
    memory at all, the context is ``{}``); `content` is everything it may
    show whatever the health, which the ``error`` policy measures.
    """

    name: Strategy
    shown: Shown
    view: View | None
    content: View | None

    @property
    def shows_memory(self) -> bool:
        """False for a strategy that keeps no context at all (PenguiFlow's ``none``)."""
        return self.view is not None


@dataclass(frozen=True, slots=True)
class AgentsView:
    """An OpenAI-Agents `AgentsStrategy`: the items `agent_items` shows.

    `summary_zone`, when the strategy sets one, says when summaries are made
    (turns kept verbatim, unsummarized turns that trigger one); otherwise the
    budget's full zone does.
    """

    name: AgentsStrategy
    shown: Shown
    items: Callable[[SessionState], list[dict[str, Any]]]
    summary_zone: Callable[[AgentsMemoryConfig], tuple[int, int]] | None = None

    @property
    def shows_whole_history(self) -> bool:
        """Its items reach back to the session's first turn, past any live horizon."""
        return self.shown in (Shown.EVERY_TURN, Shown.COMPACTED)


@dataclass(frozen=True, slots=True)
class MemoryView:
    """A conversation memory (`MemoryType`): its view over a session and its standalone class."""

    memory_type: MemoryType
    shown: Shown
    messages: Callable[[SessionState], list[dict[str, str]]]
    memory_class: type[Memory]


# PenguiFlow's strategies ------------------------------------------------------------------


def _recent(state: SessionState) -> ContextSelection:
    return ContextSelection(summary="", pending=(), recent=state.recent())


def _summary_and_turns(state: SessionState) -> ContextSelection:
    return ContextSelection(summary=state.summary, pending=state.pending(), recent=state.recent())


def _summary_unless_degraded(state: SessionState) -> ContextSelection:
    """The seed's rule: a DEGRADED session shows its recent turns only."""
    return _recent(state) if state.health is MemoryHealth.DEGRADED else _summary_and_turns(state)


def _context_strategy(name: Strategy) -> ContextStrategy:
    match name:
        case "none":
            return ContextStrategy(name, Shown.NOTHING, view=None, content=None)
        case "truncation":
            return ContextStrategy(name, Shown.LAST_TURNS, view=_recent, content=_recent)
        case "rolling_summary":
            return ContextStrategy(
                name, Shown.SUMMARY_THEN_TURNS, view=_summary_unless_degraded, content=_summary_and_turns
            )
        case _:
            assert_never(name)


# The OpenAI-Agents strategies -------------------------------------------------------------


def _agents_view(name: AgentsStrategy) -> AgentsView:
    match name:
        case "none":
            return AgentsView(name, Shown.EVERY_TURN, every_item)
        case "trimming":
            return AgentsView(name, Shown.LAST_TURNS, trimmed_items)
        case "summarizing":
            return AgentsView(name, Shown.SUMMARY_THEN_TURNS, summarized_items, summarizing_zone)
        case "compacting":
            return AgentsView(name, Shown.COMPACTED, compacted_items)
        case _:
            assert_never(name)


# The conversation memories -----------------------------------------------------------------


def _memory_view(memory_type: MemoryType) -> MemoryView:
    match memory_type:
        case MemoryType.BUFFER:
            return MemoryView(memory_type, Shown.EVERY_TURN, buffer_messages, BufferMemory)
        case MemoryType.WINDOW:
            return MemoryView(memory_type, Shown.LAST_TURNS, window_messages, WindowMemory)
        case MemoryType.SUMMARY:
            return MemoryView(memory_type, Shown.SUMMARY_THEN_TURNS, summary_messages, SummaryMemory)
        case MemoryType.ENTITY:
            return MemoryView(memory_type, Shown.ENTITIES, entity_messages, EntityMemory)
        case _:
            assert_never(memory_type)


CONTEXT_STRATEGIES: Final[Mapping[Strategy, ContextStrategy]] = {
    name: _context_strategy(name) for name in get_args(Strategy)
}
AGENTS_STRATEGIES: Final[Mapping[AgentsStrategy, AgentsView]] = {
    name: _agents_view(name) for name in get_args(AgentsStrategy)
}
MEMORY_VIEWS: Final[Mapping[MemoryType, MemoryView]] = {kind: _memory_view(kind) for kind in MemoryType}


def agent_items(state: SessionState) -> list[dict[str, Any]]:
    """The session's items as its `agents.strategy` shows them to the model (fresh dicts)."""
    return AGENTS_STRATEGIES[state.config.agents.strategy].items(state)


def create_memory(memory_type: MemoryType, **kwargs: Any) -> Memory:
    """A new memory of `memory_type`, built with `kwargs`; `ValueError` for anything else."""
    entry = MEMORY_VIEWS.get(memory_type) if isinstance(memory_type, MemoryType) else None
    if entry is None:
        raise InvalidInput("memory_type", f"unsupported memory type {memory_type!r}; use a MemoryType member")
    return entry.memory_class(**kwargs)


def strategy_table() -> list[tuple[Shown, Strategy | None, AgentsStrategy | None, MemoryType | None]]:
    """One row per `Shown`: the name each vocabulary gives it (None where it has none).

    Each vocabulary names each idea at most once (``tests/test_strategies.py``).
    """

    return [
        (
            shown,
            _named(CONTEXT_STRATEGIES, shown),
            _named(AGENTS_STRATEGIES, shown),
            _named(MEMORY_VIEWS, shown),
        )
        for shown in Shown
    ]


def _named(entries: Mapping[N, ContextStrategy | AgentsView | MemoryView], shown: Shown) -> N | None:
    return next((name for name, entry in entries.items() if entry.shown is shown), None)
