"""Rebuilding a session from its snapshot and the log's tail, reporting poison and damage.

Used by session activation and by auditors alike, so both see the same state.

Damage is not poison: poison is a record that does not belong (a foreign
message, bytes of a newer version) and is skipped; damage is a record of the
session that failed its checksum, events its intact successors say are
missing, or messages the store holds but cannot read. A load that meets
damage not followed by a `SessionRepaired` (or an erasure fence) raises
`SessionDamaged`: the session is neither read nor written until repaired.

A snapshot the log does not continue (the log holds no event, or another
one, at the snapshot's seq; or an erasure's fence stands above it) is
deleted only when the erasure journal has a record of an erasure of that
session (`erasure_after`: pending, or finished after the snapshot's last
event, by log position where the receipt and the snapshot record one, else
by time): it holds erased data; or when the log itself records past it a
retention compaction (`HistoryCompacted`, which stands for it) or an
erasure's fence (`SessionErased`: a retention sweep fences before it journals
the erasure, so a crash between the two leaves the fence as the only record,
and the erasure's whole point is that the snapshot's data goes). Without a record the log
lost the session's events: the snapshot, the last copy of its turns, is kept
and the load raises `SessionLost` (restore it with `restore_lost`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

import msgspec

from convmem.actors._journal import ErasureJournal, erasure_after, log_position
from convmem.actors._ports import EventLog, LoggedEvent, Snapshot, SnapshotStore
from convmem.errors import EventDecodeError, ReplayError, SessionDamaged, SessionLost
from convmem.events import (
    AnyEvent,
    HistoryCompacted,
    MemoryKey,
    SessionErased,
    SessionRepaired,
    decode_event,
)
from convmem.projections import (
    SessionSequence,
    SessionState,
    SkippedEvent,
    decode_state,
    evolve,
    names_another,
    replay,
    state_hash,
)

__all__ = [
    "LoadReport",
    "PoisonEvent",
    "applied",
    "damaged_error",
    "decode_logged",
    "fold_logged",
    "load_state",
]

_log = logging.getLogger("convmem.load")

OnPoison = Literal["skip", "stop"]


class PoisonEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A stored message that could not be applied: where it is and why."""

    key: MemoryKey
    position: int
    seq: int | None
    problem: str


class LoadReport(msgspec.Struct, kw_only=True):
    """How a state was rebuilt."""

    snapshot_seq: int = 0
    snapshot_rejected: str | None = None
    events_applied: int = 0
    poison: list[PoisonEvent] = msgspec.field(default_factory=list)
    damage: list[PoisonEvent] = msgspec.field(default_factory=list)
    """Damaged or missing events that no later repair (or erasure fence) covers."""
    repaired: list[PoisonEvent] = msgspec.field(default_factory=list)
    """Damage found before a `SessionRepaired` that covers it."""


def damaged_error(damage: PoisonEvent) -> SessionDamaged:
    """The error a session with `damage` is refused with."""
    return SessionDamaged(
        key=damage.key.composite(),
        seq=damage.seq,
        position=damage.position or None,
        problem=damage.problem,
    )


def decode_logged(
    records: Iterable[LoggedEvent],
    *,
    on_poison: OnPoison,
    report: LoadReport,
    sequence: SessionSequence | None = None,
) -> Iterator[AnyEvent | SkippedEvent]:
    """Decode one session's stored records in log order; poison is reported and skipped, or raised
    as `ReplayError`.

    `sequence` (from seq 0 when not given; pass one along to decode records one call at a
    time) says which records are the session's events (`SessionSequence`). A record that does
    not fit stays out of the fold; one that fits but does not decode, or whose bytes name
    another seq than its header, is skipped in its place (`SkippedEvent`).
    """
    walk = sequence if sequence is not None else SessionSequence()
    for record in records:
        if record.damage is not None:
            report.damage.append(
                PoisonEvent(key=record.key, position=record.position, seq=record.seq, problem=record.damage)
            )
            if record.position and record.seq is not None and record.seq == walk.version + 1:
                walk.version = record.seq
                yield SkippedEvent(record.seq, record.damage)
            continue
        opened = walk.version
        unfit = walk.take(record.seq, record.data, intact=record.intact)
        if unfit is not None:
            _poison(record, record.seq, f"does not fit the session: {unfit}", on_poison, report)
            continue
        seq = record.seq
        assert seq is not None  # a record without a header never fits
        if walk.gap is not None:
            first, last = walk.gap
            missing = f"seq {first}" if first == last else f"seqs {first}-{last}"
            problem = (
                f"event {missing} missing: the store lost it (the next one kept, seq {seq}, "
                f"is at log position {record.position})"
            )
            report.damage.append(  # where a lost event was stored is not known: position 0
                PoisonEvent(key=record.key, position=0, seq=first, problem=problem)
            )
            yield SkippedEvent(last, problem, opens=True)
        try:
            event = decode_event(record.data, seq=record.position)
        except EventDecodeError as exc:
            _poison(record, seq, str(exc), on_poison, report)
            yield SkippedEvent(seq, str(exc))
            continue
        if event.seq != seq:
            problem = f"header says seq {seq}, the event says {event.seq}"
            _poison(record, seq, problem, on_poison, report)
            yield SkippedEvent(seq, problem)
            continue
        if (foreign := names_another(event, record.key)) is not None:  # never another's session
            _poison(record, seq, foreign, on_poison, report)
            yield SkippedEvent(seq, foreign, opens=seq != opened + 1)
            continue
        if isinstance(event, SessionRepaired | SessionErased | HistoryCompacted) and report.damage:
            report.repaired.extend(report.damage)  # what came before is restored, erased or compacted
            report.damage.clear()
        report.events_applied += 1
        yield event


