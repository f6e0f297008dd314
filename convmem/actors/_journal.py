"""The erasure journal: an erasure is recorded before anything is deleted, and kept as a receipt after.

An `ErasureRequest` (tenant; user, or one session; who asked; when) is
written to the journal first and stays there, *pending*, while the steps of
`convmem.actors._eraser` remove every copy. Any process may finish it
(`finish_erasures`): the request holds everything the steps need. Once every
step is done the journal keeps an `ErasureReceipt` instead, which says that
an erasure happened, when and by whom, but holds the erased ids only as a
BLAKE2b digest keyed with a salt of its own (as `ErasureNotice` does); the
pending request, the only record with ids in clear, is then erased for good.

`find_erasure(journal, key)` is the one question the rest of convmem asks:
"was this session erased?" A snapshot or any other data is deleted as
erased only when it answers with a record; a session whose events vanished
without one is lost (`SessionLost`), and its snapshot is kept.

A record the journal holds but cannot read back as it was written (the store
counts it and cannot serve it, it fails its checksum, or it does not decode)
is damage, never skipped: `pending` and `receipts` raise
`ErasureJournalDamaged`, naming each such record and carrying the records
that still read (so the readable pending erasures are still finished), and
`find_erasure` raises it when no readable record covers the key (a damaged
record might). A damaged *pending* record is an erasure asked for and not
finished whose scope can no longer be read: it stays reported until an
operator erases its scope again and `settle`s it (``convmem erase ...
--settle ID``).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Iterable
from typing import Literal, Protocol, runtime_checkable

import msgspec

from convmem.actors._erasure import _SALT_BYTES, _digest  # receipts digest ids as notices do
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import MemoryKey

__all__ = [
    "DamagedRecord",
    "ErasureJournal",
    "ErasureJournalDamaged",
    "ErasureReceipt",
    "ErasureRecord",
    "ErasureRequest",
    "JournaledLog",
    "LogPositions",
    "MarksReceipts",
    "erasure_after",
    "find_erasure",
    "readable_pending",
    "readable_receipts",
    "receipts_mark",
]


class ErasureRequest(msgspec.Struct, frozen=True, kw_only=True):
    """An erasure asked for and not yet finished: every session of a user, or one session.

    `id` is random (it names the request in the journal without naming the
    user); `by` is who asked (an operator's name, kept in clear in the
    receipt, so never the erased user's id); `at` is when, in epoch seconds.
    """

    id: str
    tenant_id: str
    user_id: str
    session_id: str | None = None
    by: str = ""
    at: float = 0.0

    @classmethod
    def of(
        cls, tenant_id: str, user_id: str, session_id: str | None, *, by: str, at: float
    ) -> ErasureRequest:
        """A new request with a fresh id; `InvalidInput` when `by` names the erased user."""
        if by and by in (user_id, session_id):
            raise InvalidInput("by", "names the erased user or session: the receipt keeps it in clear")
        return cls(
            id=uuid.uuid4().hex, tenant_id=tenant_id, user_id=user_id, session_id=session_id, by=by, at=at
        )

    @property
    def scope(self) -> Literal["session", "user"]:
        return "user" if self.session_id is None else "session"

    @property
    def key(self) -> MemoryKey | None:
        """The one session erased, or None for a user's every session."""
        if self.session_id is None:
            return None
        return MemoryKey(self.tenant_id, self.user_id, self.session_id)

    def covers(self, key: MemoryKey) -> bool:
        """Whether `key` is one of the sessions this request erases."""
        return (
            key.tenant_id == self.tenant_id
            and key.user_id == self.user_id
            and (self.session_id is None or key.session_id == self.session_id)
        )

    def receipt(
        self, *, completed_at: float, sessions: int, events_purged: int, log_position: int | None = None
    ) -> ErasureReceipt:
        """What the journal keeps once the erasure is done: no id in clear."""
        salt = os.urandom(_SALT_BYTES)
        ids = (
            (self.tenant_id, self.user_id)
            if self.session_id is None
            else (self.tenant_id, self.user_id, self.session_id)
        )
        return ErasureReceipt(
            id=self.id,
            salt=salt,
            digest=_digest(salt, *ids),
            scope=self.scope,
            by=self.by,
            requested_at=self.at,
            completed_at=completed_at,
            sessions=sessions,
            events_purged=events_purged,
            log_position=log_position,
        )


class ErasureReceipt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A finished erasure: when, by whom, how much; the ids only as a digest keyed with `salt`.

    `log_position` is where the event log stood once the erasure's events step was done (its
    log-wide position, `LogPositions.log_position`): every event the erasure erased, and its
    fences, are at or below it, and every event stored after it is above it, whatever any clock
    said. None in receipts written before it was recorded, or on a log that cannot say: a copy is
    then weighed against `completed_at` by time (see `erasure_after`), and the receipt is stored
    as one written before (a field at its default is left out of the stored bytes).
    """

    id: str
    salt: bytes
    digest: bytes
    scope: Literal["session", "user"]
    by: str
    requested_at: float
    completed_at: float
    sessions: int
    events_purged: int
    log_position: int | None = None

    def covers(self, key: MemoryKey) -> bool:
        """Whether `key` is one of the sessions this erasure erased."""
        if self.scope == "user":
            return _digest(self.salt, key.tenant_id, key.user_id) == self.digest
        return _digest(self.salt, key.tenant_id, key.user_id, key.session_id) == self.digest


ErasureRecord = ErasureRequest | ErasureReceipt
"""What the journal holds about one erasure: pending (a request) or done (a receipt)."""


class DamagedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A record the journal holds but cannot read back as it was written: damage, never skipped.

    `kind` is ``pending`` (an erasure asked for and not finished: its scope,
    tenant, user or session, can no longer be read) or ``done`` (the receipt
    of a finished one); `id` the erasure's id (random: it names no user);
    `where` where the store holds the record (its key, and its position when
    the store could serve it); `problem` what failed.
    """

    kind: Literal["pending", "done"]
    id: str
    where: str
    problem: str

    def describe(self) -> str:
        """One line: which record, where, and what failed (no id of a user: the record is unreadable)."""
        what = "pending erasure" if self.kind == "pending" else "receipt of erasure"
        return f"{what} {self.id} ({self.where}): {self.problem}"


