"""Restoring a lost session from the snapshot that outlived its events (`restore_lost`).

When the log loses a session's events (a crash took a storage block, an
operator removed messages) and no erasure was recorded, the session's
snapshot is kept and loading it raises `SessionLost`. `restore_lost` writes
the snapshot's content back into the log as events, after whatever the log
still holds of the session:

- a `SessionStarted` with the snapshot's key and configuration, when the log
  holds no start of the session any more;
- a `SessionRestored` with the snapshot's summary and unsummarized turns, its
  ``origin`` naming the snapshot (``lost-snapshot:seq <n>``), so a replay
  shows that and when the session was restored, and from what.

The events' ids come from the snapshot, so a restore retried after a crash
stores them once. The snapshot is deleted only after the log acknowledged
them (its content is then in the log).

A snapshot is never restored over an erasure. The journal is asked first: an
erasure of the session pending, or finished after the snapshot's last event
(`erasure_after`), makes the snapshot erased data, deleted, and nothing is
written. "After" is a position where both sides record one: the snapshot's
last event's log position (`Snapshot.position`) at or below where the log
stood once the erasure's events step was done (`ErasureReceipt.log_position`),
whatever the eraser's clock said; a session begun again after the erasure is
above it, so it is restored. A receipt or a snapshot written before positions
were recorded is weighed by time, as before (the snapshot's last event's time
against the receipt's end). An erasure erases the events first and the snapshot after, so in
between the session looks lost; and an erasure recorded while the restore
runs may have listed the user's sessions before the restored events
existed. So the journal is asked again once the log acknowledged them: an
erasure pending then, or finished since the restore began, has what was
written erased under that record too. Either way `InvalidInput` says so.
"Since the restore began" is a position in the journal (`receipts_mark`,
taken before anything is read), not a time: the eraser's clock and this
one's may disagree by hours, and a receipt kept after the mark is one
whatever time it says it finished (a journal that cannot mark is asked by
time, as before).
The log is asked too, as a load asks it: an erasure's fence (or a retention
compaction) stored past the snapshot's seq says the history it covers went
on purpose, so the snapshot is deleted, not restored, even when the journal
lost the erasure's record (an eraser killed before it erased its own
fence, and the journal's file damaged).
"""

from __future__ import annotations

import msgspec

from convmem.actors._journal import (
    ErasureJournal,
    JournaledLog,
    erasure_after,
    log_position,
    receipts_mark,
)
from convmem.actors._load import LoadReport, _dropped_on_purpose_past, _stale, _usable, fold_logged
from convmem.actors._ports import EventLog, SnapshotStore
from convmem.errors import InvalidInput, StoreNotFound
from convmem.events import AnyEvent, MemoryKey, SessionRestored, SessionStarted

__all__ = ["Restored", "restore_lost"]


class Restored(msgspec.Struct, frozen=True, kw_only=True):
    """A lost session written back: from the snapshot at `snapshot_seq`, after the log's `log_seq`,
    up to the session's new last seq `seq`; `turns` restored."""

    key: MemoryKey
    snapshot_seq: int
    log_seq: int
    seq: int
    turns: int


def restore_lost(
    log: EventLog,
    snapshots: SnapshotStore | None,
    key: MemoryKey,
    *,
    now: float,
    journal: ErasureJournal | None = None,
) -> Restored:
    """Write the snapshot of the lost session `key` back into `log` as events (see the module's doc).

    `StoreNotFound` when there is no snapshot; `InvalidInput` when the
    snapshot is unusable, the session is not lost (the log continues it), or
    an erasure covers it (`journal`: the log's own when not given).
    """
    if journal is None and isinstance(log, JournaledLog):
        journal = log.erasure_journal()
    mark = receipts_mark(journal)  # before anything is read: a receipt kept after it ran meanwhile
    snapshot = snapshots.load(key) if snapshots is not None else None
    if snapshots is None or snapshot is None:
        raise StoreNotFound(f"session {key} has no snapshot to restore from", name=key.composite())
    report = LoadReport()
    saved = _usable(snapshot, key, report)
    if saved is None:
        raise InvalidInput("snapshot", f"of session {key} cannot be restored: {report.snapshot_rejected}")
    stands = log_position(log) if journal is not None and snapshot.position else None  # a new stream: from 1
    if erasure_after(journal, key, saved.last_at, position=snapshot.position, log_now=stands) is not None:
        snapshots.delete(key)  # erased data: the erasure's own snapshot step would delete it too
        raise InvalidInput(
            "key",
            f"session {key} was erased (the erasure journal records it): its snapshot is deleted, "
            "not restored",
        )
    records = log.read(key)
    if _stale(records, snapshot) is None:
        raise InvalidInput(
            "key", f"session {key} is not lost: the log holds its snapshot's seq {snapshot.seq}"
        )
    if _dropped_on_purpose_past(records, snapshot.seq):
        snapshots.delete(key)  # as a load deletes it: the log itself says its history went on purpose
        raise InvalidInput(
            "key",
            f"session {key} is not lost: the log records past its snapshot's seq {snapshot.seq} that "
            "the history it covers was dropped on purpose (an erasure's fence, or a retention "
            "compaction): its snapshot is deleted, not restored",
        )
    base = fold_logged(records, on_poison="skip", report=LoadReport())
    tag = f"lost-restore/{snapshot.seq}/{snapshot.state_hash[:24]}"
    events: list[AnyEvent] = []
    seq = base.version
    if not base.started:
        seq += 1
        events.append(SessionStarted(seq=seq, event_id=f"{tag}/start", at=now, key=key, config=saved.config))
    seq += 1
    turns = tuple(record.turn for record in saved.unsummarized())
    events.append(
        SessionRestored(
            seq=seq,
            event_id=f"{tag}/restored",
            at=now,
            summary=saved.summary,
            turns=turns,
            first_index=base.next_index if base.started else 1,
            origin=f"lost-snapshot:seq {snapshot.seq}",
        )
    )
    last = log.append(key, events, expected_seq=base.version)
    if erasure_after(journal, key, now, mark=mark) is not None:
        # An erasure ran meanwhile and may have listed the sessions before these events existed.
        log.erase(key, at=now)
        snapshots.delete(key)
        raise InvalidInput(
            "key", f"session {key} was erased while it was restored: what the restore wrote is erased too"
        )
    snapshots.delete(key)  # its content is in the log now
    return Restored(key=key, snapshot_seq=snapshot.seq, log_seq=base.version, seq=last, turns=len(turns))
