"""Auditing: rebuild any session from the log, as of any point, and check it.

These functions read through the `EventLog` port only, so they work the same
on the in-memory log, on JetStream, and on an exported JSONL file.

* `replay_session`: a session's state as of its latest event, a log
  position, or a time;
* `verify`: rebuild sessions from their events alone and compare them with
  their snapshots (and, when given, with live states); report poison, and
  damage: each event that failed its checksum, is missing (a gap between
  intact events, a snapshot beyond the log's last event, a session with a
  snapshot and no event) or is held by the store but cannot be read back,
  and each session whose data key cannot be used (every other session is
  still checked);
* `timeline`: a session's events as rows for people (each described by
  `describe_event`, pure, in `convmem.projections`);
* `export_jsonl` / `read_jsonl`: one event per line, for offline audits.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import msgspec

from convmem.actors._journal import ErasureJournal, ErasureJournalDamaged, JournaledLog, find_erasure
from convmem.actors._load import LoadReport, PoisonEvent, applied, fold_logged, load_state
from convmem.actors._ports import EventLog, LoggedEvent, Snapshot, SnapshotStore
from convmem.errors import (
    ConvmemError,
    EncryptionKeyError,
    EventDecodeError,
    InvalidInput,
    ReplayError,
    SessionDamaged,
    SessionLost,
)
from convmem.events import (
    HistoryCompacted,
    MemoryKey,
    SessionRepaired,
    SummaryProduced,
    TurnAdded,
    decode_event,
    decode_event_json,
    encode_event,
    encode_event_json,
)
from convmem.projections import (
    SessionSequence,
    SessionState,
    SkippedEvent,
    decode_state,
    describe_event,
    names_another,
    state_hash,
)

__all__ = [
    "SessionCheck",
    "SessionPage",
    "SessionRow",
    "TimelineRow",
    "export_jsonl",
    "list_session_page",
    "list_sessions",
    "read_jsonl",
    "read_scope",
    "replay_session",
    "timeline",
    "verify",
]


def _in_scope(record: LoggedEvent, key: MemoryKey) -> bool:
    return record.key == key


def replay_session(
    records: Iterable[LoggedEvent],
    key: MemoryKey,
    *,
    until_position: int | None = None,
    until_time: float | None = None,
    on_poison: Literal["skip", "stop"] = "skip",
) -> tuple[SessionState, LoadReport]:
    """Fold `key`'s events, stopping after a log position or a time when given."""
    report = LoadReport()
    chosen = [
        r for r in records if _in_scope(r, key) and (until_position is None or r.position <= until_position)
    ]
    if until_time is None:
        return fold_logged(chosen, on_poison=on_poison, report=report), report
    state = SessionState()
    for event, after in applied(chosen, on_poison=on_poison, report=report):
        if not isinstance(event, SkippedEvent) and event.at > until_time:
            break
        state = after
    return state, report


class SessionCheck(msgspec.Struct, kw_only=True):
    """The verdict on one session."""

    key: MemoryKey
    events: int = 0
    """The session's events (records that do not fit its sequence are `poison`, not events)."""
    turns: int = 0
    summaries: int = 0
    last_seq: int = 0
    snapshot_seq: int | None = None
    problems: list[str] = msgspec.field(default_factory=list)
    poison: list[PoisonEvent] = msgspec.field(default_factory=list)
    damage: list[PoisonEvent] = msgspec.field(default_factory=list)
    """Damaged or missing events (and a damaged snapshot, seq None), each with where and what failed;
    the session needs `repair_session`."""
    repaired: int = 0
    """Damage found before a `SessionRepaired` that covers it (not a failure)."""
    missing: int = 0
    """Events missing between intact ones (each gap is one entry of `damage`)."""

    @property
    def ok(self) -> bool:
        """No problem, no poison and no damage."""
        return not self.problems and not self.poison and not self.damage

    @property
    def lost(self) -> list[PoisonEvent]:
        """The `damage` that stands for events (damaged or missing), not for a damaged snapshot."""
        return [d for d in self.damage if not d.problem.startswith(_SNAPSHOT_DAMAGE)]


