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
public ones, each imported on first use (`ConvmemChatMessageHistory` needs
the optional langchain-core), so importing one adapter loads no other.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from convmem.adapters.integrations.langchain import ConvmemChatMessageHistory
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

_LAZY = {
    **dict.fromkeys(("NatsAuth", "redact_url"), "convmem.adapters._auth"),
    **dict.fromkeys(
        ("Backend", "BackendOpener", "BackendOptions", "register_backend"), "convmem.adapters._backends"
    ),
    **dict.fromkeys(
        (
            "ConnectOptions",
            "MEMORY_URL",
            "connect",
            "connect_here",
            "connect_remote",
            "open_backend",
            "open_backend_here",
        ),
        "convmem.adapters._connect",
    ),
    **dict.fromkeys(("FileExportRegistry", "default_export_registry"), "convmem.adapters._exports"),
    **dict.fromkeys(
        ("InMemoryBackend", "InMemoryErasureJournal", "InMemoryEventLog", "InMemorySnapshotStore"),
        "convmem.adapters._in_memory",
    ),
    **dict.fromkeys(("PrometheusMetrics",), "convmem.adapters._prometheus"),
    **dict.fromkeys(("ConvmemSession",), "convmem.adapters.integrations.agents"),
    **dict.fromkeys(("ConvmemChatMessageHistory",), "convmem.adapters.integrations.langchain"),
    **dict.fromkeys(
        ("ConvmemShortTermMemory", "config_from_penguiflow", "turn_from_penguiflow"),
        "convmem.adapters.integrations.penguiflow",
    ),
    **dict.fromkeys(
        (
            "EmbeddedNatsServer",
            "JetStreamBackend",
            "JetStreamErasureJournal",
            "JetStreamEventLog",
            "JetStreamSnapshotStore",
        ),
        "convmem.adapters.jetstream",
    ),
    **dict.fromkeys(
        (
            "AsyncRemoteSession",
            "ClientOptions",
            "DEFAULT_API_PREFIX",
            "InternalError",
            "MalformedRequest",
            "MemoryService",
            "PermissionDenied",
            "Quotas",
            "RemoteError",
            "RemoteMemory",
            "RemoteSession",
            "ServiceUnavailable",
            "TenantLimits",
            "UnknownOperation",
            "UnsupportedVersion",
            "operator_subject",
            "session_subject",
        ),
        "convmem.adapters.service",
    ),
    **dict.fromkeys(
        ("ExtractiveSummarizer", "MemorySetup", "OpenAIChatSummarizer", "ProcessSummarizer", "recommended"),
        "convmem.adapters.summarizers",
    ),
}
"""Where each name lives: each is imported on first use, so importing one adapter loads no other."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'convmem.adapters' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
