"""convmem: short-term conversation memory for LLM planners, event-sourced on NATS JetStream.

The common names are available here lazily (importing `convmem` alone loads
nothing heavy): `convmem.connect` (and `convmem.connect_here` for asyncio),
`convmem.connect_remote` (a connection to a running convmem service),
`convmem.MemorySystem`, `convmem.MemoryKey`, `convmem.ConversationTurn`,
`convmem.ShortTermMemoryConfig`, `convmem.MemoryBudget`, and `convmem.recommended`
(the recommended offline configuration and summarizer for a token budget).

The package holds four layers, each importing only those before it:
`events/` (the vocabulary: keys, turns, configuration, events, codec),
`projections/` (pure logic: folds, decisions, every strategy's view),
`actors/` (the runtime: a session actor per live session, the summarizer
pool, the ports) and `adapters/` (the edges: JetStream, the service, the
CLI, integrations, summarizers); `errors` holds the exception tree.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ConversationTurn": "convmem.events",
    "MemoryBudget": "convmem.events",
    "MemoryHealth": "convmem.events",
    "MemoryKey": "convmem.events",
    "MemorySystem": "convmem.actors",
    "PrometheusMetrics": "convmem.adapters",
    "RetentionPolicies": "convmem.events",
    "RetentionPolicy": "convmem.events",
    "ShortTermMemoryConfig": "convmem.events",
    "TrajectoryDigest": "convmem.events",
    "connect": "convmem.adapters",
    "connect_here": "convmem.adapters",
    "connect_remote": "convmem.adapters",
    "recommended": "convmem.adapters",
}

__all__ = [
    "ConversationTurn",
    "MemoryBudget",
    "MemoryHealth",
    "MemoryKey",
    "MemorySystem",
    "PrometheusMetrics",
    "RetentionPolicies",
    "RetentionPolicy",
    "ShortTermMemoryConfig",
    "TrajectoryDigest",
    "__version__",
    "connect",
    "connect_here",
    "connect_remote",
    "recommended",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'convmem' has no attribute {name!r}")