_SNAPSHOT_DAMAGE = "snapshot: "
_KEY_DAMAGE = "data key: "


def _key_problem(log: EventLog, exc: EncryptionKeyError) -> str:
    """What `exc`, met reading one session, says of that session: its user's data key cannot be
    used (its file or entry is damaged, missing or unreadable, or does not unwrap), so none of its
    sealed bytes can be read.

    Raises `exc` again when it is not about a data key of the session: the log was opened without
    the master key its events were sealed with (no keyring), or the key store could not be reached
    (a failure behind it): every session would fail the same way, and that is not damage.
    """
    if getattr(log, "keyring", None) is None or exc.__cause__ is not None:
        raise exc
    return (
        f"{_KEY_DAMAGE}{exc}: none of the session's sealed events or snapshot can be read until the "
        "key store holds that key again (restore it from a backup of the key store; `convmem repair` "
        "cannot bring a key back)"
    )


def _read_each(
    log: EventLog, keys: Iterable[MemoryKey], problems: dict[MemoryKey, str]
) -> Iterator[LoggedEvent]:
    """The records of each session of `keys`, read one session at a time; a session whose data key
    cannot be used is noted in `problems` (`_key_problem`) and the others are still read."""
    for key in keys:
        try:
            records = log.read(key)
        except EncryptionKeyError as exc:
            problems[key] = _key_problem(log, exc)
            continue
        yield from records


def read_scope(
    log: EventLog,
    problems: dict[MemoryKey, str],
    *,
    key: MemoryKey | None = None,
    tenant_id: str | None = None,
    user_id: str | None = None,
) -> Iterator[LoggedEvent]:
    """The records of a scope, as `verify` and an export read them: the scope in one read, and
    when a session's data key cannot be used (`_key_problem`), the read goes on one session at a
    time past what was already given; each session whose key cannot be used is noted in
    `problems`, and every other session is read whole."""
    if key is not None:
        yield from _read_each(log, [key], problems)
        return
    given, seen = 0, set()
    try:
        for record in log.read_all(tenant_id=tenant_id, user_id=user_id):
            given = max(given, record.position)
            seen.add(record.key)
            yield record
    except EncryptionKeyError as exc:  # one user's data key: the read of the scope stops there
        _key_problem(log, exc)  # (raised again when it is no data key's)
        for record in _read_each(log, log.keys(tenant_id=tenant_id, user_id=user_id), problems):
            if record.position > given or (not record.position and record.key not in seen):
                yield record


def _group(
    records: Iterable[LoggedEvent],
    by_key: dict[MemoryKey, list[LoggedEvent]],
    progress: Callable[[int], None] | None,
) -> None:
    for n, record in enumerate(records, start=1):
        if record.position or record.damage is None:  # the store's count says what it cannot read
            by_key[record.key].append(record)
        if progress is not None and n % 1000 == 0:
            progress(n)


