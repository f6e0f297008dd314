"""In-memory `EventLog`, `SnapshotStore` and `ErasureJournal`: real implementations, not mocks.

They keep the same promises as the JetStream adapters (optimistic
concurrency, exactly-once by event id, erasure that leaves nothing and tells
every watcher, log-wide positions) and pass the same contract suite. The
log's own records are intact (`LoggedEvent.intact`) without a checksum: they
are immutable bytes in this process's memory, never stored where they could
change; bytes stored by `append_raw` with a checksum are checked as the
JetStream log checks them. Useful for tests, for
in-process use and as the reference the durable adapters are checked against.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, TypeVar

import msgspec

from convmem.actors import (
    ErasureNotice,
    ErasureReceipt,
    ErasureRequest,
    LoggedEvent,
    Snapshot,
    Unwatch,
)
from convmem.actors._journal import DamagedRecord, ErasureJournalDamaged
from convmem.adapters.backends._checksum import check
from convmem.adapters.backends._log_bytes import opens_history
from convmem.errors import ConcurrencyConflict, InvalidInput, SessionClosed
from convmem.events import Event, MemoryKey, encode_event
from convmem.projections import SessionSequence

__all__ = [
    "MEMORY_URL",
    "InMemoryBackend",
    "InMemoryErasureJournal",
    "InMemoryEventLog",
    "InMemorySnapshotStore",
]

MEMORY_URL = "memory://"
_log = logging.getLogger("convmem.memory")
_Record = TypeVar("_Record", ErasureRequest, ErasureReceipt)


class InMemoryEventLog:
    """A thread-safe event log held in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[MemoryKey, list[LoggedEvent]] = {}
        self._last_seq: dict[MemoryKey, int] = {}
        self._ids: dict[MemoryKey, set[str]] = {}
        self._all: list[LoggedEvent | None] = []
        self._watchers: dict[object, Callable[[ErasureNotice | None], None]] = {}
        self._journal = InMemoryErasureJournal()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("the in-memory event log is closed")

    def erasure_journal(self) -> InMemoryErasureJournal:
        """See `JournaledLog`: the log's own journal, shared by every system on this log."""
        return self._journal

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        """See `EventLog.append`."""
        with self._lock:
            self._check_open()
            seen = self._ids.setdefault(key, set())
            fresh = [e for e in events if e.event_id not in seen]
            last = self._last_seq.get(key, 0)
            if not fresh:
                return last
            if last != expected_seq + (len(events) - len(fresh)):
                raise ConcurrencyConflict(key=key.composite(), expected_seq=expected_seq, actual_seq=last)
            for offset, event in enumerate(fresh, start=1):
                if event.seq != last + offset:
                    raise InvalidInput(
                        f"events[{offset - 1}].seq", f"is {event.seq}, expected {last + offset}"
                    )
            self._store(key, fresh)
            return self._last_seq[key]

    def _store(self, key: MemoryKey, events: Sequence[Event]) -> None:
        stored = self._sessions.setdefault(key, [])
        for event in events:
            record = LoggedEvent(
                key=key,
                seq=event.seq,
                position=len(self._all) + 1,
                data=encode_event(event),
                event_id=event.event_id,
                intact=True,
            )
            self._all.append(record)
            stored.append(record)
            self._ids.setdefault(key, set()).add(event.event_id)
            self._last_seq[key] = event.seq

    def append_raw(
        self,
        key: MemoryKey,
        data: bytes,
        *,
        seq: int | None = None,
        checksum: str | None = None,
        event_id: str | None = None,
    ) -> int:
        """Store bytes as they are (a poison message, for tests of readers); returns the position.

        With `checksum`, the record is checked as a JetStream read checks it (`intact` or `damage`).
        """
        intact, damage = False, None
        if checksum is not None:
            headers = {"Convmem-Sum": checksum, "seq": "" if seq is None else str(seq), "id": event_id or ""}
            intact, damage = check(headers, data, seq_header="seq", id_header="id")
        with self._lock:
            self._check_open()
            record = LoggedEvent(
                key=key,
                seq=seq,
                position=len(self._all) + 1,
                data=data,
                event_id=event_id,
                intact=intact,
                damage=damage,
            )
            self._all.append(record)
            self._sessions.setdefault(key, []).append(record)
            walk = SessionSequence(self._last_seq.get(key, 0))
            if damage is not None:
                if seq is not None and seq == walk.version + 1:
                    self._last_seq[key] = seq
            elif walk.take(seq, data, intact=intact) is None:  # the session's next event (as the fold counts)
                self._last_seq[key] = walk.version
            return record.position

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        """See `EventLog.read`."""
        with self._lock:
            self._check_open()
            return [r for r in self._sessions.get(key, ()) if r.seq is None or r.seq > after_seq]

    def last_seq(self, key: MemoryKey) -> int:
        """See `EventLog.last_seq`."""
        with self._lock:
            self._check_open()
            return self._last_seq.get(key, 0)

    def log_position(self) -> int:
        """See `LogPositions`: the position of the last record stored (an erased one's too: positions
        are never given twice)."""
        with self._lock:
            self._check_open()
            return len(self._all)

    def read_all(
        self,
        *,
        tenant_id: str | None = None,
        user_id: str | None = None,
        until_position: int | None = None,
    ) -> Iterator[LoggedEvent]:
        """See `EventLog.read_all`."""
        if user_id is not None and tenant_id is None:
            raise InvalidInput("user_id", "reading one user's events needs tenant_id too")
        with self._lock:
            self._check_open()
            snapshot = list(self._all if until_position is None else self._all[:until_position])
        for record in snapshot:
            if record is None:
                continue
            if tenant_id is not None and record.key.tenant_id != tenant_id:
                continue
            if user_id is not None and record.key.user_id != user_id:
                continue
            yield record

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """See `EventLog.keys`."""
        with self._lock:
            self._check_open()
            return [
                k
                for k, records in self._sessions.items()
                if records
                and (tenant_id is None or k.tenant_id == tenant_id)
                and (user_id is None or k.user_id == user_id)
            ]

    def counts(self, *, tenant_id: str | None = None, user_id: str | None = None) -> dict[MemoryKey, int]:
        """How many records each session holds (of a tenant, of a user)."""
        with self._lock:
            self._check_open()
            return {
                k: len(records)
                for k, records in sorted(self._sessions.items(), key=lambda item: item[0].composite())
                if records
                and (tenant_id is None or k.tenant_id == tenant_id)
                and (user_id is None or k.user_id == user_id)
            }

    def erase(self, key: MemoryKey, *, at: float) -> int:
        """See `EventLog.erase`: nothing of the session stays, and every watcher is told."""
        with self._lock:
            self._check_open()
            erased = self._erase_locked(key)
        if erased is not None:
            self._tell(ErasureNotice.of_sessions([key]))
        return erased or 0

    def _erase_locked(self, key: MemoryKey) -> int | None:
        """Forget the session's records and ids; None when it had none."""
        records = self._sessions.pop(key, [])
        self._last_seq.pop(key, None)
        self._ids.pop(key, None)
        if not records:
            return None
        for record in records:
            self._all[record.position - 1] = None
        return sum(1 for r in records if not _is_fence(r))

    def erase_user(self, tenant_id: str, user_id: str, *, at: float) -> int:
        """See `EventLog.erase_user`."""
        with self._lock:
            self._check_open()
            keys = [k for k in self._sessions if k.tenant_id == tenant_id and k.user_id == user_id]
            erased = [self._erase_locked(k) for k in keys]
        if any(n is not None for n in erased):
            self._tell(ErasureNotice.of_user(tenant_id, user_id))
        return sum(n or 0 for n in erased)

    def drop_before(self, key: MemoryKey, *, seq: int) -> int:
        """See `EventLog.drop_before`: the records before the compaction are forgotten, ids too."""
        with self._lock:
            self._check_open()
            records = self._sessions.get(key, [])
            at = next((r for r in records if r.seq == seq and opens_history(r.data, seq)), None)
            if at is None:
                raise InvalidInput("seq", f"{key} has no stored compaction or erasure fence at seq {seq}")
            below = [r for r in records if r.position < at.position]
            for record in below:
                self._all[record.position - 1] = None
                if record.event_id is not None:
                    self._ids.get(key, set()).discard(record.event_id)
            self._sessions[key] = [r for r in records if r.position >= at.position]
            return len(below)

    def watch_erasures(self, on_notice: Callable[[ErasureNotice | None], None]) -> Unwatch:
        """See `ErasureWatch`: watchers are told before `erase` returns."""
        token = object()
        with self._lock:
            self._watchers[token] = on_notice

        def unwatch() -> None:
            with self._lock:
                self._watchers.pop(token, None)

        return unwatch

    def announce(self, notice: ErasureNotice) -> None:
        """See `ErasureWatch.announce`: every watcher is told before this returns."""
        with self._lock:
            self._check_open()
        self._tell(notice)

    def _tell(self, notice: ErasureNotice) -> None:
        with self._lock:
            watchers = list(self._watchers.values())
        for on_notice in watchers:
            try:
                on_notice(notice)
            except Exception:  # one watcher's failure must not keep the others uninformed
                _log.exception("an erasure watcher failed")

    def close(self) -> None:
        """See `EventLog.close`."""
        with self._lock:
            self._closed = True


