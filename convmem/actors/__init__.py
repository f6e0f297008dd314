"""The runtime: session actors, the summarizer pool, the clock, and the ports adapters implement."""

from convmem.actors._ports import (
    Clock,
    EventLog,
    LoggedEvent,
    Snapshot,
    SnapshotStore,
    Summarizer,
    Timer,
)

__all__ = [
    "Clock",
    "EventLog",
    "LoggedEvent",
    "Snapshot",
    "SnapshotStore",
    "Summarizer",
    "Timer",
]
