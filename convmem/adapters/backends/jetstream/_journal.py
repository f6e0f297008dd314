"""`ErasureJournal` on a JetStream key-value bucket of its own (``<stream>_ERASURES`` by default).

A pending request is one message on ``$KV.<bucket>.pending.<id>``, a receipt
one on ``$KV.<bucket>.done.<id>``; the id is random, so no subject names the
erased user. Each is written only on an empty subject (a conditional
publish), so two processes recording or finishing the same erasure store it
once. Finishing writes the receipt first, then erases the pending message
with ``STREAM.MSG.DELETE``, which overwrites its bytes on disk: once an
erasure is complete no file of the bucket holds its ids in clear. The
bucket is a file stream with the events' replica count; on the embedded
server (``sync_interval: always``) a recorded request is on disk before
`record` returns, so nothing is deleted before its record is.

Every record carries a ``Convmem-Sum`` header, the CRC-32 of its subject and
bytes (`convmem.adapters.backends._checksum`, as snapshots are sealed),
checked on every read; records written before the header existed are read
unchecked. A record the bucket lists but the server cannot serve (damaged on
disk: nats-server checks its own hash and answers "no message found"), one
that fails its checksum, and one that does not decode as the record its key
names are damage, never skipped: `pending` and `receipts` raise
`ErasureJournalDamaged` naming each (its key in the bucket, and its stream
seq when it could be read), unless a receipt of that id (for a pending
record) or a settlement (``settled.<id>``, written by `settle`) is listed.
A damaged message cannot be erased through the server (it refuses: "invalid
checksum"), so the settlement, not the record's removal, is what ends the
report. A key listed, then not served, is listed again before it counts as
damage: another process finishing the erasure meanwhile is not damage.
"""

from __future__ import annotations

import threading
from typing import Literal, TypeVar

import msgspec
import nats.errors
import nats.js.errors

from convmem.actors import ErasureReceipt, ErasureRequest
from convmem.actors._journal import DamagedRecord, ErasureJournalDamaged
from convmem.adapters.backends._checksum import SUM_HEADER, seal
from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage
from convmem.adapters.backends.jetstream._read import list_subjects
from convmem.adapters.backends.jetstream._setup import check_names, open_bucket
from convmem.adapters.backends.jetstream._watch import publish_denied
from convmem.adapters.backends.jetstream._write import erased_already
from convmem.errors import InvalidConfig, SessionClosed

__all__ = ["JetStreamErasureJournal", "erasure_bucket"]

T = TypeVar("T", ErasureRequest, ErasureReceipt)

_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_OPERATION = "KV-Operation"
_ALREADY_THERE = (10071, 10164)
_request = msgspec.msgpack.Decoder(ErasureRequest)
_receipt = msgspec.msgpack.Decoder(ErasureReceipt)
_UNSERVED = "the bucket holds it, but the server cannot read it back (damaged on disk)"


class _Settlement(msgspec.Struct, frozen=True, kw_only=True):
    """What ``settled.<id>`` holds: who settled the damaged records of erasure `id`, and when."""

    id: str
    by: str
    at: float


def erasure_bucket(stream: str) -> str:
    """The journal bucket that belongs to the events stream `stream`."""
    return f"{stream}_ERASURES"


