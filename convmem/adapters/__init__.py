"""The edges: back ends that implement the runtime's ports, and front ends that use the runtime.

`backends/` implements the ports (`convmem.actors`' `EventLog`,
`SnapshotStore`, `Summarizer`, `MetricsSink`, ...): the JetStream log and
snapshot store, the in-memory ones, summarizers, encryption keys, metrics.
`frontends/` uses the runtime: the service and its clients, the CLI, the
PenguiFlow / Agents / LangChain integrations, `connect()`. Beside them, what
both use to talk to NATS: `_auth` (credentials, TLS, redaction) and
`_loop_thread` (an event loop on its own thread). A back end never imports a
front end, and a front end reaches a back end only through its package's
names (`tests/test_layers.py`). The names below are the public ones, each
imported on first use (`ConvmemChatMessageHistory` needs the optional
langchain-core), so importing one adapter loads no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem._lazy import lazy_exports

if TYPE_CHECKING:
    from convmem.adapters._auth import NatsAuth, redact_url
    from convmem.adapters.backends._exports import FileExportRegistry, default_export_registry
    from convmem.adapters.backends._in_memory import (
        InMemoryBackend,
        InMemoryErasureJournal,
        InMemoryEventLog,
        InMemorySnapshotStore,
    )
    from convmem.adapters.backends._prometheus import PrometheusMetrics
    from convmem.adapters.backends._registry import Backend, BackendOpener, BackendOptions, register_backend
    from convmem.adapters.backends.jetstream import (
        EmbeddedNatsServer,
        JetStreamBackend,
        JetStreamErasureJournal,
        JetStreamEventLog,
        JetStreamSnapshotStore,
    )
    from convmem.adapters.backends.summarizers import (
        ExtractiveSummarizer,
        MemorySetup,
        OpenAIChatSummarizer,
        ProcessSummarizer,
        recommended,
    )
    from convmem.adapters.frontends._connect import (
        MEMORY_URL,
        ConnectOptions,
        connect,
        connect_here,
        connect_remote,
        open_backend,
        open_backend_here,
    )
    from convmem.adapters.frontends.integrations.agents import ConvmemSession
    from convmem.adapters.frontends.integrations.langchain import ConvmemChatMessageHistory
    from convmem.adapters.frontends.integrations.penguiflow import (
        ConvmemShortTermMemory,
        config_from_penguiflow,
        turn_from_penguiflow,
    )
    from convmem.adapters.frontends.service import (
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
        ("Backend", "BackendOpener", "BackendOptions", "register_backend"),
        "convmem.adapters.backends._registry",
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
        "convmem.adapters.frontends._connect",
    ),
    **dict.fromkeys(("FileExportRegistry", "default_export_registry"), "convmem.adapters.backends._exports"),
    **dict.fromkeys(
        ("InMemoryBackend", "InMemoryErasureJournal", "InMemoryEventLog", "InMemorySnapshotStore"),
        "convmem.adapters.backends._in_memory",
    ),
    **dict.fromkeys(("PrometheusMetrics",), "convmem.adapters.backends._prometheus"),
    **dict.fromkeys(("ConvmemSession",), "convmem.adapters.frontends.integrations.agents"),
    **dict.fromkeys(("ConvmemChatMessageHistory",), "convmem.adapters.frontends.integrations.langchain"),
    **dict.fromkeys(
        ("ConvmemShortTermMemory", "config_from_penguiflow", "turn_from_penguiflow"),
        "convmem.adapters.frontends.integrations.penguiflow",
    ),
    **dict.fromkeys(
        (
            "EmbeddedNatsServer",
            "JetStreamBackend",
            "JetStreamErasureJournal",
            "JetStreamEventLog",
            "JetStreamSnapshotStore",
        ),
        "convmem.adapters.backends.jetstream",
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
        "convmem.adapters.frontends.service",
    ),
    **dict.fromkeys(
        ("ExtractiveSummarizer", "MemorySetup", "OpenAIChatSummarizer", "ProcessSummarizer", "recommended"),
        "convmem.adapters.backends.summarizers",
    ),
}
"""Where each name lives: each is imported on first use, so importing one adapter loads no other."""


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