class ErasureJournalDamaged(ConvmemError):
    """The erasure journal holds records it cannot read back (`damaged`); `readable`: those it could.

    Raised by `ErasureJournal.pending` and `ErasureJournal.receipts` (with the
    records of that kind that read), and by `find_erasure` when no readable
    record covers the key. A damaged pending record is an erasure that was
    asked for and never finished, and its scope is unreadable: it is reported
    until an operator erases that scope again (an erasure is idempotent) and
    settles the record (`ErasureJournal.settle`, ``convmem erase --settle ID``).
    `advice` says so in words.
    """

    def __init__(self, damaged: Iterable[DamagedRecord], *, readable: Iterable[ErasureRecord] = ()) -> None:
        self.damaged = tuple(damaged)
        self.readable = tuple(readable)
        self.advice = _advice(self.damaged)
        listed = "; ".join(d.describe() for d in self.damaged)
        super().__init__(
            f"the erasure journal holds {len(self.damaged)} damaged record(s): {listed}. {self.advice}"
        )


def _advice(damaged: tuple[DamagedRecord, ...]) -> str:
    parts = []
    if any(d.kind == "pending" for d in damaged):
        parts.append(
            "A damaged pending record is an erasure that was asked for and not finished, and its scope "
            "(tenant, user or session) cannot be read: it is not done, and stays reported. Find which "
            "user or session it was for (who asked, and when), erase that again and settle the record: "
            "`convmem erase --tenant T --user U --settle ID` (or `--key T:U:S --settle ID`); erasing "
            "again is safe, an erasure is idempotent."
        )
    if any(d.kind == "done" for d in damaged):
        parts.append(
            "A damaged receipt belongs to an erasure that finished; what it kept (when, by whom, its "
            "sessions as a digest) is lost, so a stale copy of those sessions is reported rather than "
            "deleted: erase its scope again if it is known, then `convmem erase --settle ID`."
        )
    parts.append(
        "`convmem erase --settle ID` alone settles a record whose scope cannot be found (nothing is erased)."
    )
    return " ".join(parts)


