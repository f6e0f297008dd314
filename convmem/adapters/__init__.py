"""The edges: logs, snapshot stores, summarizers, integrations, service and CLI.

Grouped by purpose: `jetstream/` (the durable log, snapshots, connection and
embedded server), `service/` (the NATS request/reply API and its clients),
`cli/` (the `convmem` command), `integrations/` (agent frameworks),
`summarizers/` and `keys/` (encryption at rest: master keys, key stores, the
keyring that seals events and snapshots per user); `_in_memory` (the in-memory log),
`_backends` (the `Backend` protocol and the one registry of URL schemes), `_connect` (`connect()`, which
opens a backend by its URL), `_loop_thread` (an event loop on its own thread),
`_prometheus` (`PrometheusMetrics`: the Prometheus registry that systems and
services count into, and its HTTP endpoint) and `_views` (what the
integrations' sessions and the service compute alike: the Agents items, a
session's start) serve them all. The names below are the
public ones; `ConvmemChatMessageHistory` (LangChain) is imported on first use,
as it needs the optional langchain-core.
"""

import importlib
from typing import Any

from convmem.adapters._auth import NatsAuth, redact_url
from convmem.adapters._backends import Backend, BackendOpener, BackendOptions, register_backend
from convmem.adapters._connect import (
    MEMORY_URL,
    ConnectOptions,
    connect,
    connect_here,
    connect_remote,
    open_backend,
    open_backend_here,
)
from convmem.adapters._exports import FileExportRegistry, default_export_registry
from convmem.adapters._in_memory import (
    InMemoryBackend,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
)
from convmem.adapters._prometheus import PrometheusMetrics
from convmem.adapters.integrations.agents import ConvmemSession
from convmem.adapters.integrations.penguiflow import (
    ConvmemShortTermMemory,
    config_from_penguiflow,
    turn_from_penguiflow,
)
from convmem.adapters.jetstream import (
    EmbeddedNatsServer,
    JetStreamBackend,
    JetStreamErasureJournal,
    JetStreamEventLog,
    JetStreamSnapshotStore,
)
from convmem.adapters.service import (
    DEFAULT_API_PREFIX,
    AsyncRemoteSession,
    ClientOptions,
    InternalError,
    MalformedRequest,
    MemoryService,
    PermissionDenied,
    Quotas,
    RemoteError,
    RemoteMemory,
    RemoteSession,
    ServiceUnavailable,
    TenantLimits,
    UnknownOperation,
    UnsupportedVersion,
    operator_subject,
    session_subject,
)
from convmem.adapters.summarizers import (
    ExtractiveSummarizer,
    MemorySetup,
    OpenAIChatSummarizer,
    ProcessSummarizer,
    recommended,
)

__all__ = [
    "DEFAULT_API_PREFIX",
    "MEMORY_URL",
    "AsyncRemoteSession",
    "Backend",
    "BackendOpener",
    "BackendOptions",
    "ClientOptions",
    "ConnectOptions",
    "ConvmemChatMessageHistory",
    "ConvmemSession",
    "ConvmemShortTermMemory",
    "EmbeddedNatsServer",
    "ExtractiveSummarizer",
    "FileExportRegistry",
    "InMemoryBackend",
    "InMemoryErasureJournal",
    "InMemoryEventLog",
    "InMemorySnapshotStore",
    "InternalError",
    "JetStreamBackend",
    "JetStreamErasureJournal",
    "JetStreamEventLog",
    "JetStreamSnapshotStore",
    "MalformedRequest",
    "MemoryService",
    "MemorySetup",
    "NatsAuth",
    "OpenAIChatSummarizer",
    "PermissionDenied",
    "ProcessSummarizer",
    "PrometheusMetrics",
    "Quotas",
    "RemoteError",
    "RemoteMemory",
    "RemoteSession",
    "ServiceUnavailable",
    "TenantLimits",
    "UnknownOperation",
    "UnsupportedVersion",
    "config_from_penguiflow",
    "connect",
    "connect_here",
    "connect_remote",
    "default_export_registry",
    "open_backend",
    "open_backend_here",
    "operator_subject",
    "recommended",
    "redact_url",
    "register_backend",
    "session_subject",
    "turn_from_penguiflow",
]

_LAZY = {"ConvmemChatMessageHistory": "convmem.adapters.integrations.langchain"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'convmem.adapters' has no attribute {name!r}")