def _poison(
    record: LoggedEvent, seq: int | None, problem: str, on_poison: OnPoison, report: LoadReport
) -> None:
    """Report a poison record; raise `ReplayError` instead when `on_poison` says stop."""
    report.poison.append(PoisonEvent(key=record.key, position=record.position, seq=seq, problem=problem))
    if on_poison == "stop":
        raise ReplayError(
            f"session {record.key}: poison message at log position {record.position}: {problem}"
        )
    _log.warning("skipping poison message of %s at position %s: %s", record.key, record.position, problem)


def applied(
    records: Iterable[LoggedEvent],
    *,
    on_poison: OnPoison,
    report: LoadReport,
    state: SessionState | None = None,
) -> Iterator[tuple[AnyEvent | SkippedEvent, SessionState]]:
    """Fold one session's records event by event: each event with the state after it.

    Like `decode_logged`, and one more kind of poison: an event that fits the
    session's sequence but does not fold (a forged history: a turn before the
    session started, a reused turn number, a second start) is reported, and
    skipped at its seq, as every log's writer counts it.
    """
    current = state if state is not None else SessionState()
    walk = SessionSequence(current.version)
    for record in records:
        for event in decode_logged([record], on_poison=on_poison, report=report, sequence=walk):
            try:
                current = evolve(current, event)
            except ReplayError as exc:
                _poison(record, event.seq, f"does not fold: {exc}", on_poison, report)
                if not isinstance(event, SkippedEvent):
                    report.events_applied -= 1
                current = msgspec.structs.replace(current, version=event.seq)
                yield SkippedEvent(event.seq, str(exc)), current
                continue
            yield event, current


def fold_logged(
    records: Sequence[LoggedEvent],
    *,
    on_poison: OnPoison,
    report: LoadReport,
) -> SessionState:
    """The state after one session's records, from scratch (see `applied`).

    The records are replayed at full speed; only a history with an event that
    does not fold is walked again event by event.
    """
    try:
        return replay(decode_logged(records, on_poison=on_poison, report=report))
    except ReplayError:
        if on_poison == "stop":
            raise
    report.events_applied = 0
    report.poison.clear()
    report.damage.clear()
    report.repaired.clear()
    current = SessionState()
    for _, current in applied(records, on_poison=on_poison, report=report):  # noqa: B007
        pass
    return current


def load_state(
    log: EventLog,
    snapshots: SnapshotStore | None,
    key: MemoryKey,
    *,
    on_poison: OnPoison = "skip",
    journal: ErasureJournal | None = None,
) -> tuple[SessionState, LoadReport]:
    """The session's current state: its snapshot (when valid) plus the events after it.

    Raises `SessionLost` (keeping the snapshot) when the log lost events the
    snapshot covers and `journal` has no record of their erasure.
    """
    report = LoadReport()
    snapshot = snapshots.load(key) if snapshots is not None else None
    start = _usable(snapshot, key, report) if snapshot is not None else None
    if start is not None and snapshot is not None and snapshots is not None:
        # The snapshot stands for the log's events up to its seq only while the log holds the
        # event at that seq (the very one, when the snapshot names it). Otherwise either it
        # outlived an erasure (a stale process saved it: it holds erased data, so it goes), or the
        # log lost the session's events (it is their last copy, so it stays).
        near = log.read(key, after_seq=start.version - 1)
        # An event the store cannot read, where the snapshot's should be: damage, not an erasure.
        unreadable = next(
            (r for r in near if r.damage is not None and (not r.position or (r.seq or 0) <= snapshot.seq)),
            None,
        )
        if unreadable is not None:
            raise damaged_error(_as_damage(unreadable))
        problem = _stale(near, snapshot)
        if problem is not None and _stale(whole := log.read(key), snapshot) is None:
            # The whole log continues the snapshot: the read of its tail was placed past the
            # snapshot's event by a seq header no convmem wrote (a stranger's, on the subject).
            near, problem = whole, None
        if problem is None:  # what came after the snapshot's event (a foreign message before it too)
            covered = next(r.position for r in near if r.seq == snapshot.seq and r.damage is None)
            records = [r for r in near if r.position > covered or not r.position]
        else:
            records = whole
            if _dropped_on_purpose_past(records, snapshot.seq):
                snapshots.delete(key)  # compacted or erased past it: the log itself says so
            else:
                _drop_erased(log, snapshots, snapshot, start, problem, journal)
            report.snapshot_rejected = problem
            report.snapshot_seq = 0
            start = None
    else:
        records = log.read(key)
    try:
        walk = SessionSequence(start.version if start is not None else 0)
        state = replay(decode_logged(records, on_poison=on_poison, report=report, sequence=walk), state=start)
    except ReplayError:
        if on_poison == "stop" and start is None:
            raise
        report.events_applied = 0
        report.poison.clear()
        report.damage.clear()
        report.repaired.clear()
        if start is not None:
            # The snapshot does not continue into the log: rebuild from the log alone. The
            # snapshot is kept unless an erasure of the session was recorded.
            report.snapshot_rejected = "snapshot does not continue into the log"
            report.snapshot_seq = 0
            if snapshots is not None and snapshot is not None and _erased(journal, snapshot, start, log):
                snapshots.delete(key)  # erased data
            records = log.read(key)
        state = fold_logged(records, on_poison=on_poison, report=report)
    if (
        start is not None
        and snapshot is not None
        and snapshots is not None
        and state.version > start.version
        and not state.started
    ):
        # A tombstone after the snapshot: an erasure is under way; the snapshot holds erased data
        # (a stale writer saved it meanwhile). Removed once the erasure is recorded, else kept.
        report.snapshot_rejected = "snapshot predates an erasure"
        if _erased(journal, snapshot, start, log):
            snapshots.delete(key)
    if report.damage:
        raise damaged_error(report.damage[0])
    return state, report