class ErasureJournal(Protocol):
    """Durable records of erasures: pending requests, then receipts (a port; see the module's doc).

    Every method is idempotent and safe to call from several processes at once.
    """

    def record(self, request: ErasureRequest) -> None:
        """Store `request` as pending, durably, before returning (nothing is deleted before it)."""
        ...

    def pending(self) -> list[ErasureRequest]:
        """The requests not finished yet, oldest first.

        `ErasureJournalDamaged` (with the readable requests) when a pending
        record is held but cannot be read back, unless it is finished (a
        receipt of its id is kept) or settled (`settle`).
        """
        ...

    def complete(self, receipt: ErasureReceipt) -> None:
        """Keep `receipt` (once per id), then erase the pending request of the same id for good."""
        ...

    def receipts(self) -> list[ErasureReceipt]:
        """The finished erasures, oldest first.

        `ErasureJournalDamaged` (with the readable receipts) when a receipt is
        held but cannot be read back, unless it is settled (`settle`).
        """
        ...

    def settle(self, erasure_id: str, *, by: str, at: float) -> None:
        """Keep that an operator dealt with the damaged records of erasure `erasure_id` (`by`, `at`).

        From then on they are no longer reported as damage. Meant for after
        the erasure's scope was erased again (or found to be gone): settling
        erases nothing itself. A pending record of that id that the store
        can still serve is erased for good, as `complete` erases it.
        Idempotent.
        """
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@runtime_checkable
class JournaledLog(Protocol):
    """An `EventLog` that keeps an erasure journal beside its events (optional capability).

    `erasure_journal()` is that journal, as durable as the log (None: the log
    keeps none, or a reader cannot see it). A `MemorySystem` given no
    `journal` uses it, so a system built on a log alone records its erasures
    where the log is.
    """

    def erasure_journal(self) -> ErasureJournal | None: ...


@runtime_checkable
class LogPositions(Protocol):
    """An `EventLog` that can say where it stands (optional capability).

    `log_position()` is the log-wide position (`LoggedEvent.position`, a JetStream stream
    sequence) of the last record it stored, erased ones included (0: none yet): positions only
    grow, so an event stored later is above it.
    """

    def log_position(self) -> int: ...


def log_position(log: object) -> int | None:
    """`log`'s `LogPositions.log_position`, or None when it cannot say."""
    return log.log_position() if isinstance(log, LogPositions) else None


def find_erasure(journal: ErasureJournal | None, key: MemoryKey) -> ErasureRecord | None:
    """The record of an erasure that covers `key` (pending first), or None: was this session erased?

    With no journal there is no record, so nothing may be deleted as erased.
    `ErasureJournalDamaged` when no readable record covers `key` while a
    damaged one is held: it might, so the answer is neither yes nor no.
    """
    return erasure_after(journal, key, -math.inf)  # any receipt, whenever it finished


@runtime_checkable
class MarksReceipts(Protocol):
    """An `ErasureJournal` that can say where its receipts stand, and read only those kept after.

    Receipts are kept for good, one per erasure, and any tenant may ask for
    erasures (of sessions it never wrote, too): a question about the last few
    moments must not read them all.
    """

    def receipts_mark(self) -> int:
        """Where the journal's receipts stand now (a position in its store)."""
        ...

    def receipts_after(self, mark: int) -> list[ErasureReceipt]:
        """The receipts kept after `mark` (`receipts_mark`), oldest first; `ErasureJournalDamaged` (with
        those that read) when one of them is held but cannot be read back."""
        ...


def receipts_mark(journal: ErasureJournal | None) -> int | None:
    """`journal`'s `MarksReceipts.receipts_mark`, for `erasure_after`'s `mark`; None when it cannot say."""
    return journal.receipts_mark() if isinstance(journal, MarksReceipts) else None


