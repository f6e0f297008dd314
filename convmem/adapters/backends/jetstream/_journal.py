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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import msgspec
import nats.errors
import nats.js.errors

from convmem.actors import ErasureReceipt, ErasureRequest
from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage
from convmem.adapters.backends.jetstream._read import list_subjects
from convmem.adapters.backends.jetstream._setup import check_names, open_bucket
from convmem.adapters.backends.jetstream._watch import publish_denied
from convmem.errors import InvalidConfig, SessionClosed

__all__ = ["JetStreamErasureJournal", "erasure_bucket"]

T = TypeVar("T")

_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_ALREADY_THERE = (10071, 10164)
_GONE = (10057, 10043)  # "no message found", "sequence not found": erased already
_request = msgspec.msgpack.Decoder(ErasureRequest)
_receipt = msgspec.msgpack.Decoder(ErasureReceipt)


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
        """See `ErasureJournal.pending`."""
        found = self._read_all("pending", _request.decode)
        return sorted(found, key=lambda r: (r.at, r.id))

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
        """See `ErasureJournal.receipts`."""
        found = self._read_all("done", _receipt.decode)
        return sorted(found, key=lambda r: (r.completed_at, r.id))

    def _read_all(self, kind: str, decode: Callable[[bytes], T]) -> list[T]:
        self._check_open()

        async def read() -> list[T]:
            subjects = await list_subjects(self._conn, self._stream, f"$KV.{self._bucket}.{kind}.*")
            found: list[T] = []
            for subject in sorted(subjects):
                message = await self._get(subject)
                if message is None or not message.data:
                    continue
                try:
                    found.append(decode(message.data))
                except (msgspec.MsgspecError, ValueError, TypeError):
                    continue  # not a record convmem wrote: never acted upon
            return found

        return self._conn.call(read, what=f"read the erasure journal ({kind})")

    async def _put_once(self, subject: str, data: bytes) -> None:
        try:
            # A refused subject fails now, named.
            await publish_denied(self._conn.js, self._conn.watch, subject, data, {_EXPECTED: "0"})
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _ALREADY_THERE:  # recorded already (by us, retried, or another process)
                raise

    async def _erase(self, position: int) -> None:
        try:
            await self._conn.api(f"$JS.API.STREAM.MSG.DELETE.{self._stream}", {"seq": position})
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _GONE:  # erased meanwhile by another process finishing it
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
