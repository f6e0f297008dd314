"""Reading the events stream: batched direct gets, and stream messages as `LoggedEvent`s.

A batched direct get (nats-server 2.11+) asks for up to N messages of a
subject filter from a start sequence in one request; the server streams them
back and ends with an EOB status that says how many remain. It needs no
consumer on the server, so reading a session leaves nothing behind, and the
reader pulls one batch at a time, which bounds memory however slow the
caller is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

import msgspec
import nats.js.errors

from convmem.actors import LoggedEvent
from convmem.adapters._loop_thread import wait
from convmem.adapters.backends._checksum import check
from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage
from convmem.errors import InvalidKey, LogUnavailable
from convmem.events import MemoryKey

__all__ = [
    "MSG_ID",
    "MULTI_LAST_MOST",
    "SEQ_HEADER",
    "Batch",
    "SubjectKeys",
    "fetch_batch",
    "fetch_subject",
    "fetch_subject_counted",
    "list_subjects",
    "newest_subjects",
    "read_range",
    "session_seq",
    "tail_start",
    "to_logged",
    "unreadable",
    "unservable",
]

MSG_ID = "Nats-Msg-Id"
SEQ_HEADER = "Convmem-Seq"
"""The event's session sequence, written beside the bytes so readers need not decode them."""


class Batch(msgspec.Struct, frozen=True):
    """Messages of one direct get batch and how many matching messages remain after them."""

    messages: list[StoredMessage]
    pending: int


async def fetch_batch(
    conn: NatsConnection, stream: str, subject: str, *, start: int, batch: int, max_bytes: int = 8 << 20
) -> Batch:
    """Up to `batch` messages on `subject` (wildcards allowed) from stream sequence `start`."""
    request = {"seq": start, "next_by_subj": subject, "batch": batch, "max_bytes": max_bytes}
    return await direct_batch(conn, stream, request)