def erasure_after(
    journal: ErasureJournal | None,
    key: MemoryKey,
    since: float,
    *,
    mark: int | None = None,
    position: int = 0,
    log_now: int | None = None,
) -> ErasureRecord | None:
    """An erasure covering `key` that data read as of `since` belongs to: one pending now, or one
    finished at or after `since` (any receipt of those that read, not only the first); else None.

    What a copy of old data asks (a lost session's restore, a fork) before it
    writes, with `since` the copied data's last time, and after it wrote, with
    `since` when it began reading: an erasure that ran meanwhile may have
    listed the sessions before the copy existed, so the copy is erased data
    too. `since=math.inf` asks for a pending one only (no receipt is read).
    `mark` (`receipts_mark`, taken before the copy began reading) reads only
    the receipts kept since, whenever they say they finished: every receipt
    kept before it belongs to an erasure that was over before the copy read
    anything. `position` (without `mark`) is the log position of the copied data's last event
    (`Snapshot.position`; 0 when unknown): a receipt that says where the log stood after its events
    step (`ErasureReceipt.log_position`) covers the copy when the copy's last event is at or below
    that, whatever the clocks say (an event stored after the erasure is above it); a receipt
    without one (written by an older version), or a copy of unknown position, is weighed by time
    as before (`completed_at >= since`). `log_now` (`log_position` asked now) tells positions of
    another stream apart: a log lost and made again (``convmem repair --accept-loss``) numbers from 1
    again, so a position above where the log stands now is of the stream before; a receipt and a
    copy on either side of it are weighed by time. `ErasureJournalDamaged` as `find_erasure`.
    """
    if journal is None:
        return None
    pending, damaged = readable_pending(journal)
    for request in pending:
        if request.covers(key):
            return request
    if since == math.inf:
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=pending)
        return None
    if mark is not None and isinstance(journal, MarksReceipts):
        try:
            receipts, damaged_receipts = journal.receipts_after(mark), []
        except ErasureJournalDamaged as exc:
            receipts = [r for r in exc.readable if isinstance(r, ErasureReceipt)]
            damaged_receipts = list(exc.damaged)
        since = -math.inf  # kept after the mark: the erasure ran while the copy was made
    else:
        receipts, damaged_receipts = readable_receipts(journal)
    for receipt in receipts:
        if _after(receipt, since, position, log_now) and receipt.covers(key):
            return receipt
    if damaged or damaged_receipts:
        raise ErasureJournalDamaged([*damaged, *damaged_receipts], readable=[*pending, *receipts])
    return None


def _after(receipt: ErasureReceipt, since: float, position: int, log_now: int | None) -> bool:
    """Whether data read as of `since` (its last event at log `position`) predates `receipt`'s end."""
    if since == -math.inf:
        return True  # any receipt (`find_erasure`, or one kept after a mark)
    erased_up_to = receipt.log_position
    if (
        position > 0
        and erased_up_to is not None
        # Of one stream: both at or below where the log stands now, or both above (the stream before)
        and (log_now is None or (position > log_now) == (erased_up_to > log_now))
    ):
        return position <= erased_up_to  # by position: the clocks do not matter
    return receipt.completed_at >= since  # an older receipt, or a copy of unknown position: by time


def readable_pending(journal: ErasureJournal) -> tuple[list[ErasureRequest], list[DamagedRecord]]:
    """The pending erasures of `journal` that read, and its pending records that do not."""
    try:
        return journal.pending(), []
    except ErasureJournalDamaged as exc:
        return [r for r in exc.readable if isinstance(r, ErasureRequest)], list(exc.damaged)


def readable_receipts(journal: ErasureJournal) -> tuple[list[ErasureReceipt], list[DamagedRecord]]:
    """The receipts of `journal` that read, and its receipts that do not."""
    try:
        return journal.receipts(), []
    except ErasureJournalDamaged as exc:
        return [r for r in exc.readable if isinstance(r, ErasureReceipt)], list(exc.damaged)
