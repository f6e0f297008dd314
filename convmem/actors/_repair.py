"""Repairing a damaged session: restore its newest good state, recorded as a `SessionRepaired`.

`plan_repair` reads the session (its events and its snapshot) and finds what
`verify` finds: events that failed their checksum, events missing between
intact ones or up to the snapshot's seq, messages the store holds but cannot
read back. It then picks the newest state it can trust:

* **snapshot**: the session's snapshot, when it passes its checks (its hash,
  its key, its seq), with the intact events after it folded on top, up to
  the first damage after it;
* **cut**: the replay of the events up to the last good one (the one before
  the first damage).

`repair_session` appends the chosen state as a `SessionRepaired` above
everything the log holds, so a replay from the log alone is exact: the fold
takes the repair's state whole, whatever damaged records lie before it, and
`verify` reports those as repaired, not as failures. The old snapshot is
replaced by one of the repaired state. Nothing stored is deleted: the damaged
records stay in the log for forensics.

A snapshot is never restored over an erasure: a session whose log holds an
erasure fence, or whose erasure the log's journal records (pending or done),
is cut, not restored.
"""

from __future__ import annotations

import logging
from typing import Literal

import msgspec

from convmem.actors._audit import _erased, verify
from convmem.actors._ids import new_command_id
from convmem.actors._journal import JournaledLog, find_erasure
from convmem.actors._load import LoadReport, PoisonEvent, applied
from convmem.actors._ports import EventLog, LoggedEvent, SnapshotStore, position_of, snapshot_of
from convmem.errors import ConvmemError, EventDecodeError, InvalidInput
from convmem.events import MemoryKey, SessionRepaired
from convmem.projections import SessionState, decode_state, encode_state, evolve, state_hash

__all__ = ["RepairPlan", "plan_repair", "repair_session"]

Method = Literal["auto", "snapshot", "cut"]

_log = logging.getLogger("convmem.repair")


class RepairPlan(msgspec.Struct, kw_only=True):
    """What a repair finds and does (or did, once `applied`)."""

    key: MemoryKey
    damage: list[PoisonEvent] = msgspec.field(default_factory=list)
    """What `verify` reports for the session (empty: nothing to repair)."""
    method: str = ""
    """``snapshot`` or ``cut``: where the restored state comes from."""
    restored_seq: int = 0
    """The seq the restored state stood at (its last good event, or the snapshot's seq plus the events
    after it)."""
    lost_after: int = 0
    """The session's seq before the repair (the fold's count, gaps included): the repair goes above it."""
    turns: int = 0
    """Live turns of the restored state."""
    unreadable: int = 0
    """Stored messages of the session the store cannot read back (the repair records how many)."""
    seq: int = 0
    """The repair event's seq (once applied)."""
    applied: bool = False
    snapshot_problem: str = ""
    """Why the repaired state's snapshot was not saved (empty: it was); the repair stands without it."""

    @property
    def needed(self) -> bool:
        return bool(self.damage)


def plan_repair(
    log: EventLog, snapshots: SnapshotStore | None, key: MemoryKey, *, method: Method = "auto"
) -> tuple[RepairPlan, SessionState | None]:
    """What `repair_session` would do, and the state it would restore (None: nothing to repair)."""
    if method not in ("auto", "snapshot", "cut"):
        raise InvalidInput("method", f"is {method!r}, must be 'auto', 'snapshot' or 'cut'")
    checks = verify(log, snapshots, key=key)
    plan = RepairPlan(key=key, damage=[d for c in checks for d in c.damage])
    if not plan.damage:
        return plan, None
    records = log.read(key)
    counts = getattr(log, "counts", None)
    if counts is not None:  # every message the store cannot serve, those an earlier repair counted too
        held = counts(tenant_id=key.tenant_id, user_id=key.user_id).get(key, 0)
        plan.unreadable = max(held - sum(1 for r in records if r.position), 0)
    cut, version = _last_good(records)
    plan.lost_after = version
    restored: SessionState | None = None
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    erased = find_erasure(journal, key) is not None  # an erasure recorded: no snapshot comes back
    from_snapshot = None if method == "cut" or erased else _from_snapshot(snapshots, key, records)
    if method == "snapshot" and from_snapshot is None:
        raise InvalidInput(
            "method", f"session {key} has no snapshot that passes its checks (or it was erased): use cut"
        )
    if from_snapshot is not None and (method == "snapshot" or from_snapshot.version > cut.version):
        plan.method, restored = "snapshot", from_snapshot
    else:
        plan.method, restored = "cut", cut
    plan.restored_seq = restored.version
    plan.turns = len(restored.turns)
    return plan, restored


def repair_session(
    log: EventLog,
    snapshots: SnapshotStore | None,
    key: MemoryKey,
    *,
    at: float,
    method: Method = "auto",
    reason: str = "repaired by an operator",
) -> RepairPlan:
    """Repair a damaged session (see the module's docstring); a sound one is left as it is.

    `at` is the repair's time (epoch seconds). Returns the plan, `applied` when a repair was stored.
    Run it while no process writes the session (a damaged session refuses writes anyway).
    """
    plan, restored = plan_repair(log, snapshots, key, method=method)
    if restored is None:
        return plan
    version = plan.lost_after
    event = SessionRepaired(
        seq=version + 1,
        event_id=f"repaired/{new_command_id()}",
        at=at,
        state=encode_state(msgspec.structs.replace(restored, key=key)),
        method=plan.method,
        restored_seq=plan.restored_seq,
        damage=tuple(f"seq {d.seq}: {d.problem}" if d.seq is not None else d.problem for d in plan.damage),
        unreadable=plan.unreadable,
        reason=reason,
    )
    log.append(key, [event], expected_seq=version)
    plan.seq = event.seq
    plan.applied = True
    if snapshots is not None:
        state = evolve(SessionState(key=key), event)  # what the fold makes of the repair
        try:
            snapshots.delete(key)  # it may stand above the repair (a log that lost its tail)
            position = position_of(log, key, event.seq, event.event_id)
            snapshots.save(snapshot_of(key, state, event.event_id, position=position))  # version: event.seq
        except ConvmemError as exc:  # the repair is stored: without a snapshot, loads replay the log
            _log.warning("repair of %s: its new snapshot was not saved: %s", key, exc)
            plan.snapshot_problem = str(exc)
    return plan


def _last_good(records: list[LoggedEvent]) -> tuple[SessionState, int]:
    """The state after the last event before the first damage, and the session's seq as the fold
    counts it (every record, gaps included)."""
    report = LoadReport()
    good = current = SessionState()
    for _, current in applied(records, on_poison="skip", report=report):
        if not report.damage:
            good = current
    return good, current.version


def _from_snapshot(
    snapshots: SnapshotStore | None, key: MemoryKey, records: list[LoggedEvent]
) -> SessionState | None:
    """The snapshot's state with the intact events after it, when the snapshot passes its checks."""
    snapshot = snapshots.load(key) if snapshots is not None else None
    if snapshot is None or snapshot.key != key or _erased(records):
        return None
    try:
        state = decode_state(snapshot.data)
    except EventDecodeError:
        return None
    if (
        state.key not in (None, key)
        or state.version != snapshot.seq
        or state_hash(state) != snapshot.state_hash
    ):
        return None
    after = [r for r in records if (r.seq is not None and r.seq > snapshot.seq) or not r.position]
    report = LoadReport()
    good = state
    for _, current in applied(after, on_poison="skip", report=report, state=state):
        if report.damage:
            break
        good = current
    return good