def verify(
    log: EventLog,
    snapshots: SnapshotStore | None = None,
    *,
    tenant_id: str | None = None,
    user_id: str | None = None,
    key: MemoryKey | None = None,
    live: Mapping[MemoryKey, SessionState] | None = None,
    progress: Callable[[int], None] | None = None,
    records: Iterable[LoggedEvent] | None = None,
    key_problems: Mapping[MemoryKey, str] | None = None,
) -> list[SessionCheck]:
    """Rebuild each session in scope from its events alone and check it.

    A session fails when an event does not decode or does not fold (a gap, a
    bad order), when its snapshot does not equal the replay of the events it
    claims to cover, or when a given live state differs from the replay. It
    is damaged (`SessionCheck.damage`) when an event failed its checksum, when
    events are missing (between intact events, or up to its snapshot's seq),
    when the store counts more of its messages than it can read back (a log
    with ``counts``), or when its snapshot is damaged (a store with
    ``check``). Sessions that have a snapshot and no event are checked too
    (a store with ``keys``).

    `records`: what a read of the same scope from `log` already gave (an export's, through
    `read_scope`), checked instead of reading the log again; `key_problems`: the sessions that
    read noted as unreadable for their data key.
    """
    problems: dict[MemoryKey, str] = dict(key_problems or {})  # sessions whose data key cannot be used
    by_key: dict[MemoryKey, list[LoggedEvent]] = defaultdict(list)
    if records is None:
        records = read_scope(log, problems, key=key, tenant_id=tenant_id, user_id=user_id)
    _group(records, by_key, progress)
    for damaged in problems:
        by_key.setdefault(damaged, [])
    counts = _counts(log, tenant_id, user_id, key)
    for held in counts or {}:  # a session none of whose messages the store could read back
        if counts and counts[held]:
            by_key.setdefault(held, [])
    listed = _snapshot_keys(snapshots, tenant_id, user_id, key)
    for stored in listed or ():
        by_key.setdefault(stored, [])
    stored_keys = set(listed) if listed is not None and key is None else None
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    checks = []
    for session_key in sorted(by_key, key=lambda k: k.composite()):
        problem = problems.get(session_key)
        if problem is not None:  # nothing of it can be read: the key is what is damaged
            damage = PoisonEvent(key=session_key, position=0, seq=None, problem=problem)
            checks.append(SessionCheck(key=session_key, damage=[damage]))
            continue
        check = _check(session_key, by_key[session_key], snapshots, live, stored_keys, journal, log)
        _count_unreadable(check, by_key[session_key], counts)
        checks.append(check)
    return checks


def _counts(
    log: EventLog, tenant_id: str | None, user_id: str | None, key: MemoryKey | None
) -> dict[MemoryKey, int] | None:
    """How many messages the store holds per session, when the log can say (JetStream, in memory)."""
    counts = getattr(log, "counts", None)
    if counts is None:
        return None
    if key is not None:
        found: dict[MemoryKey, int] = counts(tenant_id=key.tenant_id, user_id=key.user_id)
        return {key: found.get(key, 0)}
    held: dict[MemoryKey, int] = counts(tenant_id=tenant_id, user_id=user_id)
    return held


def _snapshot_keys(
    snapshots: SnapshotStore | None, tenant_id: str | None, user_id: str | None, key: MemoryKey | None
) -> list[MemoryKey] | None:
    """The sessions in scope that have a snapshot (held, if not readable), or None when the store
    cannot list them."""
    keys = getattr(snapshots, "keys", None) if snapshots is not None else None
    if key is not None:
        try:
            if snapshots is None or snapshots.load(key) is not None:
                return [key] if snapshots is not None else []
        except EncryptionKeyError:  # held, and sealed with a key that cannot be used: the check says
            return [key]
        # Held but damaged is a snapshot too (`--all` lists it by the store's keys): its check says.
        check = getattr(snapshots, "check", None)
        return [key] if check is not None and check(key) is not None else []
    if keys is None:
        return None
    listed: list[MemoryKey] = keys()
    return [
        k
        for k in listed
        if (tenant_id is None or k.tenant_id == tenant_id) and (user_id is None or k.user_id == user_id)
    ]


def _count_unreadable(
    check: SessionCheck, records: list[LoggedEvent], counts: dict[MemoryKey, int] | None
) -> None:
    """Damage: the store holds more of the session's messages than it gave back (less those a repair
    already counted)."""
    if counts is None:
        return
    read = sum(1 for r in records if r.position)
    known = 0
    for record in records:
        if record.event_id is not None and record.event_id.startswith("repaired/"):
            try:
                event = decode_event(record.data)
            except EventDecodeError:
                continue
            if isinstance(event, SessionRepaired):
                known = event.unreadable
    missing = counts.get(check.key, 0) - read - known - check.missing
    if missing > 0:
        last = next((r for r in reversed(records) if r.seq is not None), None)
        after = f"after seq {last.seq} (log position {last.position})" if last is not None else "at all"
        first = (last.seq or 0) + 1 if last is not None else 1
        # The same loss seen from the snapshot (its seq beyond the log's last event): said once.
        check.damage = [d for d in check.damage if d.position or d.seq != first]
        check.damage.append(
            PoisonEvent(
                key=check.key,
                position=0,
                seq=first,
                problem=(
                    f"the store holds {missing} more message(s) of this session than it can read back "
                    f"(damaged on disk; the readable ones end {after})"
                ),
            )
        )