def _as_damage(record: LoggedEvent) -> PoisonEvent:
    return PoisonEvent(key=record.key, position=record.position, seq=record.seq, problem=record.damage or "")


def _dropped_on_purpose_past(records: list[LoggedEvent], seq: int) -> bool:
    """Whether the log records, after `seq`, that the history before it was dropped on purpose: a
    retention compaction (`HistoryCompacted`, which stands for the events a snapshot at `seq`
    covers) or an erasure's fence (`SessionErased`: the snapshot holds erased data)."""
    for record in records:
        if record.seq is None or record.seq <= seq or record.damage is not None:
            continue
        try:
            event = decode_event(record.data)
        except EventDecodeError:
            continue
        if isinstance(event, HistoryCompacted | SessionErased):
            return True
    return False


def _erased(journal: ErasureJournal | None, snapshot: Snapshot, state: SessionState, log: EventLog) -> bool:
    """Whether `state` (`snapshot`'s) is a copy of data an erasure recorded in `journal` removed.

    A pending erasure covers whatever the session holds; a finished one only
    what was written before it finished (a session begun afresh after an
    erasure is not erased data): by position when both the receipt and the
    snapshot record one (the snapshot's last event at or below where the log
    stood after the erasure's events step), else by time (the snapshot's last
    event's time against the receipt's end: receipts and snapshots written
    before positions were recorded).
    """
    if journal is None:
        return False
    now = log_position(log) if snapshot.position else None  # a stream made again numbers from 1
    found = erasure_after(journal, snapshot.key, state.last_at, position=snapshot.position, log_now=now)
    return found is not None  # every receipt, not only the first


def _drop_erased(
    log: EventLog,
    snapshots: SnapshotStore,
    snapshot: Snapshot,
    state: SessionState,
    problem: str,
    journal: ErasureJournal | None,
) -> None:
    """Delete `snapshot` when an erasure of its session is recorded; else raise `SessionLost`, keeping it."""
    key = snapshot.key
    if _erased(journal, snapshot, state, log):
        _log.warning("deleting the snapshot of erased session %s: %s", key, problem)
        snapshots.delete(key)
        return
    raise SessionLost(
        key=key.composite(), snapshot_seq=snapshot.seq, log_seq=log.last_seq(key), problem=problem
    )


def _usable(snapshot: Snapshot, key: MemoryKey, report: LoadReport) -> SessionState | None:
    """The state `snapshot` holds, when it is `key`'s and intact; else None, and why in `report`."""
    try:
        candidate = decode_state(snapshot.data)
        if snapshot.key != key or candidate.key not in (None, key):
            report.snapshot_rejected = "snapshot belongs to another key"
        elif candidate.version != snapshot.seq:
            report.snapshot_rejected = f"snapshot state is at seq {candidate.version}, not {snapshot.seq}"
        elif state_hash(candidate) != snapshot.state_hash:
            report.snapshot_rejected = "snapshot hash does not match its state"
        else:
            report.snapshot_seq = snapshot.seq
            return candidate
    except EventDecodeError as exc:
        report.snapshot_rejected = str(exc)
    _log.warning("ignoring snapshot of %s: %s", key, report.snapshot_rejected)
    return None


def _stale(records: list[LoggedEvent], snapshot: Snapshot) -> str | None:
    """Why `snapshot` does not belong to the history in `records` (read from its seq on), or None."""
    at = next((r for r in records if r.seq == snapshot.seq and r.damage is None), None)
    if at is None:
        return f"the log holds no event at the snapshot's seq {snapshot.seq}"
    if snapshot.event_id and at.event_id is not None and at.event_id != snapshot.event_id:
        return f"the log's event at seq {snapshot.seq} is not the one the snapshot covers"
    return None
