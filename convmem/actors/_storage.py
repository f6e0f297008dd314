"""`SessionStorage`: the log and the snapshot store as the runtime uses them.

One object for everything a session keeps outside memory: rebuilding a
session (`load`: snapshot plus the log's tail), beginning a write's append
(`appender`: on the log's own loop when it is a `LoopEventLog`, else
right here), reading what the log holds, and saving snapshots (never
failing a write for want of one: a lost snapshot only costs a longer replay).

When a snapshot falls due is a pure rule of the session's key and version
(`snapshot_due`, in `convmem.projections`); saving it is done here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from convmem.actors._journal import ErasureJournal
from convmem.actors._load import LoadReport, OnPoison, load_state
from convmem.actors._ports import (
    EventLog,
    LoggedEvent,
    LoopEventLog,
    Settle,
    SnapshotStore,
    position_of,
    snapshot_of,
)
from convmem.events import Event, MemoryKey
from convmem.projections import SessionState

__all__ = ["SessionStorage"]

_log = logging.getLogger("convmem.session")


class SessionStorage:
    """The sessions' log and snapshots: loads, appends, reads, snapshot saves."""

    def __init__(
        self,
        log: EventLog,
        snapshots: SnapshotStore | None,
        *,
        on_poison: OnPoison = "skip",
        snapshot_every: int = 50,
        journal: ErasureJournal | None = None,
    ) -> None:
        self.log = log
        self.journal = journal
        """Where erasures are recorded: a snapshot is deleted as erased only when it has a record."""
        self.snapshots = snapshots
        self.on_poison: OnPoison = on_poison
        self.snapshot_every = snapshot_every
        """A live session saves a snapshot every this many events, at its own offset (`snapshot_due`)."""
        self.loop_log: LoopEventLog | None = log if isinstance(log, LoopEventLog) else None
        """The log, when its appends run on a loop of its own (then writes are settled there)."""

    @property
    def settles_here(self) -> bool:
        """Whether an append is settled on the thread that starts it (a plain log), not on a loop."""
        return self.loop_log is None

    def on_loop_thread(self) -> bool:
        """Whether the caller is the log's own loop thread, where a blocking call would deadlock."""
        return self.loop_log is not None and self.loop_log.on_loop_thread()

    def load(self, key: MemoryKey) -> tuple[SessionState, LoadReport]:
        """Rebuild `key` from its snapshot and the log (what activation does)."""
        return load_state(self.log, self.snapshots, key, on_poison=self.on_poison, journal=self.journal)

    def read(self, key: MemoryKey) -> list[LoggedEvent]:
        """Every stored event of `key`, still encoded."""
        return self.log.read(key)

    def start_append(
        self, key: MemoryKey, events: Sequence[Event], expected_seq: int, settle: Settle[int]
    ) -> None:
        """Begin appending `events` to `key` after `expected_seq`; `settle` gets the outcome.

        A `LoopEventLog` settles it later, on its loop; a plain log appends
        right here and settles it before the call returns. Raises only what
        stops the append from starting at all (an interrupt of the calling thread).
        A method, not a closure per session: a live session keeps no objects of its own for it
        (each tracked object is walked by every full collection of the cycle collector).
        """
        loop_log = self.loop_log
        if loop_log is not None:
            loop_log.start_append(key, events, expected_seq=expected_seq, settle=settle)
            return
        try:
            last = self.log.append(key, events, expected_seq=expected_seq)
        except Exception as exc:
            settle.set_exception(exc)
        else:
            settle.set_result(last)

    def save_snapshot(self, key: MemoryKey, state: SessionState, event_id: str) -> None:
        """Save `state` (whose last event is `event_id`) as the session's snapshot; a failure is logged.

        An erasure of the session may have run since the write it follows (its snapshot step found
        nothing to delete yet): once saved, the snapshot stays only while the log still holds its
        seq, else it holds erased turns and is deleted. An erasure that erases the events after
        this check deletes the snapshot itself (its snapshot step follows its events step).
        """
        if self.snapshots is None:
            return
        try:
            position = position_of(self.log, key, state.version, event_id)
            self.snapshots.save(snapshot_of(key, state, event_id, position=position))
            if self.log.last_seq(key) < state.version:
                _log.info(
                    "snapshot of %s at seq %s deleted: the session was erased meanwhile", key, state.version
                )
                self.snapshots.delete(key)
        except Exception:
            _log.warning("snapshot of %s at seq %s not saved", key, state.version, exc_info=True)
