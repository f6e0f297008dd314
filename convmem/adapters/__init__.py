"""The edges: logs, snapshot stores, summarizers, integrations, service and CLI."""

from convmem.adapters._memory import InMemoryEventLog, InMemorySnapshotStore

__all__ = ["InMemoryEventLog", "InMemorySnapshotStore"]