def _check(
    key: MemoryKey,
    records: list[LoggedEvent],
    snapshots: SnapshotStore | None,
    live: Mapping[MemoryKey, SessionState] | None,
    held: set[MemoryKey] | None = None,
    journal: ErasureJournal | None = None,
    log: EventLog | None = None,
) -> SessionCheck:
    check = SessionCheck(key=key)
    report = LoadReport()
    states: dict[int, SessionState] = {}
    snapshot, snapshot_damage = _snapshot_of(key, snapshots, held, log)
    want = snapshot.seq if snapshot is not None else None
    state = SessionState()
    try:
        for event, after in applied(records, on_poison="skip", report=report):
            before, state = state, after
            if isinstance(event, SkippedEvent) and event.opens:
                check.missing += event.seq - before.version
                continue  # events the store lost: damage, not events
            check.events += 1
            if want is not None and state.version == want:
                states[want] = state
            if isinstance(event, TurnAdded):
                check.turns += 1
            elif isinstance(event, SummaryProduced):
                check.summaries += 1
    except ReplayError as exc:
        check.problems.append(f"does not fold: {exc}")
    check.poison = list(report.poison)
    check.damage = list(report.damage)
    check.repaired = len(report.repaired)
    check.last_seq = state.version
    if snapshot_damage is not None:
        check.damage.append(snapshot_damage)
    if snapshot is not None:
        check.snapshot_seq = snapshot.seq
        rebuilt = states.get(snapshot.seq)
        try:
            stored = decode_state(snapshot.data)
        except EventDecodeError as exc:
            check.problems.append(f"snapshot at seq {snapshot.seq} does not decode: {exc}")
        else:
            # Events up to the snapshot's seq that the log lost, and no erasure (its fence, or its
            # record in the journal: an erasure under way) took them: damage.
            if snapshot.seq > state.version and not _erased(records) and find_erasure(journal, key) is None:
                first = state.version + 1
                lost = f"seq {first}" if first == snapshot.seq else f"seqs {first}-{snapshot.seq}"
                where = f"the log ends at seq {state.version}" if state.version else "the log holds no event"
                check.damage.append(
                    PoisonEvent(
                        key=key,
                        position=0,
                        seq=first,
                        problem=(
                            f"event {lost} missing: the snapshot at seq {snapshot.seq} covers them, but "
                            f"{where} (lost by the store; `convmem repair` restores the snapshot)"
                        ),
                    )
                )
            elif rebuilt is None:
                if (
                    state.version >= snapshot.seq
                    and not _erased(records)
                    and not _compacted(records, snapshot.seq)
                    and not check.damage
                ):
                    check.problems.append(f"snapshot at seq {snapshot.seq} matches no point of the log")
            elif state_hash(rebuilt) != snapshot.state_hash or stored != rebuilt:
                check.problems.append(
                    f"snapshot at seq {snapshot.seq} differs from the replay of the events it covers"
                )
    if live is not None and key in live and live[key] != state:
        check.problems.append(
            f"live state (seq {live[key].version}) differs from the replay (seq {state.version})"
        )
    return check


def _snapshot_of(
    key: MemoryKey, snapshots: SnapshotStore | None, held: set[MemoryKey] | None, log: EventLog | None
) -> tuple[Snapshot | None, PoisonEvent | None]:
    """The session's snapshot; or None, and its damage when one is held that cannot be read back or
    is sealed with a data key that cannot be used (`_key_problem`)."""
    if snapshots is None:
        return None, None
    try:
        snapshot = snapshots.load(key)
    except EncryptionKeyError as exc:
        if log is None:
            raise
        problem = _key_problem(log, exc)
    else:
        stored_problem = getattr(snapshots, "check", None)
        # A snapshot that loads passed its checks; one that does not is asked why, when one is held.
        if snapshot is not None or stored_problem is None or (held is not None and key not in held):
            return snapshot, None
        found: str | None = stored_problem(key)
        if found is None:
            return None, None
        problem = found
    return None, PoisonEvent(key=key, position=0, seq=None, problem=f"{_SNAPSHOT_DAMAGE}{problem}")


