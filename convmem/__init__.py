"""convmem: short-term conversation memory for LLM planners, event-sourced on NATS JetStream.

This module is the public face: everything a user needs is a name here, and
importing `convmem` loads nothing heavy (each name is imported on first use):

* the system and its handles: `connect` (`connect_here` from a coroutine),
  `recommended`, `MemorySystem` (its settings one `SystemSettings` value), `SessionHandle`,
  `AsyncSessionHandle`, `ConnectOptions`;
* the values: `MemoryKey`, `ConversationTurn`, `TrajectoryDigest`,
  `MessageItem`, `EntityMention`, `ShortTermMemoryConfig`, `AgentsMemoryConfig`,
  `MemoryBudget`, `MemoryHealth`, `RetentionPolicy`, `RetentionPolicies`,
  `KeySettings` (and `generate_key_text` for a new master key);
* the errors (`ConvmemError` is the root of every one; the whole tree is in
  `convmem.errors`);
* the service and its clients: `connect_remote`, `MemoryService`,
  `RemoteSession`, `AsyncRemoteSession`, `EmbeddedNatsServer`;
* the integrations' entry points: `ConvmemSession` (OpenAI Agents SDK),
  `ConvmemChatMessageHistory` (LangChain), `ConvmemShortTermMemory` and the
  `convmem.penguiflow` drop-in (PenguiFlow);
* operations: `PrometheusMetrics`, `ExtractiveSummarizer`, and the audit
  tools `verify`, `timeline`, `export_jsonl`, `read_jsonl`, `replay_session`,
  `replayed_context` (the context a replayed state served), `list_sessions`.

`convmem.testing` (`testing/`) holds what tests and new back ends need: the
in-memory log and snapshot store, a manual clock, and the contract suites a
back end passes.

Those who extend convmem use the four layers, each importing only those
before it: `events/` (the vocabulary: keys, turns, configuration, events,
codec), `projections/` (pure logic: folds, decisions, every strategy's
view), `actors/` (the runtime: a session actor per live session, the
summarizer pool, the ports) and `adapters/` (back ends and front ends:
JetStream, the service, the CLI, integrations, summarizers); `errors` holds
the exception tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem._lazy import lazy_exports
from convmem.errors import (
    ConcurrencyConflict,
    ConvmemError,
    InvalidConfig,
    InvalidInput,
    InvalidKey,
    InvalidTurn,
    LogUnavailable,
    MemoryBudgetExceeded,
    OperationTimeout,
    SessionClosed,
    SessionDamaged,
    TenantLimitReached,
)

if TYPE_CHECKING:
    from convmem.actors import (
        AsyncSessionHandle,
        MemorySystem,
        SessionHandle,
        SystemSettings,
        export_jsonl,
        list_sessions,
        read_jsonl,
        replay_session,
        replayed_context,
        timeline,
        verify,
    )
    from convmem.adapters import (
        AsyncRemoteSession,
        ConnectOptions,
        ConvmemChatMessageHistory,
        ConvmemSession,
        ConvmemShortTermMemory,
        EmbeddedNatsServer,
        ExtractiveSummarizer,
        MemoryService,
        PrometheusMetrics,
        RemoteSession,
        connect,
        connect_here,
        connect_remote,
        recommended,
    )
    from convmem.adapters.backends.keys import KeySettings, generate_key_text
    from convmem.events import (
        AgentsMemoryConfig,
        ConversationTurn,
        EntityMention,
        MemoryBudget,
        MemoryHealth,
        MemoryKey,
        MessageItem,
        RetentionPolicies,
        RetentionPolicy,
        ShortTermMemoryConfig,
        TrajectoryDigest,
    )

from convmem._version import __version__

_LAZY = {
    **dict.fromkeys(
        (
            "AgentsMemoryConfig",
            "ConversationTurn",
            "EntityMention",
            "MemoryBudget",
            "MemoryHealth",
            "MemoryKey",
            "MessageItem",
            "RetentionPolicies",
            "RetentionPolicy",
            "ShortTermMemoryConfig",
            "TrajectoryDigest",
        ),
        "convmem.events",
    ),
    **dict.fromkeys(
        (
            "AsyncSessionHandle",
            "MemorySystem",
            "SessionHandle",
            "SystemSettings",
            "export_jsonl",
            "list_sessions",
            "read_jsonl",
            "replay_session",
            "replayed_context",
            "timeline",
            "verify",
        ),
        "convmem.actors",
    ),
    **dict.fromkeys(
        (
            "AsyncRemoteSession",
            "ConnectOptions",
            "ConvmemChatMessageHistory",
            "ConvmemSession",
            "ConvmemShortTermMemory",
            "EmbeddedNatsServer",
            "ExtractiveSummarizer",
            "MemoryService",
            "PrometheusMetrics",
            "RemoteSession",
            "connect",
            "connect_here",
            "connect_remote",
            "recommended",
        ),
        "convmem.adapters",
    ),
    **dict.fromkeys(("KeySettings", "generate_key_text"), "convmem.adapters.backends.keys"),
}
"""Where each lazily imported name lives (the layer package that exports it)."""

__all__ = [
    "AgentsMemoryConfig",
    "AsyncRemoteSession",
    "AsyncSessionHandle",
    "ConcurrencyConflict",
    "ConnectOptions",
    "ConversationTurn",
    "ConvmemChatMessageHistory",
    "ConvmemError",
    "ConvmemSession",
    "ConvmemShortTermMemory",
    "EmbeddedNatsServer",
    "EntityMention",
    "ExtractiveSummarizer",
    "InvalidConfig",
    "InvalidInput",
    "InvalidKey",
    "InvalidTurn",
    "KeySettings",
    "LogUnavailable",
    "MemoryBudget",
    "MemoryBudgetExceeded",
    "MemoryHealth",
    "MemoryKey",
    "MemoryService",
    "MemorySystem",
    "MessageItem",
    "OperationTimeout",
    "PrometheusMetrics",
    "RemoteSession",
    "RetentionPolicies",
    "RetentionPolicy",
    "SessionClosed",
    "SessionDamaged",
    "SessionHandle",
    "ShortTermMemoryConfig",
    "SystemSettings",
    "TenantLimitReached",
    "TrajectoryDigest",
    "__version__",
    "connect",
    "connect_here",
    "connect_remote",
    "export_jsonl",
    "generate_key_text",
    "list_sessions",
    "read_jsonl",
    "recommended",
    "replay_session",
    "replayed_context",
    "timeline",
    "verify",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
