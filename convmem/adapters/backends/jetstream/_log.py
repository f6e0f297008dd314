"""`EventLog` on a NATS JetStream stream: one subject per session.

The stream (file storage) holds every session's events on
``{prefix}.{tenant}.{user}.{session}``, the tokens being `MemoryKey.tokens()`
so no id can reach another session's subject. Writes go through
`SessionWriter` on the connection's loop; reads use batched direct gets, so
they leave no consumer behind on the server. Every blocking call waits at
most the connection's timeout and raises `LogUnavailable` past it.

On a single server, durability rests on the server's ``sync_interval``
(`EmbeddedNatsServer` uses ``always``); with ``replicas=3`` on a cluster an
acknowledged event survives the loss of a server. Direct gets may be served
by a replica that lags the leader by a moment; appends are checked by the
leader, so a stale read costs a `ConcurrencyConflict`, never a lost update.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import re
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from convmem.actors import ErasureNotice, LoggedEvent, Settle, Unwatch
from convmem.actors._bounds import MAX_QUEUED, MAX_REPLICAS, check_count, check_seconds
from convmem.adapters._loop_thread import wait
from convmem.adapters.backends._checksum import SUM_HEADER
from convmem.adapters.backends.jetstream._appends import HEADER_ROOM, too_large
from convmem.adapters.backends.jetstream._connection import (
    DEFAULT_MAX_CONTROL_LINE,
    NatsConnection,
    log_error,
)
from convmem.adapters.backends.jetstream._journal import JetStreamErasureJournal, erasure_bucket
from convmem.adapters.backends.jetstream._read import (
    MSG_ID,
    SubjectKeys,
    fetch_batch,
    list_subjects,
    newest_subjects,
    read_range,
    unreadable,
)
from convmem.adapters.backends.jetstream._sealing import Sealing
from convmem.adapters.backends.jetstream._setup import (
    check_exists,
    check_names,
    ensure_stream,
    setup_wait,
    subject_pattern,
)
from convmem.adapters.backends.jetstream._usage import UsageTallies, count_bytes, usage_bucket
from convmem.adapters.backends.jetstream._write import PendingAppend, SessionWriter
from convmem.adapters.backends.keys import Keyring
from convmem.errors import (
    ConvmemError,
    InvalidInput,
    LogUnavailable,
    PermissionDenied,
    SessionClosed,
    StoreNotFound,
    WrongThread,
)
from convmem.events import Event, MemoryKey

__all__ = ["DEFAULT_PREFIX", "DEFAULT_STREAM", "JetStreamEventLog", "stream_not_found"]

T = TypeVar("T")

_HEADER_SAFE = re.compile(r"^(?=\S)[^\x00-\x1f\x7f]*(?<=\S)$")

_APPENDING_CACHE = 8_192  # keys whose subject and error label are kept (then the cache starts over)

_log = logging.getLogger("convmem.jetstream")

DEFAULT_STREAM = "CONVMEM_EVENTS"
DEFAULT_PREFIX = "convmem.ev"


def stream_not_found(stream: str) -> StoreNotFound:
    """A reader's error for a store without the events stream `stream` (and nothing else of convmem's)."""
    return StoreNotFound(
        f"the NATS server has no stream {stream!r}: nothing was stored there yet "
        "(or the events live under another --stream name)",
        name=stream,
    )


class JetStreamEventLog:
    """The durable `EventLog`: a JetStream stream with one subject per session."""

    def __init__(
        self,
        connection: NatsConnection,
        *,
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        read_batch: int = 2048,
        create: bool = True,
        keyring: Keyring | None = None,
        journal_bucket: str | None = None,
        keys_missing: str | None = None,
        absent_ok: bool = False,
    ) -> None:
        """Use an open connection (leased until `close`); creates or checks the stream.

        With a `keyring`, every event is stored sealed with its user's data key
        (encryption at rest, `convmem.adapters.backends.keys`) and `erase_user` deletes
        the user's keys first; without one, events are stored plain and sealed
        events already stored raise `EncryptionKeyError` when read.
        `keys_missing` says why there is no `keyring` though a master key is given (a reader
        whose key store is gone): a sealed event then says so rather than "no master key".
        `journal_bucket` names the erasure journal's bucket (default ``<stream>_ERASURES``),
        opened on first use (`erasure_journal`).

        `duplicate_window` (seconds) must outlast any retry of an append;
        `read_batch` is how many messages one read request brings back. With
        `create` False (readers: audits) the stream is never created or
        checked, and a missing one is `StoreNotFound`; or, with `absent_ok`, a log that reads
        as empty (`stream_absent`), for a caller that asks the rest of the store whether that
        is damage (`history_lost`, as `JetStreamBackend` does).
        """
        check_names(stream=stream, prefix=prefix)
        check_count("replicas", replicas, most=MAX_REPLICAS)
        check_seconds("duplicate_window", duplicate_window)  # at most a day (the server's ns must fit)
        check_count("read_batch", read_batch, most=MAX_QUEUED)  # messages one read holds in memory
        connection.lease()
        self._conn = connection
        self._stream = stream
        self._keys = SubjectKeys(prefix)
        self._sealing = Sealing(keyring, keys_missing)
        self._writer = SessionWriter(connection, stream)
        self._writer.opener = lambda message: self._sealing.message_data(
            message, self._keys.key(message.subject)
        )
        self._read_batch = read_batch
        self._tallies_erasures: Callable[[str], bool] | None = None  # `tally_erasures`
        self._closed = False
        self._close_lock = threading.Lock()
        self._appending: dict[MemoryKey, tuple[str, str]] = {}
        self._journal_bucket = journal_bucket if journal_bucket is not None else erasure_bucket(stream)
        self._journal_settings = (replicas, create)
        self._journal: JetStreamErasureJournal | None = None
        self._journal_opened = False
        self._journal_lock = threading.Lock()
        self._tallies = UsageTallies(
            connection,
            usage_bucket(stream),
            replicas=replicas,
            position=self._stream_last_seq,
            events_past=self._events_past,
        )
        self._absent = False
        self.history_lost: str | None = None
        """Why the log holds none of its sessions' history though the rest of the store shows it
        had some (its stream is gone: `JetStreamBackend` sets it for a reader); None otherwise."""
        self.journal_lost: str | None = None
        """Why the erasure journal's bucket, missing when `JetStreamBackend` opened, was lost."""
        try:
            if create:
                connection.call(
                    lambda: ensure_stream(
                        connection, stream, prefix, replicas=replicas, duplicate_window=duplicate_window
                    ),
                    what=f"checking stream {stream!r}",
                    timeout=setup_wait(connection),
                )
            elif not connection.call(
                lambda: check_exists(connection, stream),
                what=f"finding {stream!r}",
                timeout=setup_wait(connection),
            ):
                if not absent_ok:
                    raise stream_not_found(stream)
                self._absent = True
        except BaseException:
            self.close()
            raise

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        timeout: float = 5.0,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
    ) -> JetStreamEventLog:
        """Connect to the NATS server at `url`; the log owns the connection and closes it.

        `LogUnavailable` when nothing answers there (or without JetStream).
        """
        check_count("replicas", replicas, most=MAX_REPLICAS)  # its numbers before anything connects
        check_seconds("duplicate_window", duplicate_window)
        connection = NatsConnection.connect(url, timeout=timeout, max_control_line=max_control_line)
        try:
            return cls(
                connection, stream=stream, prefix=prefix, replicas=replicas, duplicate_window=duplicate_window
            )
        finally:
            connection.release()  # the log holds its own lease from here on

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def stream_absent(self) -> bool:
        """Whether the stream did not exist when this reader opened (`absent_ok`): it reads as empty."""
        return self._absent

    @property
    def subjects(self) -> str:
        """The stream's subject pattern."""
        return subject_pattern(self._keys.prefix)

    def subject(self, key: MemoryKey) -> str:
        """The subject that holds `key`'s events."""
        return self._keys.subject(key)

    def _open_subject(self, key: MemoryKey, *, publish: bool) -> str:
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        subject = self._keys.subject(key)
        if publish:
            self._conn.check_subject(subject, key)
        return subject

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        """See `EventLog.append`. Several events are stored as one atomic batch."""
        if self._conn.on_loop_thread():
            raise WrongThread(
                f"a blocking append to {key} was made on the NATS connection's event loop thread, where "
                "it would deadlock; use the AsyncSessionHandle there (or asyncio.to_thread)"
            )
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        pending = self._pending(key, events, expected_seq, done)
        if pending is None:
            return self.last_seq(key)
        self._start(pending)
        return wait(done, timeout=self._conn.timeout, what=pending.what)

    def start_append(
        self,
        key: MemoryKey,
        events: Sequence[Event],
        *,
        expected_seq: int,
        settle: Settle[int],
    ) -> None:
        """See `LoopEventLog.start_append`: from any thread; `settle` is settled on the connection's loop."""
        pending = self._pending(key, events, expected_seq, settle)
        if pending is None:
            raise InvalidInput("events", "an append needs at least one event")
        self._start(pending)

    def _start(self, pending: PendingAppend) -> None:
        """Start `pending` on the loop, in a batch with other appends posted meanwhile.

        On the loop itself, an append the fast path takes at once is sent right here (no task).
        """
        writer = self._writer
        if not self._conn.on_loop_thread():
            self._conn.post(lambda: writer.start_append(pending), pending.done, what=pending.what)
            return
        if not pending.done.set_running_or_notify_cancel():
            return  # its caller stopped waiting
        try:
            if writer.start_now(pending):
                return
        except BaseException as exc:
            pending.done.set_exception(log_error(exc, pending.what))
            return
        self._conn.start_here(lambda: writer.start_append(pending), pending.done, what=pending.what)

    def on_loop_thread(self) -> bool:
        """See `LoopEventLog.on_loop_thread`."""
        return self._conn.on_loop_thread()

    def _pending(
        self,
        key: MemoryKey,
        events: Sequence[Event],
        expected_seq: int,
        done: Settle[int],
    ) -> PendingAppend | None:
        """The checked append, encoded; None when there is nothing to append."""
        subject, what = self._open_for_append(key)
        events = tuple(events)
        if not events:
            return None
        for offset, event in enumerate(events):
            if event.seq != expected_seq + 1 + offset:
                raise InvalidInput(
                    f"events[{offset}].seq", f"is {event.seq}, expected {expected_seq + 1 + offset}"
                )
            if not _HEADER_SAFE.match(event.event_id):
                raise InvalidInput(
                    f"events[{offset}].event_id",
                    f"{event.event_id[:80]!r} must be non-empty, without control characters or "
                    "surrounding whitespace (it travels as the Nats-Msg-Id header)",
                )
        payloads = self._sealing.payloads(key, events)
        limit = self._conn.nc.max_payload - HEADER_ROOM
        for offset, payload in enumerate(payloads):
            if len(payload) > limit:
                raise too_large(events[offset], offset, len(payload), self._conn.nc.max_payload)
        return PendingAppend(key, subject, events, payloads, expected_seq, done, what)

    def _open_for_append(self, key: MemoryKey) -> tuple[str, str]:
        """The key's subject, checked for publishing, and how errors name an append to it (cached)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        known = self._appending.get(key)
        if known is None:
            if len(self._appending) >= _APPENDING_CACHE:
                self._appending.clear()
            known = self._appending[key] = (self._open_subject(key, publish=True), f"append to {key}")
        return known

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

        `checksum` and `event_id` go in the ``Convmem-Sum`` and ``Nats-Msg-Id`` headers when given.
        """
        subject = self._open_subject(key, publish=True)
        headers = {SUM_HEADER: checksum} if checksum is not None else {}
        if event_id is not None:
            headers[MSG_ID] = event_id
        return self._conn.call(
            lambda: self._writer.append_raw(subject, data, seq, headers), what=f"raw append to {key}"
        )

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        """See `EventLog.read`. Messages the server holds after the last one read but cannot serve
        (damaged on disk) are one record at the end, with `damage` set, position 0 and the seq the
        first of them would have."""
        subject = self._open_subject(key, publish=False)
        if self._absent:
            return []
        messages, unread = self._conn.call(
            lambda: self._writer.read_counted(subject, after_seq), what=f"read {key}"
        )
        record = self._sealing.record
        everything = [record(m, key) for m in messages]
        records = [r for r in everything if r.seq is None or r.seq > after_seq]
        if unread:
            last = next((r for r in reversed(everything) if r.seq is not None), None)
            records.append(unreadable(key, unread, last))
        return records

    def last_seq(self, key: MemoryKey) -> int:
        """See `EventLog.last_seq`."""
        subject = self._open_subject(key, publish=False)
        if self._absent:
            return 0
        return self._conn.call(lambda: self._writer.load_last(subject), what=f"last seq of {key}").seq

    def known_position(self, key: MemoryKey, seq: int, event_id: str) -> int | None:
        """The stream position of `key`'s event at `seq` (the one of `event_id`) when this log wrote or
        read it last, from what its writer keeps of the session (no request); None when it keeps
        nothing of it, or the session's last message is another event."""
        if self._closed or self._absent:
            return None
        last = self._writer.known(self._keys.subject(key))
        if last is None or last.seq != seq or last.stream_seq <= 0:
            return None
        if event_id and last.event_id is not None and last.event_id != event_id:
            return None
        return last.stream_seq

    def log_position(self) -> int:
        """See `LogPositions`: the stream's last sequence (deleting messages never lowers it)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        if self._absent:
            return 0
        return self._conn.call(self._stream_last_seq, what=f"info of stream {self._stream!r}")

    def read_all(
        self,
        *,
        tenant_id: str | None = None,
        user_id: str | None = None,
        until_position: int | None = None,
    ) -> Iterator[LoggedEvent]:
        """See `EventLog.read_all`. Ends at the stream's last message when iteration starts.

        One batch is read ahead while the caller consumes the last one.
        """
        if user_id is not None and tenant_id is None:
            raise InvalidInput("user_id", "reading one user's events needs tenant_id too")
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        if self._absent:
            return
        end = self._conn.call(self._stream_last_seq, what=f"info of stream {self._stream!r}")
        if until_position is not None:
            end = min(end, until_position)
        subjects = self._keys.filter(tenant_id, user_id)
        if subjects is None:
            return
        yield from read_range(
            self._conn,
            self._stream,
            self._keys,
            subjects,
            end,
            batch=self._read_batch,
            record=self._sealing.record,
        )

    def keys(self, *, tenant_id: str | None = None, user_id: str | None = None) -> list[MemoryKey]:
        """See `EventLog.keys`. From the stream's per-subject counts; no message is read."""
        return list(self.counts(tenant_id=tenant_id, user_id=user_id))

    def counts(self, *, tenant_id: str | None = None, user_id: str | None = None) -> dict[MemoryKey, int]:
        """How many messages each session holds (of a tenant, of a user), in key order; none is read."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        subject_filter = self._keys.filter(tenant_id, user_id)
        if subject_filter is None or self._absent:
            return {}
        subjects = self._conn.call(lambda: self._subjects(subject_filter), what="list session subjects")
        counted = ((self._keys.key(s), n) for s, n in sorted(subjects.items()))
        return {k: n for k, n in counted if k is not None}

    def newest_keys(self, keys: Sequence[MemoryKey], *, limit: int) -> list[MemoryKey]:
        """The `limit` of `keys` written most recently, newest first (by the stream position of each
        one's last message: `newest_subjects`, one request per 1,024 keys); keys with no event are
        left out."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        if self._absent or limit <= 0:
            return []
        subjects = [self._keys.subject(key) for key in keys]
        newest = self._conn.call(
            lambda: newest_subjects(self._conn, self._stream, subjects, limit),
            what="find the sessions written most recently",
        )
        return [key for key in map(self._keys.key, newest) if key is not None]

    def stored_bytes(self, tenant_id: str, *, after_position: int = 0) -> tuple[int, int]:
        """(bytes the tenant's events past `after_position` take in the stream, the last position read).

        Counted as JetStream counts a message against ``max_bytes`` (see `_usage`);
        reads the messages, so a tally is kept up to date from the last position.
        """
        subject_filter = self._tenant_filter(tenant_id)
        total, position, done = 0, after_position, False
        while subject_filter is not None and not done:  # one batch a call: a large tenant takes longer
            counted, position, done = self._conn.call(
                self._count_batch(subject_filter, position), what=f"count the bytes of tenant {tenant_id!r}"
            )
            total += counted
        return total, position

    async def stored_bytes_here(self, tenant_id: str, *, after_position: int = 0) -> tuple[int, int]:
        """`stored_bytes`, awaited on the connection's own loop (`on_loop_thread`)."""
        subject_filter = self._tenant_filter(tenant_id)
        total, position, done = 0, after_position, False
        while subject_filter is not None and not done:
            try:
                counted, position, done = await self._count_batch(subject_filter, position)()
            except Exception as exc:  # nats-py's failures as `call` reports them: LogUnavailable
                error = log_error(exc, f"count the bytes of tenant {tenant_id!r}")
                if error is exc:
                    raise
                raise error from None
            total += counted
        return total, position

    def all_stored_bytes(self) -> int:
        """The bytes the whole stream holds, as JetStream counts them against ``max_bytes``: no
        tenant's `stored_bytes` is more. One request, no message read (a bound a service admits a
        tenant's writes on while its first count runs)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        return self._conn.call(self._stream_bytes, what=f"info of stream {self._stream!r}")

    async def all_stored_bytes_here(self) -> int:
        """`all_stored_bytes`, awaited on the connection's own loop (`on_loop_thread`)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        try:
            return await self._stream_bytes()
        except Exception as exc:  # nats-py's failures as `call` reports them: LogUnavailable
            error = log_error(exc, f"info of stream {self._stream!r}")
            if error is exc:
                raise
            raise error from None

    async def _stream_bytes(self) -> int:
        info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._stream}")
        state = info.get("state") if isinstance(info, dict) else None
        value = state.get("bytes") if isinstance(state, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LogUnavailable(f"stream {self._stream!r}: its info holds no byte count (bytes: {value!r})")
        return value

    def appended_bytes(self, tenant_id: str) -> int:
        """The bytes this log sent for `tenant_id`'s events since it opened, as the stream stores them
        (counted as each append goes out: one refused or lost stays counted). Any thread."""
        return self._writer.appended.get(tenant_id, 0)

    def usage_tally(self, tenant_id: str) -> tuple[int, int] | None:
        """The tenant's byte tally shared by the service instances of this stream (`UsageTallies`):
        (bytes, revision), or None when none was recorded."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        return self._conn.call(
            lambda: self._tallies.get(tenant_id), what=f"read the byte tally of {tenant_id!r}"
        )

    async def usage_tally_here(self, tenant_id: str) -> tuple[int, int] | None:
        """`usage_tally`, awaited on the connection's own loop (`on_loop_thread`)."""
        return await self._here(self._tallies.get(tenant_id), f"read the byte tally of {tenant_id!r}")

    def damaged_usage_tallies(self) -> list[str]:
        """The tenants whose byte tally the bucket counts but serves none of (`UsageTallies.damaged`)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        return self._conn.call(self._tallies.damaged, what="check the byte tallies' bucket")

    @property
    def usage_bucket(self) -> str:
        """The stream of the tenants' shared byte tallies (``KV_<stream>_USAGE``)."""
        return f"KV_{usage_bucket(self._stream)}"

    def prepare_usage_tallies(self, *, within: float) -> None:
        """Make the shared byte tallies' bucket if missing, wait until it answers (`UsageTallies.prepare`)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        self._conn.call(
            lambda: self._tallies.prepare(within=within),
            what="prepare the byte tallies' bucket",
            timeout=within + self._conn.timeout,
        )

    async def prepare_usage_tallies_here(self, *, within: float) -> None:
        """`prepare_usage_tallies`, awaited on the connection's own loop (`on_loop_thread`)."""
        await self._here(self._tallies.prepare(within=within), "prepare the byte tallies' bucket")

    def put_usage_tally(self, tenant_id: str, value: int, revision: int) -> int | None:
        """Record `value` as the tenant's shared byte tally if it is still at `revision` (0: none yet);
        its new revision, or None when another instance changed it first."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        return self._conn.call(
            lambda: self._tallies.put(tenant_id, value, revision),
            what=f"record the byte tally of {tenant_id!r}",
        )

    async def put_usage_tally_here(self, tenant_id: str, value: int, revision: int) -> int | None:
        """`put_usage_tally`, awaited on the connection's own loop (`on_loop_thread`)."""
        return await self._here(
            self._tallies.put(tenant_id, value, revision), f"record the byte tally of {tenant_id!r}"
        )

    async def _here(self, work: Coroutine[Any, Any, T], what: str) -> T:
        """Await `work` on the connection's loop, its failures reported as `call` reports them."""
        if self._closed:
            work.close()
            raise SessionClosed("the JetStream event log is closed")
        try:
            return await work
        except Exception as exc:  # nats-py's failures as `call` reports them: LogUnavailable
            error = log_error(exc, what)
            if error is exc:
                raise
            raise error from None

    def _tenant_filter(self, tenant_id: str) -> str | None:
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        return self._keys.filter(tenant_id, None)

    def _count_batch(
        self, subject_filter: str, after: int
    ) -> Callable[[], Coroutine[Any, Any, tuple[int, int, bool]]]:
        return lambda: count_bytes(self._conn, self._stream, subject_filter, after=after)

    async def _events_past(self, tenant_id: str, position: int) -> bool:
        """Whether the stream holds an event of `tenant_id` past `position` (one message read at most)."""
        subject_filter = self._tenant_filter(tenant_id)
        if subject_filter is None:
            return False
        got = await fetch_batch(self._conn, self._stream, subject_filter, start=position + 1, batch=1)
        return bool(got.messages)

    async def _stream_last_seq(self) -> int:
        info = await self._conn.api(f"$JS.API.STREAM.INFO.{self._stream}")
        return int(info["state"]["last_seq"])

    async def _subjects(self, subject_filter: str) -> dict[str, int]:
        return await list_subjects(self._conn, self._stream, subject_filter)

    def erase(self, key: MemoryKey, *, at: float) -> int:
        """See `EventLog.erase`: the messages are erased on disk, then every watcher is told."""
        erased = self._erase(key, at)
        if erased is not None:
            self._notify(ErasureNotice.of_sessions([key], tallied=self._tallied(key.tenant_id)))
        return erased or 0

    def erased_bytes(self, tenant_id: str) -> int:
        """The bytes of `tenant_id`'s messages this log erased (or is erasing) since it opened, as the
        stream stores them (`SessionWriter.erased`: each counted as its delete is sent, taken back
        when another eraser had deleted it). Any thread."""
        return self._writer.erased.get(tenant_id, 0)

    def tally_erasures(self, tallied: Callable[[str], bool]) -> None:
        """`tallied(tenant_id)` (any thread): whether a byte tally in this process takes what this log
        erases of the tenant off the shared tally (a service instance's `TenantUsage`); the notices of
        its erasures then say so (`ErasureNotice.tallied`), and no instance counts the tenant again."""
        self._tallies_erasures = tallied

    def _tallied(self, tenant_id: str) -> bool:
        return self._tallies_erasures is not None and self._tallies_erasures(tenant_id)

    @property
    def keyring(self) -> Keyring | None:
        """The keyring that seals this log's events (None: stored plain)."""
        return self._sealing.keyring

    def shred_user(self, tenant_id: str, user_id: str) -> list[str]:
        """Delete the user's data keys: every sealed event and snapshot of theirs, in every copy
        of the store, reads as erased from now on. The ids of the keys deleted (none without a keyring)."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        keyring = self._sealing.keyring
        return [] if keyring is None else keyring.shred(tenant_id, user_id)

    def erase_user(self, tenant_id: str, user_id: str, *, at: float) -> int:
        """See `EventLog.erase_user`. The user's data keys are deleted first (`shred_user`)."""
        self.shred_user(tenant_id, user_id)
        erased = [self._erase(key, at) for key in self.keys(tenant_id=tenant_id, user_id=user_id)]
        if any(n is not None for n in erased):
            self._notify(ErasureNotice.of_user(tenant_id, user_id, tallied=self._tallied(tenant_id)))
        return sum(n or 0 for n in erased)

    def drop_before(self, key: MemoryKey, *, seq: int) -> int:
        """See `EventLog.drop_before`: the messages before the compaction are erased on disk."""
        subject = self._open_subject(key, publish=True)
        return self._conn.call(
            lambda: self._writer.drop_before(key, subject, seq), what=f"drop events of {key} before seq {seq}"
        )

    def _erase(self, key: MemoryKey, at: float) -> int | None:
        """Erase one session (see `SessionWriter.erase`); None when it had no message."""
        subject = self._open_subject(key, publish=True)
        return self._conn.call(lambda: self._writer.erase(key, subject, at), what=f"erase {key}")

    @property
    def notices(self) -> str:
        """The subject erasure notices travel on (core NATS: nothing of them is stored)."""
        return f"{self._keys.prefix}.erasures"

    def announce(self, notice: ErasureNotice) -> None:
        """See `ErasureWatch.announce`: published to every process watching this stream."""
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")
        self._notify(notice)

    def _notify(self, notice: ErasureNotice) -> None:
        data = notice.encode()

        async def publish() -> None:
            await self._conn.nc.publish(self.notices, data)
            await self._conn.nc.flush(timeout=max(1, int(self._conn.timeout)))

        self._conn.call(publish, what="tell other processes of an erasure")

    def watch_erasures(self, on_notice: Callable[[ErasureNotice | None], None]) -> Unwatch:
        """See `ErasureWatch`: notices of every process on this stream, and None after a reconnection.

        On the connection's own loop thread (a system made by `connect_here`)
        the subscription is made without waiting for it.
        """
        if self._closed:
            raise SessionClosed("the JetStream event log is closed")

        async def on_message(msg: Msg) -> None:
            try:
                notice = ErasureNotice.decode(msg.data)
            except msgspec.DecodeError:
                _log.warning("ignoring a message on %s that is not an erasure notice", self.notices)
                return
            keyring = self._sealing.keyring
            if keyring is not None and notice.users:
                keyring.forget()  # another process shredded a user's keys: ask the key store again
            on_notice(notice)

        async def subscribe() -> Subscription:
            return await self._conn.nc.subscribe(self.notices, cb=on_message)

        made = self._conn.submit(subscribe, what="watch erasure notices")
        if not self._conn.on_loop_thread():
            wait(made, timeout=self._conn.timeout, what="watch erasure notices")
        stop_listening = self._conn.watch.on_reconnect(lambda: on_notice(None))

        def unwatch() -> None:
            stop_listening()
            if self._conn.closed or not made.done() or made.exception() is not None:
                return

            async def unsubscribe() -> None:
                with contextlib.suppress(nats.errors.Error):
                    await made.result().unsubscribe()

            with contextlib.suppress(ConvmemError):
                self._conn.submit(unsubscribe, what="stop watching erasure notices")

        return unwatch

    @property
    def journal_bucket(self) -> str:
        """The erasure journal's bucket name (made on first use)."""
        return self._journal_bucket

    def erasure_journal(self) -> JetStreamErasureJournal | None:
        """See `JournaledLog`: the journal bucket beside the stream, opened (made) on first use.

        None for a reader (`create` False) when the bucket is missing or these
        credentials may not see it.
        """
        with self._journal_lock:
            if not self._journal_opened:
                if self._closed:
                    raise SessionClosed("the JetStream event log is closed")
                replicas, create = self._journal_settings
                try:
                    self._journal = JetStreamErasureJournal(
                        self._conn, bucket=self._journal_bucket, replicas=replicas, create=create
                    )
                except (StoreNotFound, PermissionDenied):
                    if create:
                        raise
                    self._journal = None  # a reader of a store where nothing was erased, or not allowed
                self._journal_opened = True
            return self._journal

    def close(self) -> None:
        """See `EventLog.close`. Releases this log's share of the connection (and its journal's)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._journal_lock:
            if self._journal is not None:
                self._journal.close()
        self._conn.release()
