"""How many bytes a tenant's events take in the stream, counted the way JetStream counts them.

A file-store message takes ``34 + subject + headers + payload`` bytes when it
has headers (22 bytes of record head, 4 of header length, 8 of checksum), the
measure of the stream's ``bytes`` and of its ``max_bytes``. The count reads
the tenant's messages with batched direct gets (the reads' own permission,
no consumer left on the server), from a stream position on, so a tally can
be brought up to date by reading only what was appended since.

What a writer sends is counted the same way as it sends it (`SessionWriter.appended`:
``34 + subject + header block + payload`` per message), and `UsageTallies` keeps
each tenant's total in a key-value bucket every service instance shares.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated

import msgspec
import nats.errors
import nats.js.errors

from convmem.adapters.backends.jetstream._appends import EXPECTED
from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage
from convmem.adapters.backends.jetstream._read import fetch_batch, list_subjects
from convmem.adapters.backends.jetstream._setup import ensure_bucket
from convmem.adapters.backends.jetstream._watch import publish_denied
from convmem.errors import ConvmemError
from convmem.events import decode_token, encode_token

_log = logging.getLogger("convmem.jetstream")
_PROBE = "convmem.probe"
"""The key `UsageTallies.prepare` reads to see that the bucket answers (whether it holds one or not)."""

__all__ = ["RECORD", "UsageTallies", "count_bytes", "header_size", "stored_size", "usage_bucket"]

RECORD = 34
"""Bytes a file-store message with headers takes besides its subject, headers and payload."""
_ADDED_BY_GET = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
    }
)
"""Headers a direct get adds to the stored message (not part of what is stored)."""
_STATUS_LINE = len(b"NATS/1.0\r\n")


def header_size(headers: dict[str, str]) -> int:
    """The bytes of a header block as nats-py sends it and a file store keeps it (0: no headers)."""
    if not headers:
        return 0
    return _STATUS_LINE + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()) + 2


def stored_size(message: StoredMessage) -> int:
    """The bytes `message` takes in a file store (its headers as stored, without the direct get's)."""
    headers = [(k, v) for k, v in message.headers.items() if k not in _ADDED_BY_GET]
    header_bytes = _STATUS_LINE + sum(len(k) + len(v) + 4 for k, v in headers) + 2 if headers else 0
    record = RECORD if headers else RECORD - 4
    return record + len(message.subject.encode()) + header_bytes + len(message.data)


async def count_bytes(
    conn: NatsConnection, stream: str, subject_filter: str, *, after: int = 0, batch: int = 2048
) -> tuple[int, int, bool]:
    """One batch of a count: (bytes of the messages on `subject_filter` past stream position `after`,
    the last position read (`after` when none), whether no message is left past it)."""
    got = await fetch_batch(conn, stream, subject_filter, start=after + 1, batch=batch)
    total = sum(stored_size(message) for message in got.messages)
    last = max((message.seq for message in got.messages), default=after)
    return total, max(last, after), got.pending == 0 or not got.messages


def usage_bucket(stream: str) -> str:
    """The key-value bucket of the tenants' shared byte tallies beside the events stream `stream`."""
    return f"{stream}_USAGE"


_WRONG_LAST = (10071, 10164)
"""A conditional put refused: another process wrote the key since the revision given."""


class UsageTallies:
    """Each tenant's byte tally shared by every service instance of a stream: one key per tenant in a
    key-value bucket of its own (``<stream>_USAGE``), made on first use. A value is the tenant's
    stored bytes as the instances know them and the events stream's position it counts through
    (``{"bytes": n, "at": p}``); a value behind a position this process read or put, or, at its
    first read here, with events of the tenant past it, is stale: read as none (a full count makes
    it again). Every change is a conditional put on the revision read, so two instances adding their
    writes at once both count. A key the bucket's stream counts a message for but serves none of (a
    damaged block) is never put to (the put would be stored but never answered): that tenant's tally
    is kept by this instance (`_keep_here`). On the connection's loop (the log's `*_here` calls)."""

    def __init__(
        self,
        conn: NatsConnection,
        bucket: str,
        *,
        replicas: int,
        position: Callable[[], Awaitable[int]] | None = None,
        events_past: Callable[[str, int], Awaitable[bool]] | None = None,
    ) -> None:
        self._conn = conn
        self._bucket = bucket
        self._replicas = replicas
        self._position = position  # the events stream's last position: what a put's value counts through
        self._events_past = events_past  # (tenant, position) -> whether it has events past the position
        self._seen_at: dict[str, int] = {}  # tenant -> the latest position of a value read or put here
        self._opened = False
        self._unreadable: dict[str, int] = {}  # tenant -> revision of a value read that is no tally
        self._damaged: dict[str, tuple[int, int] | None] = {}  # tenant -> its tally kept here instead

    async def _open(self) -> None:
        if not self._opened:
            await ensure_bucket(self._conn, self._bucket, replicas=self._replicas)
            self._opened = True

    def _subject(self, tenant_id: str) -> str:
        return f"$KV.{self._bucket}.{encode_token(tenant_id)}"

    async def prepare(self, *, within: float) -> None:
        """Make the bucket if missing and wait, at most `within` seconds, until it answers a read.

        A service instance calls it before it takes requests: a replicated bucket made on the first
        write of a tenant answers no read until its replicas have chosen a leader (seconds in a
        cluster), and that first write would wait out its timeout (`tests/test_cluster.py`). A read
        that times out or finds no responder is tried again, pausing 50 ms, doubling to 1 s.
        """
        await self._open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        pause = 0.05
        while True:
            try:
                await self._conn.get_message(f"KV_{self._bucket}", {"last_by_subj": self._subject(_PROBE)})
                return
            except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                failure: Exception = exc
            except nats.js.errors.ServiceUnavailableError as exc:
                failure = exc
            if loop.time() + pause >= deadline:
                raise failure
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def get(self, tenant_id: str) -> tuple[int, int] | None:
        """(the tenant's tallied bytes, the value's revision); None when no instance tallied it yet."""
        if tenant_id in self._damaged:
            return self._damaged[tenant_id]
        await self._open()
        subject = self._subject(tenant_id)
        message = await self._conn.get_message(f"KV_{self._bucket}", {"last_by_subj": subject})
        if message is None and await self._held(subject):  # first put by another instance meanwhile?
            message = await self._conn.get_message(f"KV_{self._bucket}", {"last_by_subj": subject})
            if message is None:  # counted by the stream, served by none: a damaged store
                self._keep_here(tenant_id)
                return None
        if message is None:
            self._unreadable.pop(tenant_id, None)
            return None
        try:
            value = msgspec.json.decode(message.data, type=_Value) if message.data else None
        except msgspec.DecodeError:  # not JSON, or not a tally of ours (an operator's put)
            _log.warning(
                "the byte tally of tenant %r in bucket %r is not a tally (%d bytes): counted again in full",
                tenant_id,
                self._bucket,
                len(message.data),
            )
            value = None
        if value is not None and await self._stale(tenant_id, value):
            value = None
        if value is None:  # none, as far as a tally goes (a delete or purge marker, not a tally, stale)
            self._unreadable[tenant_id] = message.seq  # what a first put replaces
            return None
        self._unreadable.pop(tenant_id, None)
        self._seen_at[tenant_id] = max(self._seen_at.get(tenant_id, 0), value.at)
        return value.stored, message.seq

    async def _stale(self, tenant_id: str, value: _Value) -> bool:
        """Whether `value` is older than what is known of the tenant: its position is behind a value
        this process read or put (it went back: a truncated or restored bucket), or, at the first read
        here, the tenant has events past it (written after it by an instance that has not added them
        yet or never will: one that died, or a value that went back before this process started).
        Either way the tenant is counted again in full before it is admitted on a tally."""
        seen = self._seen_at.get(tenant_id)
        if seen is not None:
            if value.at >= seen:
                return False
            _log.warning(
                "the byte tally of tenant %r in bucket %r went back (it counts through position %d of "
                "the events, a value read or written here through %d: a truncated or restored bucket): "
                "counted again in full",
                tenant_id,
                self._bucket,
                value.at,
                seen,
            )
            return True
        if self._events_past is None or not await self._events_past(tenant_id, value.at):
            return False
        _log.info(
            "the byte tally of tenant %r in bucket %r counts through position %d of the events and "
            "the tenant has events past it: counted again in full",
            tenant_id,
            self._bucket,
            value.at,
        )
        return True

    async def put(self, tenant_id: str, value: int, revision: int) -> int | None:
        """Store `value` if the tenant's tally is still at `revision` (0: none yet); its new revision,
        or None when another instance changed it first."""
        if tenant_id in self._damaged:  # its key is damaged: the tally is this instance's own
            held = self._damaged[tenant_id]
            if (held[1] if held is not None else 0) != revision:
                return None
            self._damaged[tenant_id] = (value, revision + 1)
            return revision + 1
        await self._open()
        subject = self._subject(tenant_id)
        if revision == 0:  # "none yet": over a value that is no tally, as last read, if any
            revision = self._unreadable.get(tenant_id, 0)
        at = await self._position() if self._position is not None else 0  # after the revision was read
        try:
            ack = await publish_denied(  # a refused subject fails now, named
                self._conn.js,
                self._conn.watch,
                subject,
                msgspec.json.encode(_Value(stored=value, at=at)),
                {EXPECTED: str(revision)},
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST:
                return None
            raise
        self._unreadable.pop(tenant_id, None)
        self._seen_at[tenant_id] = max(self._seen_at.get(tenant_id, 0), at)
        return int(ack.seq)

    async def damaged(self) -> list[str]:
        """The tenants whose tally key the bucket's stream counts a message for but serves none of (a
        damaged block: see `_keep_here`); none when the bucket is missing. One request, then one read
        a tenant (`convmem verify --all`)."""
        prefix = f"$KV.{self._bucket}."
        try:
            subjects = await list_subjects(self._conn, f"KV_{self._bucket}", f"{prefix}>")
        except nats.js.errors.APIError as exc:
            if exc.err_code == 10059:  # stream not found: no tally was ever kept
                return []
            raise
        damaged: list[str] = []
        for subject, count in sorted(subjects.items()):
            if count > 0 and subject != f"{prefix}{_PROBE}":
                message = await self._conn.get_message(f"KV_{self._bucket}", {"last_by_subj": subject})
                if message is None:
                    token = subject[len(prefix) :]
                    try:
                        damaged.append(decode_token(token))
                    except ConvmemError:  # a key no tally of ours was put on: named as it is
                        damaged.append(token)
        return damaged

    async def _held(self, subject: str) -> bool:
        """Whether the bucket's stream counts a message on `subject` (one request, nothing read)."""
        return (await list_subjects(self._conn, f"KV_{self._bucket}", subject)).get(subject, 0) > 0

    def _keep_here(self, tenant_id: str) -> None:
        """The tenant's key holds a message the server counts but serves none of (a damaged block):
        a conditional put on it is stored but never acknowledged, so every write of the tenant would
        wait out its timeout. Its tally is kept by this instance instead (made by a full count, as a
        fresh tenant's), and the operator told how to repair the bucket."""
        _log.warning(
            "the byte tally of tenant %r in bucket %r is damaged (the stream holds a message for it "
            "but serves none): this instance counts the tenant in full and keeps its tally itself, "
            "seeing other instances' writes at its full counts; repair: nats stream purge KV_%s "
            "(every tally is counted again in full), then restart the service instances",
            tenant_id,
            self._bucket,
            self._bucket,
        )
        self._damaged[tenant_id] = None


class _Value(msgspec.Struct):
    stored: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(name="bytes")
    at: Annotated[int, msgspec.Meta(ge=0)] = 0
    """The events stream's last position when the value was put: the tenant's events up to it are
    in the value, except those of instances that have not added theirs yet (0: a value written
    before positions were kept)."""
