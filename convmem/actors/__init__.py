"""The runtime: session actors and their handles, the write path, the summarizer pool, the ports.

- `MemorySystem` (`_system`) is the public face; it hands out `SessionHandle`
  and `AsyncSessionHandle` (`_handles`, whose write operations are written
  once in `_handle_writes`, answered through `_answers`).
- `LiveSessions` (`_live`) keeps the live `SessionActor`s (`_session`) on a
  `Dispatcher`'s threads (`_dispatch`), and is their `SessionHost`.
  A write's rules are the pure step machine of `convmem.projections._write_protocol`;
  the actor carries out its effects, and a write without an idempotency key
  gets a fresh command id (`_ids`). Sessions leave the live set through
  `_leave`; their state and view stay in the byte-bounded `IdleCache`
  (`_idle`), which serves reads with no actor.
- What sessions run with: `SessionStorage` (`_storage`, over the log and
  snapshots; rebuilding in `_load`, which counts a session's version as every
  log's writer does, by `SessionSequence`, a pure rule of `convmem.projections`),
  `ServiceRegistry` and `SessionServices`
  (`_services`), `Callbacks` (`_callbacks`), the `SummarizerPool` (`_pool`,
  a call's outcome and coroutine summarizers' loops in `_calls`), clocks
  (`_clock`), `Metrics` and the `MetricsSink` port (`_metrics`).
- The ports adapters implement (`_ports`: `EventLog`, `LoopEventLog`,
  `SnapshotStore`, `Summarizer`, `Clock`, and `Settle`, the one shape of an
  answer handed across threads); erasure notices (`_erasure`), the erasure
  journal (`_journal`) and the erasure steps (`_eraser`); lost sessions'
  restore (`_restore`); audits (`_audit`), the context a replayed state served
  (`_served`), forks (`_fork`) and repairs of
  damaged sessions (`_repair`); the bounds every numeric setting and call
  timeout is checked against (`_bounds`).
"""

from convmem.actors._answers import Deadlines, SettleOnce
from convmem.actors._audit import (
    SessionCheck,
    SessionPage,
    SessionRow,
    TimelineRow,
    export_jsonl,
    list_session_page,
    list_sessions,
    read_jsonl,
    read_scope,
    replay_session,
    timeline,
    verify,
)
from convmem.actors._calls import SummaryOutcome
from convmem.actors._clock import ManualClock, SystemClock
from convmem.actors._eraser import ERASURE_STEPS, Erased, Eraser, ErasureStep, ExportRegistry
from convmem.actors._erasure import ErasureNotice, ErasureWatch, KeyShredder, Unwatch
from convmem.actors._fork import Forked, fork_events
from convmem.actors._handles import AsyncSessionHandle, SessionHandle
from convmem.actors._journal import (
    DamagedRecord,
    ErasureJournal,
    ErasureJournalDamaged,
    ErasureReceipt,
    ErasureRecord,
    ErasureRequest,
    JournaledLog,
    find_erasure,
)
from convmem.actors._live import SessionActivity
from convmem.actors._load import LoadReport, PoisonEvent, decode_logged, load_state
from convmem.actors._metrics import Metrics, MetricsSink
from convmem.actors._pool import SummarizerPool
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
from convmem.actors._repair import RepairPlan, plan_repair, repair_session
from convmem.actors._restore import Restored, restore_lost
from convmem.actors._retention import RetentionSweeper, sweep_retention
from convmem.actors._served import replayed_context, replayed_estimator
from convmem.actors._services import SessionServices
from convmem.actors._system import MemorySystem
from convmem.actors._system_settings import SystemOptions, SystemSettings
from convmem.actors._tokens import TokenCounter, encoding_counter, token_counter_of
from convmem.projections import (  # pure values and rules, re-exported where users found them
    RetentionOutcome,
    RetentionProblem,
    RetentionReport,
    SessionSequence,
)

__all__ = [
    "ERASURE_STEPS",
    "AsyncSessionHandle",
    "Clock",
    "DamagedRecord",
    "Deadlines",
    "Erased",
    "Eraser",
    "ErasureJournal",
    "ErasureJournalDamaged",
    "ErasureNotice",
    "ErasureReceipt",
    "ErasureRecord",
    "ErasureRequest",
    "ErasureStep",
    "ErasureWatch",
    "EventLog",
    "ExportRegistry",
    "Forked",
    "JournaledLog",
    "KeyShredder",
    "LoadReport",
    "LoggedEvent",
    "LoopEventLog",
    "ManualClock",
    "MemorySystem",
    "Metrics",
    "MetricsSink",
    "PoisonEvent",
    "RepairPlan",
    "Restored",
    "RetentionOutcome",
    "RetentionProblem",
    "RetentionReport",
    "RetentionSweeper",
    "SessionActivity",
    "SessionCheck",
    "SessionHandle",
    "SessionPage",
    "SessionRow",
    "SessionSequence",
    "SessionServices",
    "Settle",
    "SettleOnce",
    "Snapshot",
    "SnapshotStore",
    "Summarizer",
    "SummarizerPool",
    "SummaryOutcome",
    "SystemClock",
    "SystemOptions",
    "SystemSettings",
    "TimelineRow",
    "Timer",
    "TokenCounter",
    "Unwatch",
    "decode_logged",
    "encoding_counter",
    "export_jsonl",
    "find_erasure",
    "fork_events",
    "list_session_page",
    "list_sessions",
    "load_state",
    "plan_repair",
    "read_jsonl",
    "read_scope",
    "repair_session",
    "replay_session",
    "replayed_context",
    "replayed_estimator",
    "restore_lost",
    "sweep_retention",
    "timeline",
    "token_counter_of",
    "verify",
]
