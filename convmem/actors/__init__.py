"""The runtime: session actors, the summarizer pool, the clock, and the ports adapters implement."""

from convmem.actors._audit import (
    SessionCheck,
    SessionRow,
    TimelineRow,
    export_jsonl,
    list_sessions,
    read_jsonl,
    replay_session,
    timeline,
    verify,
)
from convmem.actors._clock import ManualClock, SystemClock
from convmem.actors._erasure import ErasureNotice, ErasureWatch, Unwatch
from convmem.actors._fork import Forked, fork_events
from convmem.actors._handles import AsyncSessionHandle, SessionHandle
from convmem.actors._live import SessionActivity
from convmem.actors._load import LoadReport, PoisonEvent, decode_logged, load_state
from convmem.actors._metrics import Metrics
from convmem.actors._pool import SummarizerPool, SummaryOutcome
from convmem.actors._ports import (
    Clock,
    EventLog,
    LoggedEvent,
    LoopEventLog,
    Settle,
    Snapshot,
    SnapshotStore,
    Summarizer,
    Timer,
)
from convmem.actors._services import SessionServices
from convmem.actors._system import Erased, MemorySystem

__all__ = [
    "AsyncSessionHandle",
    "Clock",
    "Erased",
    "ErasureNotice",
    "ErasureWatch",
    "EventLog",
    "Forked",
    "LoadReport",
    "LoggedEvent",
    "LoopEventLog",
    "ManualClock",
    "MemorySystem",
    "Metrics",
    "PoisonEvent",
    "SessionActivity",
    "SessionCheck",
    "SessionHandle",
    "SessionRow",
    "SessionServices",
    "Settle",
    "Snapshot",
    "SnapshotStore",
    "Summarizer",
    "SummarizerPool",
    "SummaryOutcome",
    "SystemClock",
    "TimelineRow",
    "Timer",
    "Unwatch",
    "decode_logged",
    "export_jsonl",
    "fork_events",
    "list_sessions",
    "load_state",
    "read_jsonl",
    "replay_session",
    "timeline",
    "verify",
]