def _is_fence(record: LoggedEvent) -> bool:
    return record.event_id is not None and record.event_id.startswith("erased/")


class InMemorySnapshotStore:
    """Latest snapshot per session, held in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[MemoryKey, Snapshot] = {}

    def load(self, key: MemoryKey) -> Snapshot | None:
        """See `SnapshotStore.load`."""
        with self._lock:
            return self._snapshots.get(key)

    def save(self, snapshot: Snapshot) -> None:
        """See `SnapshotStore.save`."""
        with self._lock:
            current = self._snapshots.get(snapshot.key)
            if current is None or current.seq < snapshot.seq:
                self._snapshots[snapshot.key] = snapshot

    def delete(self, key: MemoryKey) -> None:
        """See `SnapshotStore.delete`."""
        with self._lock:
            self._snapshots.pop(key, None)

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """See `SnapshotStore.keys`."""
        if user_id is not None and tenant_id is None:
            raise InvalidInput("user_id", "listing one user's snapshots needs tenant_id too")
        with self._lock:
            found = list(self._snapshots)
        return sorted(
            (
                k
                for k in found
                if (tenant_id is None or k.tenant_id == tenant_id)
                and (user_id is None or k.user_id == user_id)
            ),
            key=MemoryKey.composite,
        )

    def close(self) -> None:
        """Nothing to release."""


class InMemoryErasureJournal:
    """Pending erasures and receipts, held in this process (as long-lived as the in-memory log).

    Its records are immutable objects in memory, never damaged; `store_raw`
    holds bytes as a store might hand them back (a test's damaged record),
    read as the JetStream journal reads its messages: bytes that decode as the
    record of that kind and id are one, any others (and None, a record the
    store counts but cannot serve) are a damaged record (`ErasureJournalDamaged`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, ErasureRequest] = {}
        self._done: dict[str, ErasureReceipt] = {}
        self._raw: dict[tuple[str, str], bytes | None] = {}
        self._settled: dict[str, tuple[str, float]] = {}
        self._kept: list[str] = []  # the ids of the receipts, in the order they were kept
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("the in-memory erasure journal is closed")

    def record(self, request: ErasureRequest) -> None:
        """See `ErasureJournal.record`."""
        with self._lock:
            self._check_open()
            if request.id not in self._done and ("pending", request.id) not in self._raw:
                self._pending.setdefault(request.id, request)

    def store_raw(self, kind: Literal["pending", "done"], erasure_id: str, data: bytes | None) -> None:
        """Hold `data` as the `kind` record of erasure `erasure_id`, in place of any (see the class doc)."""
        with self._lock:
            self._check_open()
            (self._pending if kind == "pending" else self._done).pop(erasure_id, None)
            self._raw[(kind, erasure_id)] = data
            if kind == "done":
                self._kept.append(erasure_id)

    def pending(self) -> list[ErasureRequest]:
        """See `ErasureJournal.pending`."""
        with self._lock:
            self._check_open()
            found, damaged = self._read(ErasureRequest, "pending", self._pending)
            ended = {*self._settled, *self._done, *(i for k, i in self._raw if k == "done")}
        found.sort(key=lambda r: (r.at, r.id))
        damaged = [d for d in damaged if d.id not in ended]
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=found)
        return found

    def complete(self, receipt: ErasureReceipt) -> None:
        """See `ErasureJournal.complete`."""
        with self._lock:
            self._check_open()
            if ("done", receipt.id) not in self._raw and receipt.id not in self._done:
                self._done[receipt.id] = receipt
                self._kept.append(receipt.id)
            self._pending.pop(receipt.id, None)
            self._raw.pop(("pending", receipt.id), None)

    def receipts(self) -> list[ErasureReceipt]:
        """See `ErasureJournal.receipts`."""
        with self._lock:
            self._check_open()
            found, damaged = self._read(ErasureReceipt, "done", self._done)
            ended = set(self._settled)
        found.sort(key=lambda r: (r.completed_at, r.id))
        damaged = [d for d in damaged if d.id not in ended]
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=found)
        return found

    def receipts_mark(self) -> int:
        """See `MarksReceipts.receipts_mark`: how many receipts were kept so far."""
        with self._lock:
            self._check_open()
            return len(self._kept)

    def receipts_after(self, mark: int) -> list[ErasureReceipt]:
        """See `MarksReceipts.receipts_after`."""
        with self._lock:
            self._check_open()
            since = set(self._kept[mark:])
        try:
            receipts = self.receipts()
        except ErasureJournalDamaged as exc:
            readable = [r for r in exc.readable if isinstance(r, ErasureReceipt) and r.id in since]
            damaged = [d for d in exc.damaged if d.id in since]
            if damaged:
                raise ErasureJournalDamaged(damaged, readable=readable) from None
            return readable
        return [r for r in receipts if r.id in since]

    def settle(self, erasure_id: str, *, by: str, at: float) -> None:
        """See `ErasureJournal.settle`."""
        with self._lock:
            self._check_open()
            self._settled.setdefault(erasure_id, (by, at))
            self._pending.pop(erasure_id, None)
            self._raw.pop(("pending", erasure_id), None)

    def _read(
        self, kind: type[_Record], name: Literal["pending", "done"], held: dict[str, _Record]
    ) -> tuple[list[_Record], list[DamagedRecord]]:
        found, damaged = list(held.values()), []
        for (raw_kind, erasure_id), data in sorted(self._raw.items(), key=lambda item: item[0]):
            if raw_kind != name:
                continue
            problem = "the store holds it, but cannot read it back"
            if data is not None:
                try:
                    record = msgspec.msgpack.decode(data, type=kind)
                except (msgspec.MsgspecError, ValueError, TypeError) as exc:
                    problem = f"does not decode: {str(exc)[:200]}"
                else:
                    if record.id == erasure_id:
                        found.append(record)
                        continue
                    problem = f"holds the record of another erasure id ({record.id[:40]!r})"
            damaged.append(
                DamagedRecord(kind=name, id=erasure_id, where=f"key {name}.{erasure_id}", problem=problem)
            )
        return found, damaged

    def close(self) -> None:
        """See `ErasureJournal.close`."""
        with self._lock:
            self._closed = True


class InMemoryBackend:
    """The log, snapshot store and erasure journal behind ``memory://``, shaped like `JetStreamBackend`."""

    url = MEMORY_URL
    server = None

    def __init__(self) -> None:
        self.log = InMemoryEventLog()
        self.snapshots = InMemorySnapshotStore()
        self.journal = self.log.erasure_journal()

    def close(self) -> None:
        """Close the log, the snapshot store and the journal."""
        self.log.close()
        self.snapshots.close()
        self.journal.close()
