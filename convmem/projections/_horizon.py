"""The live horizon: which turns a live session keeps, as part of the fold.

The log keeps a session's whole history; its live state keeps what its views
can still show or summarize. `bound` is applied by `evolve` after every event
that adds turns or moves the summary watermark, so a replay of the whole log,
a snapshot plus its tail and a live session all hold the same turns (the
fold's law), and a state's size, its snapshot and the cost of each write stop
growing with the history.

A state keeps, of its turns since the last clear:

* the last `live_horizon(config)` turns: ``config.live_turns``, raised to
  whatever another setting shows (the full zone, the Agents strategies'
  turn counts, the memories' message windows: each turn gives at most two
  messages, so a window of n messages needs at most n turns);
* for a summarizing session, every turn no summary covers and no backlog trim
  dropped (the health machine bounds those: DEGRADED keeps at most
  `recovery_backlog_limit` of them).

What leaves the live state is summed up where a view still needs it: the
entity memory counts mentions over the whole session, so the mentions of the
retired turns are folded into `SessionState.retired_entities` (the entity
table is a left fold, so folding the retired turns and then the live ones
gives the table of every turn). `retired_through` says which turn numbers
went: the log still holds them (`convmem export`, `replay --position`, the timeline, forks).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar, cast

import msgspec

from convmem.events import HistoryCompacted, SessionStarted, ShortTermMemoryConfig
from convmem.projections._entities import track_entities
from convmem.projections._state import SessionState

__all__ = ["bound", "live_horizon", "without_horizon"]

_E = TypeVar("_E")


_last: tuple[ShortTermMemoryConfig, int | None] | None = None
"""The configuration `live_horizon` was asked of last, and its answer (a session asks on every
write with the same configuration object: nine settings read and compared once, not per write)."""


def live_horizon(config: ShortTermMemoryConfig) -> int | None:
    """The number of last turns a live session keeps whatever its watermarks (None: every turn)."""
    global _last  # noqa: PLW0603 - the one-entry memo of a pure function
    last = _last
    if last is not None and last[0] is config:
        return last[1]
    horizon = _horizon(config)
    _last = (config, horizon)
    return horizon


def _horizon(config: ShortTermMemoryConfig) -> int | None:
    if config.live_turns is None:
        return None
    agents, memories = config.agents, config.memories
    return max(
        config.live_turns,
        config.budget.full_zone_turns,
        agents.max_turns,
        agents.context_limit,
        agents.compact_trigger_turns + 1,
        agents.compact_keep,
        memories.window_size,
        memories.entity_recent_messages,
        memories.max_messages or 0,
    )


def bound(state: SessionState) -> SessionState:
    """`state` without the turns past its horizon (the same object when nothing goes)."""
    horizon = live_horizon(state.config)
    turns = state.turns
    if horizon is None or len(turns) <= horizon:
        return state
    cut = len(turns) - horizon
    if state.config.summarizes:
        # Unsummarized turns stay: a summary has yet to cover them.
        cut = min(cut, len(turns) - len(state.unsummarized()))
    if cut <= 0:
        return state
    retired = turns[:cut]
    entities = state.retired_entities
    limit = state.config.memories.entity_max
    for record in retired:
        if record.turn.entities:
            entities = track_entities(entities, record.turn.entities, limit)
    return msgspec.structs.replace(
        state,
        turns=turns[cut:],
        retired_through=max(state.retired_through, retired[-1].index),
        retired_entities=entities,
    )


def without_horizon(events: Iterable[_E]) -> Iterator[_E]:
    """`events` with each session start's `live_turns` lifted, so their fold keeps every turn.

    For the views that show the whole history (the Agents SDK's `get_items()`
    with no limit, for one) once the live state has retired turns: the caller
    reads the session's events from the log and folds them through this.
    """
    for event in events:
        if isinstance(event, SessionStarted | HistoryCompacted) and event.config.live_turns is not None:
            whole = msgspec.structs.replace(event.config, live_turns=None)
            yield cast("_E", msgspec.structs.replace(event, config=whole))
        else:
            yield event
