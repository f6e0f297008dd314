"""Pure logic: the fold, the decisions, the health machine, every strategy and its view. No I/O.

Every memory strategy of the three vocabularies (PenguiFlow's `Strategy`, the
OpenAI-Agents `AgentsStrategy`, the conversation memories' `MemoryType`) is one
entry of the tables in ``_strategies``, beside what it shows. What a session
remembers of its keyed writes, for exactly-once without a time limit, is in
``_idempotency``. Retention's decisions (erase an idle session, compact a
history to its summary and newest turns, and the fold of a compaction) are in
``_retention``, with the report of a sweep. The runtime's pure rules live here too, the actors only
carrying them out: a write's steps (``_write_protocol``), which stored
messages of a session are its events (``_sequence``), and when a live session
saves a snapshot (``_snapshot_cadence``); how an event reads in a timeline
(``_describe``).
"""

from convmem.projections._agents import (
    CROSS_SESSION_HEADER,
    SUMMARY_REQUEST_LINE,
    agent_items_tokens,
    compact_turn_items,
    cross_session_instructions,
    latest_summary_for_user,
    without_orphan_results,
)
from convmem.projections._budget import (
    ContextSelection,
    TokenEstimator,
    default_token_estimator,
    fit,
    render,
    trim_summary,
)
from convmem.projections._commands import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Clear,
    Command,
    PopItem,
    Restore,
    StartSession,
    SummaryFailed,
    SummarySucceeded,
)
from convmem.projections._context import (
    estimate_tokens,
    full_tokens,
    llm_context,
    select_context,
    view_tokens,
)
from convmem.projections._decide import Decision, decide, decide_folded
from convmem.projections._describe import describe_event
from convmem.projections._entities import EntityRecord, EntityTable, parse_entities
from convmem.projections._evolve import SkippedEvent, evolve, replay, skipped_from_error
from convmem.projections._health import (
    Summarizer,
    SummaryRequest,
    next_due_at,
    summary_due,
    summary_plan,
    summary_problem,
    summary_room,
)
from convmem.projections._horizon import live_horizon, without_horizon
from convmem.projections._idempotency import already_applied, command_id_for
from convmem.projections._memories import (
    BufferMemory,
    EntityMemory,
    Memory,
    MemoryMessage,
    MemoryType,
    MessageSummarizer,
    SummaryMemory,
    WindowMemory,
)
from convmem.projections._memory_views import (
    buffer_messages,
    entity_messages,
    entity_table,
    summary_messages,
    window_messages,
)
from convmem.projections._recall import (
    MAX_QUERY_CHARS,
    RECALL_KEY,
    Relevance,
    check_query,
    ranked_lines,
    trim_by_relevance,
)
from convmem.projections._retention import (
    Compact,
    EraseIdle,
    FinishCompaction,
    HistoryFacts,
    RetentionAction,
    RetentionOutcome,
    RetentionProblem,
    RetentionReport,
    compacted_state,
    compaction,
    history_facts,
    plan_retention,
)
from convmem.projections._sequence import SessionSequence, names_another
from convmem.projections._serial import (
    EXPORT_VERSION,
    decode_state,
    encode_state,
    parse_export,
    state_hash,
    to_dict,
)
from convmem.projections._snapshot_cadence import (
    LIVE_TURNS_PER_SAVE_EVENT,
    snapshot_due,
    snapshot_interval,
    snapshot_offset,
)
from convmem.projections._state import SessionState, TurnRecord, rendered_turn_length
from convmem.projections._strategies import (
    AGENTS_STRATEGIES,
    CONTEXT_STRATEGIES,
    MEMORY_VIEWS,
    AgentsView,
    ContextStrategy,
    MemoryView,
    Shown,
    agent_items,
    create_memory,
    strategy_table,
)

__all__ = [
    "AGENTS_STRATEGIES",
    "CONTEXT_STRATEGIES",
    "CROSS_SESSION_HEADER",
    "EXPORT_VERSION",
    "LIVE_TURNS_PER_SAVE_EVENT",
    "MAX_QUERY_CHARS",
    "MEMORY_VIEWS",
    "RECALL_KEY",
    "SUMMARY_REQUEST_LINE",
    "AddItems",
    "AddTurn",
    "AdoptTurns",
    "AgentsView",
    "BufferMemory",
    "Clear",
    "Command",
    "Compact",
    "ContextSelection",
    "ContextStrategy",
    "Decision",
    "EntityMemory",
    "EntityRecord",
    "EntityTable",
    "EraseIdle",
    "FinishCompaction",
    "HistoryFacts",
    "Memory",
    "MemoryMessage",
    "MemoryType",
    "MemoryView",
    "MessageSummarizer",
    "PopItem",
    "Relevance",
    "Restore",
    "RetentionAction",
    "RetentionOutcome",
    "RetentionProblem",
    "RetentionReport",
    "SessionSequence",
    "SessionState",
    "Shown",
    "SkippedEvent",
    "StartSession",
    "Summarizer",
    "SummaryFailed",
    "SummaryMemory",
    "SummaryRequest",
    "SummarySucceeded",
    "TokenEstimator",
    "TurnRecord",
    "WindowMemory",
    "agent_items",
    "agent_items_tokens",
    "already_applied",
    "buffer_messages",
    "check_query",
    "command_id_for",
    "compact_turn_items",
    "compacted_state",
    "compaction",
    "create_memory",
    "cross_session_instructions",
    "decide",
    "decide_folded",
    "decode_state",
    "default_token_estimator",
    "describe_event",
    "encode_state",
    "entity_messages",
    "entity_table",
    "estimate_tokens",
    "evolve",
    "fit",
    "full_tokens",
    "history_facts",
    "latest_summary_for_user",
    "live_horizon",
    "llm_context",
    "names_another",
    "next_due_at",
    "parse_entities",
    "parse_export",
    "plan_retention",
    "ranked_lines",
    "render",
    "rendered_turn_length",
    "replay",
    "select_context",
    "skipped_from_error",
    "snapshot_due",
    "snapshot_interval",
    "snapshot_offset",
    "state_hash",
    "strategy_table",
    "summary_due",
    "summary_messages",
    "summary_plan",
    "summary_problem",
    "summary_room",
    "to_dict",
    "trim_by_relevance",
    "trim_summary",
    "view_tokens",
    "window_messages",
    "without_horizon",
    "without_orphan_results",
]