async def direct_batch(conn: NatsConnection, stream: str, request: dict[str, object]) -> Batch:
    """The messages of one batched direct get (`request` as the server takes it); a status other
    than "end of batch" or "nothing matches" is an `APIError` with its code."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    messages: list[StoredMessage] = []

    nc = conn.nc

    def on_message(_subject: bytes, data: bytes, raw: bytes) -> None:  # as each is read: no Msg, no task
        headers = nc.headers_of(raw) or {}
        status = headers.get("Status")
        if status is None:
            messages.append(
                StoredMessage(
                    subject=headers.get("Nats-Subject", ""),
                    seq=int(headers.get("Nats-Sequence", "0")),
                    headers=headers,
                    data=data,
                )
            )
        elif not done.done():
            if status == "204":  # end of batch
                done.set_result(int(headers.get("Nats-Num-Pending", "0")))
            elif status == "404":  # nothing matches
                done.set_result(0)
            else:
                done.set_exception(
                    nats.js.errors.APIError(code=int(status), description=headers.get("Description"))
                )

    inbox = nc.new_inbox()
    sub = await nc.subscribe_direct(inbox, on_message)
    try:
        await conn.nc.publish(f"$JS.API.DIRECT.GET.{stream}", msgspec.json.encode(request), reply=inbox)
        try:
            pending = await asyncio.wait_for(done, conn.timeout)
        except TimeoutError:
            raise LogUnavailable(
                f"reading stream {stream!r} did not finish within {conn.timeout:g}s; "
                "is the stream's allow_direct on and the server up?"
            ) from None
    finally:
        await sub.unsubscribe()
    return Batch(messages, pending)


async def fetch_subject(
    conn: NatsConnection, stream: str, subject: str, *, start: int = 1
) -> list[StoredMessage]:
    """Every message of one subject (from stream sequence `start` on), in stream order."""
    return (await fetch_subject_counted(conn, stream, subject, start=start))[0]


async def fetch_subject_counted(
    conn: NatsConnection, stream: str, subject: str, *, start: int = 1
) -> tuple[list[StoredMessage], int]:
    """`fetch_subject`, and how many messages of the subject the server holds after the last one
    read but cannot serve (damaged on disk: a nats-server skips a message that fails its own
    checksum); 0 when none.

    A batch that says messages remain, followed by one that finds none, is the sign; so is a
    whole read that finds nothing (a new session's first read: one count more). Either is
    confirmed against the subject's message count before it is believed (an erasure deleting
    messages meanwhile gives the same sign).
    """
    out: list[StoredMessage] = []
    claimed = 0
    whole = start == 1
    while True:
        batch = await fetch_batch(conn, stream, subject, start=start, batch=10_000)
        out.extend(batch.messages)
        if not batch.messages and (claimed or (whole and not out)):  # (or is every message unreadable?)
            return out, await unservable(conn, stream, subject)
        if batch.pending == 0 or not batch.messages:
            return out, 0
        claimed = batch.pending
        start = batch.messages[-1].seq + 1


async def unservable(conn: NatsConnection, stream: str, subject: str) -> int:
    """How many messages the server counts on `subject` beyond those it serves."""
    info = await conn.api(f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subject})
    counted = int((info["state"].get("subjects") or {}).get(subject, 0))
    if not counted:
        return 0
    served = 0
    position = 1
    while True:
        batch = await fetch_batch(conn, stream, subject, start=position, batch=10_000)
        served += len(batch.messages)
        if batch.pending == 0 or not batch.messages:
            break
        position = batch.messages[-1].seq + 1
    return max(counted - served, 0)


async def tail_start(
    conn: NatsConnection, stream: str, subject: str, after_seq: int, last: StoredMessage
) -> int:
    """The stream sequence from which `subject` holds exactly its events of session seq above
    `after_seq` (`last` is the subject's last message); 1 when that cannot be told.

    A session's events are in session-seq order on its subject, so the first
    position whose next message on the subject is above `after_seq` is found
    by searching back from the end in growing steps, then by bisection: a few
    single-message gets, however long the history, instead of reading it all.
    A message without a session seq (not written by convmem) makes it read all.
    """
    last_seq = session_seq(last.headers)
    if after_seq <= 0 or last_seq is None:
        return 1
    if last_seq <= after_seq:
        return last.seq + 1

    async def next_seq(position: int) -> tuple[int, int] | None:
        found = await conn.get_message(stream, {"seq": position, "next_by_subj": subject})
        seq = session_seq(found.headers) if found is not None else None
        return None if found is None or seq is None else (found.seq, seq)

    hi, step, lo = last.seq, 4 * (last_seq - after_seq) + 16, 0
    while not lo:
        probe = max(1, hi - step)
        found = await next_seq(probe)
        if found is None:
            return 1
        if found[1] <= after_seq:
            lo = found[0] + 1
        elif probe == 1:
            return 1
        else:
            hi, step = probe, step * 4
    while lo < hi:
        mid = (lo + hi) // 2
        found = await next_seq(mid)
        if found is None:
            return 1
        if found[1] > after_seq:
            hi = mid
        else:
            lo = found[0] + 1
    return lo


def read_range(
    conn: NatsConnection,
    stream: str,
    keys: SubjectKeys,
    subject: str,
    end: int,
    *,
    batch: int = 2048,
    record: Callable[[StoredMessage, MemoryKey], LoggedEvent] | None = None,
) -> Iterator[LoggedEvent]:
    """Messages on `subject` up to stream sequence `end`, for a caller on another thread.

    One batch is read ahead while the caller consumes the last, so the loop
    stays busy but never holds more than two batches for a slow reader.
    """
    if end <= 0:
        return
    start = 1
    logged = to_logged if record is None else record

    def request(first: int) -> concurrent.futures.Future[Batch]:
        return conn.submit(
            lambda: fetch_batch(conn, stream, subject, start=first, batch=batch),
            what=f"reading stream {stream!r}",
        )

    future: concurrent.futures.Future[Batch] | None = request(start)
    try:
        while future is not None:
            got = wait(future, timeout=conn.timeout + 1.0, what=f"reading stream {stream!r}")
            future = None
            if got.messages and got.pending > 0 and got.messages[-1].seq < end:
                future = request(got.messages[-1].seq + 1)
            for message in got.messages:
                if message.seq > end:
                    return
                key = keys.key(message.subject)
                if key is not None:  # a subject convmem could not have written is no session
                    yield logged(message, key)
    finally:
        if future is not None:
            future.cancel()


def session_seq(headers: dict[str, str]) -> int | None:
    """The session sequence convmem wrote beside the event; None for bytes it did not write.

    convmem writes a whole number from 1 in ASCII digits; anything else (``0``, ``-5``, ``+3``,
    `` 3``, other scripts' digits, all of which `int` would take) is a stranger's: read back as
    poison, never dropped as a seq no read asks for nor counted as a message the store lost.
    """
    value = headers.get(SEQ_HEADER)
    if value is None or not (value.isascii() and value.isdigit()) or value[0] == "0":
        return None
    try:
        return int(value)
    except ValueError:  # more digits than Python converts
        return None


def to_logged(message: StoredMessage, key: MemoryKey) -> LoggedEvent:
    """A stream message as the port returns it, its checksum checked; decoding is the reader's job."""
    intact, damage = check(message.headers, message.data, seq_header=SEQ_HEADER, id_header=MSG_ID)
    return LoggedEvent(
        key=key,
        seq=session_seq(message.headers),
        position=message.seq,
        data=message.data,
        event_id=message.headers.get(MSG_ID),
        intact=intact,
        damage=damage,
    )


def unreadable(key: MemoryKey, count: int, after: LoggedEvent | None) -> LoggedEvent:
    """The record that stands for `count` messages of `key` the store holds but cannot read back."""
    where = (
        f"after seq {after.seq} (log position {after.position})" if after is not None else "from its start"
    )
    first = (after.seq or 0) + 1 if after is not None else 1
    return LoggedEvent(
        key=key,
        seq=first,
        position=0,
        data=b"",
        damage=(
            f"the store holds {count} more message(s) of this session {where} that it cannot read "
            f"back (damaged on disk; the first would be seq {first})"
        ),
    )


async def list_subjects(conn: NatsConnection, stream: str, subject_filter: str) -> dict[str, int]:
    """The stream's subjects that match `subject_filter`, with their message counts; none is read."""
    subjects: dict[str, int] = {}
    while True:
        info = await conn.api(
            f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subject_filter, "offset": len(subjects)}
        )
        page = info["state"].get("subjects") or {}
        subjects.update(page)
        if not page or len(subjects) >= int(info.get("total", 0)):
            return subjects


MULTI_LAST_MOST = 1024
"""The most subjects a direct get of last messages (``multi_last``) answers for: past it, the server
answers 413 "Too Many Results" and nothing else (whatever the start sequence asked for)."""
_MULTI_LAST_BYTES = 128 * 1024
"""The most bytes of subjects one such request names (the server's max_payload bounds a request)."""


async def newest_subjects(
    conn: NatsConnection, stream: str, subjects: Sequence[str], limit: int
) -> list[str]:
    """The `limit` of `subjects` written most recently (whose last message is the newest in the
    stream), newest first.

    Their last messages are asked for by name, up to `MULTI_LAST_MOST` a request (``multi_last``):
    one request per 1,024 subjects, each answered with those subjects' last messages (their bytes
    come along: the server has no way to send only a message's sequence). Only each one's subject
    and position are kept, so memory holds `limit` of them whatever the count.
    """
    newest: list[tuple[int, str]] = []  # a heap of the newest `limit` (position, subject) found
    chunk: list[str] = []
    size = 0

    async def ask() -> None:
        got = await direct_batch(conn, stream, {"multi_last": chunk, "batch": len(chunk)})
        for message in got.messages:
            if len(newest) < limit:
                heapq.heappush(newest, (message.seq, message.subject))
            elif message.seq > newest[0][0]:
                heapq.heapreplace(newest, (message.seq, message.subject))

    for subject in subjects:
        if chunk and (len(chunk) == MULTI_LAST_MOST or size + len(subject) > _MULTI_LAST_BYTES):
            await ask()
            chunk, size = [], 0
        chunk.append(subject)
        size += len(subject)
    if chunk:
        await ask()
    return [subject for _, subject in sorted(newest, reverse=True)]


class SubjectKeys:
    """Subject <-> `MemoryKey`, with a bounded cache of decoded subjects."""

    def __init__(self, prefix: str, *, size: int = 8_192) -> None:
        self.prefix = prefix
        self._skip = prefix.count(".") + 1
        self._size = size
        self._keys: OrderedDict[str, MemoryKey | None] = OrderedDict()
        self._lock = threading.Lock()

    def subject(self, key: MemoryKey) -> str:
        tenant, user, session = key.tokens()
        return f"{self.prefix}.{tenant}.{user}.{session}"

    def filter(self, tenant_id: str | None, user_id: str | None) -> str | None:
        """The subject filter of every session, or of a tenant's, a user's or both's.

        None when an id could never be part of a key (so nothing matches).
        """
        try:
            probe = MemoryKey(
                tenant_id if tenant_id is not None else "x", user_id if user_id is not None else "x", "x"
            )
        except InvalidKey:
            return None
        tenant, user, _ = probe.tokens()
        tenant = tenant if tenant_id is not None else "*"
        user = user if user_id is not None else "*"
        return f"{self.prefix}.{tenant}.{user}.*"

    def key(self, subject: str) -> MemoryKey | None:
        """The key of a session subject; None for a subject convmem could not have written."""
        with self._lock:
            if subject in self._keys:
                return self._keys[subject]
        tokens = subject.split(".")[self._skip :]
        key: MemoryKey | None = None
        if len(tokens) == 3:
            try:
                key = MemoryKey.from_tokens(tokens[0], tokens[1], tokens[2])
            except InvalidKey:
                key = None
        with self._lock:
            self._keys[subject] = key
            if len(self._keys) > self._size:
                self._keys.popitem(last=False)
        return key
