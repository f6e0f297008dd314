"""Back ends: what implements the runtime's ports (event logs, snapshot stores, summarizers, keys, metrics).

`jetstream/` (the durable log, snapshot store and erasure journal on NATS
JetStream, their connection and the embedded server), `keys/` (encryption at
rest: master keys, key stores, the keyring), `summarizers/` (the offline
extractive summarizer, the OpenAI-compatible one, the process-pool one);
beside them `_in_memory` (the log, snapshot store and journal held in this
process), `_registry` (the `Backend` protocol and the one registry of URL
schemes), `_exports` (the registry of exported copies that erasure finds),
`_prometheus` (`PrometheusMetrics`, a `MetricsSink`), and what both logs
share (`_log_bytes`, `_checksum`). A back end never imports a front end
(`tests/test_layers.py`). The names below are what front ends use; each is
imported on first use, so importing the in-memory log loads no NATS client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convmem._lazy import lazy_exports

if TYPE_CHECKING:
    from convmem.adapters.backends._exports import FileExportRegistry, default_export_registry
    from convmem.adapters.backends._in_memory import (
        MEMORY_URL,
        InMemoryBackend,
        InMemoryErasureJournal,
        InMemoryEventLog,
        InMemorySnapshotStore,
    )
    from convmem.adapters.backends._prometheus import PrometheusMetrics
    from convmem.adapters.backends._registry import (
        Backend,
        BackendOpener,
        BackendOptions,
        backend_opener,
        register_backend,
    )

_LAZY = {
    **dict.fromkeys(("FileExportRegistry", "default_export_registry"), "convmem.adapters.backends._exports"),
    **dict.fromkeys(
        (
            "MEMORY_URL",
            "InMemoryBackend",
            "InMemoryErasureJournal",
            "InMemoryEventLog",
            "InMemorySnapshotStore",
        ),
        "convmem.adapters.backends._in_memory",
    ),
    "PrometheusMetrics": "convmem.adapters.backends._prometheus",
    **dict.fromkeys(
        ("Backend", "BackendOpener", "BackendOptions", "backend_opener", "register_backend"),
        "convmem.adapters.backends._registry",
    ),
}
"""Where each name lives."""

__all__ = [
    "MEMORY_URL",
    "Backend",
    "BackendOpener",
    "BackendOptions",
    "FileExportRegistry",
    "InMemoryBackend",
    "InMemoryErasureJournal",
    "InMemoryEventLog",
    "InMemorySnapshotStore",
    "PrometheusMetrics",
    "backend_opener",
    "default_export_registry",
    "register_backend",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