def _erased(records: list[LoggedEvent]) -> bool:
    return any(r.event_id is not None and r.event_id.startswith("erased/") for r in records)


def _compacted(records: list[LoggedEvent], seq: int) -> bool:
    """Whether the log begins with a compaction past `seq` (a snapshot older than it is only stale)."""
    first = next((r for r in records if r.seq is not None), None)
    if first is None or first.seq is None or first.seq <= seq:
        return False
    try:
        return isinstance(decode_event(first.data), HistoryCompacted)
    except EventDecodeError:
        return False


class SessionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One session as `list_sessions` shows it."""

    key: MemoryKey
    events: int
    last_seq: int
    last_at: float | None
    health: str
    turns: int
    """Turns the session's log numbered: its latest turn's number (cleared and retired ones count)."""
    live_turns: int = 0
    """Turns in its live state (since the last clear, at most ``live_turns`` of the configuration)."""
    problem: str | None = None
    """Why the session is ``unreadable``, ``lost`` or ``damaged`` (None otherwise): what failed, and
    where (the seq, the snapshot, the data key's file)."""

    def as_json(self) -> dict[str, Any]:
        """The row as the CLI's and the service's JSON show it, from ``user_id`` on (no tenant): with
        its ``problem`` (null for a healthy session), so a service's caller learns why, as the CLI's."""
        return {
            "user_id": self.key.user_id,
            "session_id": self.key.session_id,
            "events": self.events,
            "last_seq": self.last_seq,
            "last_at": self.last_at,
            "health": self.health,
            "turns": self.turns,
            "live_turns": self.live_turns,
            "problem": self.problem,
        }


class _ReadOnlySnapshots:
    """A snapshot store as a reader uses it: loads pass through; nothing is saved or deleted."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store

    def load(self, key: MemoryKey) -> Snapshot | None:
        return self._store.load(key)

    def save(self, snapshot: Snapshot) -> None:
        """A reader saves nothing."""

    def delete(self, key: MemoryKey) -> None:
        """A reader deletes nothing (a stale snapshot is only skipped)."""

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        return self._store.keys(tenant_id=tenant_id, user_id=user_id)

    def close(self) -> None:
        """The store is its owner's to close."""


def list_sessions(
    log: EventLog,
    snapshots: SnapshotStore | None = None,
    *,
    tenant_id: str | None = None,
    user_id: str | None = None,
    limit: int | None = None,
    after: MemoryKey | None = None,
) -> list[SessionRow]:
    """The sessions with events or a snapshot (of a tenant, of a user), in key order, with their true
    turn counts.

    Each state is its snapshot (when valid) plus the events after it, as a session
    is activated: a long session is not replayed whole. Nothing is written (a
    stale snapshot is skipped, not deleted). The event counts come from a log that
    counts without reading (JetStream's per-subject counts), else from the reads.
    A session whose events do not fold shows health ``unreadable``; one whose
    snapshot the log no longer continues (`SessionLost`: a session known only by its
    snapshot too) shows ``lost``; one with damage (`SessionDamaged`), a damaged snapshot
    (its events intact or not: as `verify` names it; the store is asked only of a snapshot it
    holds and did not give back), or whose data key cannot be used shows ``damaged``. Each of
    those says why in `SessionRow.problem`, and the other sessions are still listed.

    With `after`, only the sessions past that key in key order (`list_session_page` says where the
    next page starts).
    """
    if limit is not None and limit < 1:
        return []
    return list_session_page(
        log, snapshots, tenant_id=tenant_id, user_id=user_id, limit=limit, after=after
    ).rows


class SessionPage(msgspec.Struct, frozen=True):
    """A page of `list_session_page`: its rows, and the key the next page starts after (None: no
    session is left past this page)."""

    rows: list[SessionRow]
    next_after: MemoryKey | None


def list_session_page(
    log: EventLog,
    snapshots: SnapshotStore | None = None,
    *,
    tenant_id: str | None = None,
    user_id: str | None = None,
    limit: int | None = None,
    after: MemoryKey | None = None,
) -> SessionPage:
    """`list_sessions`'s rows past `after` in key order, at most `limit` sessions read and folded; with
    the last key looked at when keys remain past it (the next page's `after`), else None.

    A key looked at may give no row (a snapshot that holds nothing), so a page can hold fewer
    rows than `limit` while keys remain; the keys themselves are listed from the stores' key
    listings (no message is read for them), the folds stop at `limit` (`InvalidInput` below 1).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput("limit", f"must be None or an integer >= 1, got {limit!r}")
    counter = getattr(log, "counts", None)
    counts: dict[MemoryKey, int] | None = (
        counter(tenant_id=tenant_id, user_id=user_id) if counter is not None else None
    )
    logged = set(counts) if counts is not None else set(log.keys(tenant_id=tenant_id, user_id=user_id))
    held = set(snapshots.keys(tenant_id=tenant_id, user_id=user_id)) if snapshots is not None else set()
    reader = _ReadOnlySnapshots(snapshots) if snapshots is not None else None
    check = getattr(snapshots, "check", None)
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    rows: list[SessionRow] = []
    past = after.composite() if after is not None else None
    ordered = sorted(
        (k for k in logged | held if past is None or k.composite() > past), key=MemoryKey.composite
    )
    for looked, key in enumerate(ordered):
        if limit is not None and looked >= limit:
            return SessionPage(rows, ordered[looked - 1])
        events = counts.get(key, 0) if counts is not None else None
        row = _session_row(
            log, reader, check, key, journal, events=events, logged=key in logged, snapshot_held=key in held
        )
        if row is not None:
            rows.append(row)
    return SessionPage(rows, None)


def _session_row(
    log: EventLog,
    snapshots: SnapshotStore | None,
    check: Callable[[MemoryKey], str | None] | None,
    key: MemoryKey,
    journal: ErasureJournal | None,
    *,
    events: int | None,
    logged: bool,
    snapshot_held: bool = False,
) -> SessionRow | None:
    """One row of `list_sessions` (`events`: its count, None to count them with a read); None for a
    session known only by a snapshot that holds nothing and is not damaged (`check`: the store's
    question of why a snapshot does not load), as one an erasure left or sealed with a shredded key.

    A session whose events load but whose snapshot the store holds (`snapshot_held`) and could not
    give back is asked `check` too: a damaged snapshot is ``damaged``, as `verify` names it, with the
    state its events give (only a snapshot that was not used is checked: a listing reads no more)."""
    problem, health, last_seq = None, "", 0
    try:
        state, report = load_state(log, snapshots, key, on_poison="skip", journal=journal)
    except ReplayError as exc:
        health, problem = "unreadable", f"its events do not fold: {exc}"
    except SessionLost as exc:  # the log lost events its snapshot covers: `convmem restore` brings them back
        health, problem, last_seq = "lost", str(exc), exc.log_seq
    except SessionDamaged as exc:
        health, problem = "damaged", str(exc)
    except EncryptionKeyError as exc:
        health, problem = "damaged", _key_problem(log, exc)
    except ErasureJournalDamaged as exc:  # was the snapshot's session erased? the journal cannot say
        health = "lost"
        problem = (
            f"the log holds no event its snapshot covers, and no readable erasure record says why: {exc}"
        )
    else:
        if not logged and not state.started and state.version == 0:
            damaged = check(key) if check is not None else None
            if damaged is None:
                return None
            health, problem = "damaged", f"{_SNAPSHOT_DAMAGE}{damaged} (and the log holds no event of it)"
        else:
            if snapshot_held and not report.snapshot_seq and check is not None:
                damaged = check(key)  # held and not used: a damaged one is damage, as verify says
                problem = f"{_SNAPSHOT_DAMAGE}{damaged}" if damaged is not None else None
            return SessionRow(
                key=key,
                events=events if events is not None else len(log.read(key)),
                last_seq=state.version,
                last_at=state.last_at or None,
                health="damaged" if problem is not None else state.health.value,
                turns=state.next_index - 1,
                live_turns=len(state.turns),
                problem=problem,
            )
    if health in ("unreadable", "damaged") and logged:
        try:
            last_seq = log.last_seq(key)
        except ConvmemError:  # what makes it damaged stops this read too
            last_seq = 0
    return SessionRow(
        key=key,
        events=events or 0,
        last_seq=last_seq,
        last_at=None,
        health=health,
        turns=0,
        live_turns=0,
        problem=problem,
    )


class TimelineRow(msgspec.Struct, frozen=True, kw_only=True):
    """One event of a session, described for people."""

    position: int
    seq: int | None
    at: float | None
    type: str
    detail: str


def timeline(
    records: Iterable[LoggedEvent],
    *,
    full: bool = False,
    walks: dict[MemoryKey, SessionSequence] | None = None,
) -> list[TimelineRow]:
    """Each record as a row; a poison record shows what is wrong with it.

    A record that does not fit its session's sequence (`SessionSequence`) is
    poison too; pass the same `walks` to calls that go on from each other (a
    follower). Details are cut at about 60 characters, or kept whole with `full`.
    """
    rows = []
    walks = {} if walks is None else walks
    for record in records:
        walk = walks.get(record.key)
        if walk is None:
            walk = walks[record.key] = SessionSequence()
        if record.damage is not None:
            if record.position and record.seq is not None and record.seq == walk.version + 1:
                walk.version = record.seq
            rows.append(
                TimelineRow(
                    position=record.position, seq=record.seq, at=None, type="DAMAGED", detail=record.damage
                )
            )
            continue
        unfit = walk.take(record.seq, record.data, intact=record.intact)
        if unfit is not None:
            detail = f"does not fit the session: {unfit}"
            rows.append(
                TimelineRow(position=record.position, seq=record.seq, at=None, type="POISON", detail=detail)
            )
            continue
        try:
            event = decode_event(record.data, seq=record.position)
        except EventDecodeError as exc:
            rows.append(
                TimelineRow(position=record.position, seq=record.seq, at=None, type="POISON", detail=str(exc))
            )
            continue
        if (foreign := names_another(event, record.key)) is not None:
            rows.append(
                TimelineRow(position=record.position, seq=record.seq, at=None, type="POISON", detail=foreign)
            )
            continue
        kind, detail = describe_event(event, full=full)
        rows.append(
            TimelineRow(position=record.position, seq=event.seq, at=event.at, type=kind, detail=detail)
        )
    return rows


_MAX_POSITION = 2**64 - 1  # a JetStream stream sequence
_MAX_SEQ = 2**63 - 1  # the largest session seq the event codec stores


def export_jsonl(records: Iterable[LoggedEvent]) -> Iterator[str]:
    """One JSON line per record: key, position, seq and the event (or the raw bytes of poison).

    A record that failed its checksum is written as its raw bytes, its ``error`` saying so; one
    that only stands for messages the store cannot read back (position 0) has no bytes and no
    line (`verify` names both). A seq no convmem writer could have stored (a foreign message's
    header: below 1, or past the codec's range) is written as null, so `read_jsonl` reads every
    line back.
    """
    for record in records:
        if record.damage is not None and not record.position:
            continue
        line: dict[str, Any] = {
            "key": msgspec.to_builtins(record.key),
            "position": record.position,
            "seq": record.seq if record.seq is not None and 1 <= record.seq <= _MAX_SEQ else None,
        }
        problem = f"damaged: {record.damage}" if record.damage is not None else None
        if problem is None:
            try:
                line["event"] = json.loads(encode_event_json(decode_event(record.data, seq=record.position)))
            except EventDecodeError as exc:
                problem = str(exc)
        if problem is not None:
            line["raw"] = base64.b64encode(record.data).decode("ascii")
            line["error"] = problem
        line["sum"] = _line_sum(line)
        yield json.dumps(line, ensure_ascii=False, sort_keys=True)


_LINE_FIELDS = frozenset({"key", "position", "seq", "event", "raw", "error", "sum"})


def _line_sum(row: Mapping[str, Any]) -> str:
    """The digest an export line carries as ``sum``: of its other fields, as `export_jsonl` writes them
    (sorted keys), so it does not depend on how the line was escaped (stdout escapes controls)."""
    text = json.dumps({k: v for k, v in row.items() if k != "sum"}, ensure_ascii=False, sort_keys=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def read_jsonl(lines: Iterable[str | bytes], *, source: str = "<jsonl>") -> Iterator[LoggedEvent]:
    """Records back from `export_jsonl` lines; a malformed line raises `InvalidInput` naming it, and so
    does a line whose ``sum`` does not match (a changed byte; lines without one, from an earlier
    version or written by hand, are read as they are) or that has a field no export writes.

    `lines` are text, or bytes (a file opened in binary): then a line that is not UTF-8 is named by
    its number, as every other wrong line is.
    """
    for number, given in enumerate(lines, start=1):
        where = f"{source}:{number}"
        try:
            line = given.decode("utf-8") if isinstance(given, bytes) else given
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                where, f"not UTF-8 text (byte {exc.object[exc.start]:#04x}, byte {exc.start + 1} of the line)"
            ) from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise InvalidInput(where, "not an exported event line: nested too deeply") from None
        except ValueError as exc:
            raise InvalidInput(where, f"not an exported event line: {exc}") from None
        if not isinstance(row, dict):
            kind = _JSON_KINDS.get(type(row), "a number")
            raise InvalidInput(where, f"not an exported event line: {kind}, not an object")
        for name, value, high in (
            ("position", row.get("position"), _MAX_POSITION),
            ("seq", row.get("seq"), _MAX_SEQ),
        ):
            problem = _not_whole(value, name, high, optional=name == "seq")
            if problem is not None:
                raise InvalidInput(where, f"not an exported event line: {problem}")
        try:
            key = msgspec.convert(row["key"], MemoryKey)
            if "event" in row:
                event = decode_event_json(json.dumps(row["event"]))
                data = encode_event(event)
            else:
                data = base64.b64decode(row["raw"], validate=True)
        except KeyError as exc:
            raise InvalidInput(where, f"not an exported event line: it has no {exc}") from None
        except (ValueError, TypeError, msgspec.ValidationError, EventDecodeError, RecursionError) as exc:
            raise InvalidInput(where, f"not an exported event line: {exc}") from None
        unknown = sorted(set(row) - _LINE_FIELDS)
        if unknown:
            raise InvalidInput(where, f"not an exported event line: unknown field {unknown[0]!r}")
        if "sum" in row and row["sum"] != _line_sum(row):
            # A flipped byte in a turn's text still parses: without this it would be read back as written.
            raise InvalidInput(
                where, "damaged: the line fails its checksum (a byte changed since the export)"
            )
        yield LoggedEvent(key=key, seq=row.get("seq"), position=row["position"], data=data)


_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _not_whole(value: object, name: str, high: int, *, optional: bool) -> str | None:
    """Why `value` is not a whole number from 1 to `high` (null too, when `optional`), or None."""
    if value is None and optional:
        return None
    if value is None:
        return f"it has no {name}"
    if isinstance(value, bool) or not isinstance(value, int):
        shown = repr(value)[:40] if isinstance(value, float | str) else _JSON_KINDS.get(type(value), "?")
        return f"{name} must be a whole number, got {shown}"
    if not 1 <= value <= high:
        shown = str(value) if abs(value) < 10**20 else f"a {value.bit_length()}-bit number"
        return f"{name} must be from 1 to {high}, got {shown}"
    return None