class JetStreamErasureJournal:
    """The durable `ErasureJournal`: pending requests and receipts in a key-value bucket."""

    def __init__(
        self, connection: NatsConnection, *, bucket: str, replicas: int = 1, create: bool = True
    ) -> None:
        """Use an open connection (leased until `close`); creates or checks the bucket.

        With `create` False the bucket is never created; a missing one is `StoreNotFound`.
        """
        check_names(bucket=bucket)
        if replicas < 1:
            raise InvalidConfig("replicas", f"is {replicas}, must be 1 or more")
        connection.lease()
        self._conn = connection
        self._bucket = bucket
        self._stream = f"KV_{bucket}"
        self._closed = False
        self._close_lock = threading.Lock()
        try:
            open_bucket(
                connection,
                bucket,
                replicas=replicas,
                create=create,
                what="erasure journal",
                missing="erasure journal",
            )
        except BaseException:
            self.close()
            raise

    @property
    def bucket(self) -> str:
        return self._bucket

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("the JetStream erasure journal is closed")

    def _subject(self, kind: str, erasure_id: str) -> str:
        if not erasure_id.isalnum():
            raise InvalidConfig("erasure id", f"{erasure_id[:40]!r} must be letters and digits")
        return f"$KV.{self._bucket}.{kind}.{erasure_id}"

    def record(self, request: ErasureRequest) -> None:
        """See `ErasureJournal.record`: acknowledged by the server (on disk) before it returns."""
        self._check_open()
        subject = self._subject("pending", request.id)
        data = msgspec.msgpack.encode(request)
        self._conn.call(lambda: self._put_once(subject, data), what="record an erasure")

    def pending(self) -> list[ErasureRequest]:
        """See `ErasureJournal.pending`: `ErasureJournalDamaged` names a pending record that is damaged."""
        found, damaged = self._read_all("pending", _request)
        found.sort(key=lambda r: (r.at, r.id))
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=found)
        return found

    def complete(self, receipt: ErasureReceipt) -> None:
        """See `ErasureJournal.complete`: the receipt first, then the request's bytes overwritten."""
        self._check_open()
        done = self._subject("done", receipt.id)
        pending = self._subject("pending", receipt.id)
        data = msgspec.msgpack.encode(receipt)

        async def finish() -> None:
            await self._put_once(done, data)
            while (message := await self._get(pending)) is not None:
                await self._erase(message.seq)

        self._conn.call(finish, what="complete an erasure")

    def receipts(self) -> list[ErasureReceipt]:
        """See `ErasureJournal.receipts`: `ErasureJournalDamaged` names a receipt that is damaged."""
        found, damaged = self._read_all("done", _receipt)
        found.sort(key=lambda r: (r.completed_at, r.id))
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=found)
        return found

    def receipts_mark(self) -> int:
        """See `MarksReceipts.receipts_mark`: the bucket's last stream seq (one request)."""
        self._check_open()

        async def last() -> int:
            info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._stream}")
            return int(info["state"]["last_seq"])

        return self._conn.call(last, what="read the erasure journal's position")

    def receipts_after(self, mark: int) -> list[ErasureReceipt]:
        """See `MarksReceipts.receipts_after`: the receipts past stream seq `mark`, one get each (a
        receipt that fails its checksum or does not decode is damage, unless settled)."""
        self._check_open()
        prefix = f"$KV.{self._bucket}.done."

        async def read() -> tuple[list[ErasureReceipt], list[DamagedRecord]]:
            found: list[ErasureReceipt] = []
            damaged: dict[str, DamagedRecord] = {}
            seq = mark + 1
            while (
                message := await self._conn.get_message(
                    self._stream, {"seq": seq, "next_by_subj": prefix + "*"}
                )
            ) is not None:
                seq = message.seq + 1
                if message.headers.get(_OPERATION) in ("DEL", "PURGE"):
                    continue
                erasure_id = message.subject[len(prefix) :]
                record, problem = _read(message, erasure_id, _receipt)
                if record is not None:
                    found.append(record)
                else:
                    damaged[erasure_id] = self._damage("done", erasure_id, message.seq, problem)
            if damaged:
                for ended in await self._ended("done"):
                    damaged.pop(ended, None)
            return found, list(damaged.values())

        found, damaged = self._conn.call(read, what="read the erasure journal (done)")
        if damaged:
            raise ErasureJournalDamaged(damaged, readable=found)
        return found

    def settle(self, erasure_id: str, *, by: str, at: float) -> None:
        """See `ErasureJournal.settle`: ``settled.<id>`` is written once; a pending record of that id
        that the server can still serve is erased for good."""
        self._check_open()
        settled = self._subject("settled", erasure_id)
        pending = self._subject("pending", erasure_id)
        data = msgspec.msgpack.encode(_Settlement(id=erasure_id, by=by, at=at))

        async def put() -> None:
            await self._put_once(settled, data)
            while (message := await self._get(pending)) is not None:
                await self._erase(message.seq)

        self._conn.call(put, what="settle a damaged erasure record")

    def _read_all(
        self, kind: Literal["pending", "done"], decoder: msgspec.msgpack.Decoder[T]
    ) -> tuple[list[T], list[DamagedRecord]]:
        """The records of `kind` that read, and those held that do not (unless finished or settled)."""
        self._check_open()
        prefix = f"$KV.{self._bucket}.{kind}."

        async def read() -> tuple[list[T], list[DamagedRecord]]:
            subjects = await list_subjects(self._conn, self._stream, prefix + "*")
            found: list[T] = []
            damaged: dict[str, DamagedRecord] = {}
            unserved: list[str] = []
            for subject in sorted(subjects):
                erasure_id = subject[len(prefix) :]
                message = await self._get(subject)
                if message is None:
                    unserved.append(subject)
                    continue
                if message.headers.get(_OPERATION) in ("DEL", "PURGE"):
                    continue  # removed with the key-value API: no record
                record, problem = _read(message, erasure_id, decoder)
                if record is not None:
                    found.append(record)
                else:
                    damaged[erasure_id] = self._damage(kind, erasure_id, message.seq, problem)
            if unserved:  # listed again: a record erased meanwhile (finished by another process) is gone
                still = await list_subjects(self._conn, self._stream, prefix + "*")
                for subject in unserved:
                    if still.get(subject):
                        erasure_id = subject[len(prefix) :]
                        damaged[erasure_id] = self._damage(kind, erasure_id, None, _UNSERVED)
            if damaged:
                for ended in await self._ended(kind):
                    damaged.pop(ended, None)
            return found, list(damaged.values())

        return self._conn.call(read, what=f"read the erasure journal ({kind})")

    async def _ended(self, kind: str) -> set[str]:
        """The ids whose damaged `kind` records are no longer damage: settled ones, and for a pending
        record, a finished one (its receipt kept; the server would not let it be erased)."""
        kinds = ("settled", "done") if kind == "pending" else ("settled",)
        ended: set[str] = set()
        for other in kinds:
            prefix = f"$KV.{self._bucket}.{other}."
            listed = await list_subjects(self._conn, self._stream, prefix + "*")
            ended.update(s[len(prefix) :] for s, count in listed.items() if count)
        return ended

    def _damage(
        self, kind: Literal["pending", "done"], erasure_id: str, seq: int | None, problem: str
    ) -> DamagedRecord:
        where = f"key {kind}.{erasure_id} of bucket {self._bucket}"
        if seq is not None:
            where += f", stream {self._stream} seq {seq}"
        return DamagedRecord(kind=kind, id=erasure_id, where=where, problem=problem)

    async def _put_once(self, subject: str, data: bytes) -> None:
        headers = {_EXPECTED: "0", SUM_HEADER: seal("", subject, data)}
        try:
            # A refused subject fails now, named.
            await publish_denied(self._conn.js, self._conn.watch, subject, data, headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _ALREADY_THERE:  # recorded already (by us, retried, or another process)
                raise

    async def _erase(self, position: int) -> None:
        try:
            await self._conn.api(f"$JS.API.STREAM.MSG.DELETE.{self._stream}", {"seq": position})
        except nats.js.errors.APIError as exc:
            # Gone: erased meanwhile by another process finishing it. A message nats-server refuses
            # to erase (damaged on disk: the same code) is not: it would be read again and again.
            if not erased_already(exc):
                raise

    async def _get(self, subject: str) -> StoredMessage | None:
        return await self._conn.get_message(self._stream, {"last_by_subj": subject})

    def close(self) -> None:
        """See `ErasureJournal.close`. Releases this journal's share of the connection."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._conn.release()


def _read(
    message: StoredMessage, erasure_id: str, decoder: msgspec.msgpack.Decoder[T]
) -> tuple[T | None, str]:
    """The record `message` holds, or None and why it cannot be read as the record of `erasure_id`."""
    stored = message.headers.get(SUM_HEADER)
    if stored is not None:  # a record written before the header existed is read unchecked
        computed = seal("", message.subject, message.data)
        if stored != computed:
            return None, f"fails its checksum (stored {stored[:16]!r}, the bytes read give {computed})"
    if not message.data:
        return None, "holds no bytes"
    try:
        record = decoder.decode(message.data)
    except (msgspec.MsgspecError, ValueError, TypeError) as exc:
        return None, f"does not decode: {str(exc)[:200]}"
    if record.id != erasure_id:
        return None, f"holds the record of another erasure id ({record.id[:40]!r})"
    return record, ""
