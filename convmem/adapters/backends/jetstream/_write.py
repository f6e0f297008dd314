"""The loop side of the JetStream log: conditional appends, the last-message cache, erasure.

Every message carries ``Nats-Msg-Id`` (the event id), ``Convmem-Seq``
(its session seq) and ``Convmem-Sum`` (its checksum, `convmem.adapters.backends._checksum`);
the first of an append carries
``Nats-Expected-Last-Subject-Sequence``, the stream sequence of the session's
last message, cached from acks and reads. An append of several events is one
atomic batch, stored whole or not at all.

When the server refuses an append, the session's last message decides what
happened: if it is our own event, an earlier attempt whose ack was lost got
through (a single server answers such a retry with "wrong last sequence",
not "duplicate"), otherwise another writer got there first and the caller
gets `ConcurrencyConflict` with the session's real last seq.

All of this runs on the connection's loop thread only, so the cache and the
per-session locks need no thread locks. Sessions do not wait for each other:
only one session's appends are serialised.

A whole read of a session that finds damage (a message failing its checksum,
events missing between intact ones, messages the server holds but cannot
serve) not followed by a repair or an erasure fence marks the session
damaged: its appends are refused with `SessionDamaged` (never a
`ConcurrencyConflict`, which would send the caller rereading forever) until a
`SessionRepaired` is stored, which is published on the subject's last message
as the server sees it.

`start_append` is the hot path. When the session's last message is cached,
matches the expected seq, and nothing else is writing the session, one event
goes out on the fast path (`FastAppends`), settled from its acknowledgement.
Any other case, and any refusal or duplicate answer, takes the full `append`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats.errors
import nats.js.errors

from convmem.actors._fair import FairCache
from convmem.adapters.backends._checksum import SUM_HEADER, check, seal
from convmem.adapters.backends._log_bytes import opens_history
from convmem.adapters.backends.jetstream._appends import (
    EMPTY,
    EXPECTED,
    RECENT_SESSIONS,
    Last,
    PendingAppend,
    Refused,
    parse_ack,
)
from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage, log_error
from convmem.adapters.backends.jetstream._fast import FastAppends
from convmem.adapters.backends.jetstream._read import (
    MSG_ID,
    SEQ_HEADER,
    fetch_subject,
    fetch_subject_counted,
    session_seq,
    tail_start,
    unservable,
)
from convmem.adapters.backends.jetstream._usage import RECORD, header_size, stored_size
from convmem.errors import (
    ConcurrencyConflict,
    ConvmemError,
    EventDecodeError,
    InvalidInput,
    LogUnavailable,
    SessionClosed,
    SessionDamaged,
)
from convmem.events import (
    Event,
    HistoryCompacted,
    MemoryKey,
    SessionErased,
    SessionRepaired,
    decode_event,
    encode_event,
)
from convmem.projections import SessionSequence

__all__ = ["EventsNotErased", "PendingAppend", "SessionWriter", "erased_already"]

_READ_ATTEMPTS = 12  # about 1.5 s of back-off in all before a lagging read is an error
_ATTEMPTS = 5
_FENCE_ATTEMPTS = _ATTEMPTS  # conditional fences an erasure tries before it fences unconditionally
_FENCE_LEAD = 1 << 20
"""How far above the session's last seq an erasure fence lands when it is published unconditionally
(writers kept winning the conditional one): far past any seq a writer can reach meanwhile, since
each of its appends stays conditional on the one before."""
_ERASE_WINDOW = 64  # message deletions in flight at once
_GONE = (10057, 10043)  # "no message found", "sequence not found": erased already (a racing eraser)
_CORRUPT = ("corrupt", "malformed")
"""Words of a delete's 10057 that is no "no message found": nats-server refuses to erase a message
whose stored bytes fail its own hash ("malformed or corrupt message in N.blk: invalid checksum")."""
_log = logging.getLogger("convmem.jetstream")

Opener = Callable[[StoredMessage], bytes]
"""The plain bytes of a stored message (sealed ones opened by the log's keyring)."""


def _plain(message: StoredMessage) -> bytes:
    return message.data


def erased_already(exc: nats.js.errors.APIError) -> bool:
    """Whether a refused ``STREAM.MSG.DELETE`` means the message is gone (another eraser's), not that
    nats-server cannot erase it: it answers a message damaged on disk with the same code (10057)."""
    description = (exc.description or "").lower()
    return exc.err_code in _GONE and not any(word in description for word in _CORRUPT)


class EventsNotErased(SessionDamaged):
    """An erasure left messages of the session in the events stream that nats-server can neither read
    back (damaged on disk) nor erase (its `SessionDamaged` fields: no seq, no position, `problem`
    naming them); the erasure is not done: nothing says it was."""

    def __init__(self, key: MemoryKey, stream: str, left: int) -> None:
        self.key = key.composite()
        self.seq = self.position = None
        self.problem = (
            f"{left} message(s) of the session stay in stream {stream}: nats-server can neither read "
            "them back (damaged on disk) nor erase them (it refuses to delete a corrupt message, and a "
            "purge filtered by the session's subject passes over it); every message it could read is erased"
        )
        ConvmemError.__init__(
            self,
            f"the events of session {self.key} were not erased: {self.problem}. Those bytes keep the "
            "session's data (in clear on a store that does not encrypt). nats-server removes a corrupt "
            f"message only with a purge of the whole stream {stream} (every session's events), which "
            "convmem does not do by itself",
        )


class SessionWriter:
    """Writes of every session of one stream, pipelined across sessions, ordered within one."""

    def __init__(self, conn: NatsConnection, stream: str) -> None:
        self._conn = conn
        self._stream = stream
        self._recent: FairCache[str, Last] = FairCache(RECENT_SESSIONS)
        """The last message of the sessions written or read most recently, by subject; past
        `RECENT_SESSIONS`, the least recently stored of the tenant holding the most goes, so a tenant
        writing to many sessions gives up its own and another tenant's writes still publish at once."""
        self._last = self._recent.entries  # the hot path's lookup: one dict get
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._damaged: dict[str, tuple[int | None, int | None, str]] = {}
        """Sessions whose last whole read found damage: (seq, position, problem) of the first."""
        self._fast = FastAppends(conn, self)
        self.appended: dict[str, int] = {}
        """Bytes sent for each tenant (by id), as the stream stores them (`sent`; any thread may read)."""
        self.erased: dict[str, int] = {}
        """Bytes of each tenant's messages this writer erased or is erasing (`erase`, `drop_before`),
        as the stream stores them: counted before each delete is sent and taken back for one found
        gone (another eraser's) or not known to be deleted (any thread may read)."""
        self.opener: Opener = _plain
        """How a message's bytes are read when a walk must decode one (sealed ones opened)."""

    async def start_append(self, pending: PendingAppend) -> None:
        """Begin `pending` and return at once; its `done` gets the result or the (log) error."""
        subject = pending.subject
        last = self._last.get(subject)
        if (
            len(pending.events) > 1
            or last is None
            or last.seq != pending.expected
            or subject in self._locks
            or not await self._fast.start(pending, last)
        ):
            self._append_in_task(pending)

    def start_now(self, pending: PendingAppend) -> bool:
        """`start_append` without awaiting, from the loop, when the fast path takes `pending` at once.

        False, with nothing done, otherwise: the caller then starts it the awaited way.
        """
        subject = pending.subject
        last = self._last.get(subject)
        if len(pending.events) > 1 or last is None or last.seq != pending.expected or subject in self._locks:
            return False
        return self._fast.start_now(pending, last)

    def known(self, subject: str) -> Last | None:
        """The session's last message as this writer knows it, without asking the stream; None when it
        is not among the sessions written (or read) most recently (`RECENT_SESSIONS`, shared fairly
        between tenants)."""
        return self._last.get(subject)

    def append_in_task(self, pending: PendingAppend) -> None:
        """Take `pending` the full way (`append`) in a task of its own; settle it from there."""
        self._append_in_task(pending)

    def forget(self, subject: str) -> None:
        """The session's last message is not known any more (an append's outcome is unknown)."""
        self._recent.pop(subject)

    def sent(self, pending: PendingAppend, size: int) -> None:
        """`pending`'s one message went out on the fast path, `size` bytes of headers and payload: add
        what the stream stores for it to its tenant's `appended` (an append refused or lost after
        this stays counted: on the safe side)."""
        self._sent(pending.key.tenant_id, size + RECORD + len(pending.subject.encode()))

    def _sent(self, tenant_id: str, stored: int) -> None:
        self.appended[tenant_id] = self.appended.get(tenant_id, 0) + stored

    def _append_in_task(self, pending: PendingAppend) -> None:
        async def run() -> None:
            try:
                last = await self.append(
                    pending.key, pending.subject, pending.events, pending.payloads, pending.expected
                )
            except asyncio.CancelledError:
                pending.done.set_exception(
                    SessionClosed(f"{pending.what} was cancelled because the connection closed")
                )
                raise
            except BaseException as exc:
                pending.done.set_exception(log_error(exc, pending.what))
            else:
                pending.done.set_result(last)

        asyncio.get_running_loop().create_task(run())

    async def append(
        self,
        key: MemoryKey,
        subject: str,
        events: tuple[Event, ...],
        payloads: tuple[bytes, ...],
        expected: int,
    ) -> int:
        """Store `events` after session seq `expected`; returns the session's last seq."""
        async with self._session(subject):
            try:
                repair = isinstance(events[0], SessionRepaired)
                if repair:
                    await self.read(subject)  # the whole subject: is it damaged, as the repair found?
                last = self._last.get(subject)
                if last is None or last.seq != expected:
                    last = await self.load_last(subject)
                self._refuse_damaged(key, subject, repair=repair)
                done = 0
                on_top = repair and subject in self._damaged
                if on_top:
                    last = await self._server_last(subject, expected)
                if last.seq != expected:
                    done = await self._stored_prefix(key, subject, events, expected, last)
                for _ in range(_ATTEMPTS):
                    if done == len(events):
                        return last.seq
                    try:
                        return await self._publish(key, subject, events[done:], payloads[done:], last)
                    except Refused:
                        if on_top:
                            last = await self._server_last(subject, expected)
                            continue
                        fresh = await self.load_last(subject)
                    if fresh.seq != last.seq or fresh.stream_seq == last.stream_seq:
                        done = await self._stored_prefix(key, subject, events, expected, fresh)
                    last = fresh  # else only foreign messages (no session seq) came in between
                raise LogUnavailable(f"append to {key} kept losing races on its subject; retry")
            except (ConcurrencyConflict, InvalidInput, SessionDamaged):
                raise
            except BaseException:
                self._recent.pop(subject)  # the outcome is unknown: ask the server next time
                raise

    async def _server_last(self, subject: str, expected: int) -> Last:
        """Where a repair of a damaged session goes: on top of the subject's last message as the
        server sees it (none, when it cannot read its last one), whatever the damage left of the
        session's sequence."""
        message = await self._conn.get_message(self._stream, {"last_by_subj": subject})
        return Last(expected, message.seq if message is not None else 0, None)

    def _refuse_damaged(self, key: MemoryKey, subject: str, *, repair: bool) -> None:
        """`SessionDamaged` when the session's last whole read found damage (unless this is its repair)."""
        found = self._damaged.get(subject)
        if found is not None and not repair:
            seq, position, problem = found
            raise SessionDamaged(key=key.composite(), seq=seq, position=position, problem=problem)

    async def _stored_prefix(
        self, key: MemoryKey, subject: str, events: tuple[Event, ...], expected: int, last: Last
    ) -> int:
        """How many of `events` are stored already (a retry); `ConcurrencyConflict` if another writer won.

        When the log holds less than the writer expects, the session is read whole first: if the
        store lost or cannot serve some of it, that is `SessionDamaged`, not a conflict.
        """
        ahead = last.seq - expected
        if ahead < 0 and not isinstance(events[0], SessionRepaired):
            await self.read(subject)
            self._refuse_damaged(key, subject, repair=False)
        if 0 < ahead <= len(events) and last.event_id == events[ahead - 1].event_id:
            return ahead  # an atomic batch ending in our event: the events before it are ours too
        if ahead > len(events):  # others wrote after us, or instead of us
            stored = _events_by_seq(await self.read(subject), self.opener)
            if all(stored.get(e.seq) == e.event_id for e in events):
                return len(events)
        raise ConcurrencyConflict(key=key.composite(), expected_seq=expected, actual_seq=last.seq)

    async def _publish(
        self,
        key: MemoryKey,
        subject: str,
        events: tuple[Event, ...],
        payloads: tuple[bytes, ...],
        last: Last,
        *,
        conditional: bool = True,
    ) -> int:
        nc = self._conn.nc
        batch = uuid.uuid4().hex if len(events) > 1 else None
        reply, size = None, 0
        for index, (event, payload) in enumerate(zip(events, payloads, strict=True), start=1):
            headers = {
                MSG_ID: event.event_id,
                SEQ_HEADER: str(event.seq),
                SUM_HEADER: seal(event.seq, event.event_id, payload),
            }
            if index == 1 and conditional:
                headers[EXPECTED] = str(last.stream_seq)
            if batch is not None:
                headers["Nats-Batch-Id"] = batch
                headers["Nats-Batch-Sequence"] = str(index)
            size += header_size(headers) + len(payload)
            if index < len(events):
                await nc.publish(subject, payload, headers=headers)
                continue
            if batch is not None:
                headers["Nats-Batch-Commit"] = "1"
                size += len("Nats-Batch-Commit") + 5
            with self._conn.watch.expect(subject) as denied:  # a refused subject fails at once, named
                request = asyncio.ensure_future(
                    nc.request(subject, payload, timeout=self._conn.timeout, headers=headers)
                )
                waits: set[asyncio.Future[Any]] = {request, denied}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if not request.done():
                    request.cancel()
                    denied.result()
                reply = request.result()
        assert reply is not None
        self._sent(key.tenant_id, size + (RECORD + len(subject.encode())) * len(events))
        ack = parse_ack(reply.data)
        if ack.get("duplicate"):  # stored long ago under this id: report the session as it is
            await self._check_own(key, subject, events[-1], int(ack["seq"]))
            return (await self.load_last(subject)).seq
        if isinstance(events[0], SessionRepaired):
            self._damaged.pop(subject, None)
        self.remember(subject, Last(events[-1].seq, int(ack["seq"]), events[-1].event_id))
        return events[-1].seq

    async def _check_own(self, key: MemoryKey, subject: str, event: Event, stream_seq: int) -> None:
        """A duplicate answer says the stream holds a message under the event's id (at `stream_seq`):
        the event is stored only when that message is this event on this subject. The ids are
        deduplicated stream-wide, so anyone who may publish on any subject could take an id first
        (a predictable one: an idempotency key's); then nothing is stored, and the caller is told so
        (`InvalidInput`), never that the write is done."""
        held = await self._conn.get_message(self._stream, {"seq": stream_seq})
        if (
            held is not None
            and held.subject == subject
            and held.headers.get(MSG_ID) == event.event_id
            and held.headers.get(SEQ_HEADER) == str(event.seq)
        ):
            return
        if held is None:
            where = "a message no longer in the stream"
        elif held.subject != subject:
            where = "a message on another subject"
        else:
            where = "a message on this session's subject"
        raise InvalidInput(
            "event_id",
            f"{event.event_id!r} (seq {event.seq} of {key}) is already taken in the stream by {where} "
            f"that is not this event (stream seq {stream_seq}), so the server dropped it as a duplicate: "
            "nothing was stored; write again with another idempotency key (or after the stream's "
            "duplicate window)",
        )

    async def append_raw(
        self, subject: str, data: bytes, seq: int | None, headers: dict[str, str] | None = None
    ) -> int:
        """Publish bytes as they are, unconditionally; returns their stream sequence."""
        async with self._session(subject):
            self._recent.pop(subject)
            headers = dict(headers or {})
            if seq is not None:
                headers[SEQ_HEADER] = str(seq)
            reply = await self._conn.nc.request(
                subject, data, timeout=self._conn.timeout, headers=headers or None
            )
            return int(parse_ack(reply.data)["seq"])

    async def read(self, subject: str, after_seq: int = 0) -> list[StoredMessage]:
        """`read_counted`'s messages."""
        return (await self.read_counted(subject, after_seq))[0]

    async def read_counted(self, subject: str, after_seq: int = 0) -> tuple[list[StoredMessage], int]:
        """Every message of a session's subject, at least up to what the stream leader holds.

        With `after_seq`, the read starts where the events above it start
        (`tail_start`), so a session activated from a snapshot reads its tail,
        not its history; messages before it may be left out.

        Direct gets may be answered by any replica, and a follower can lag the
        leader; a read that ends before the leader's last message of the
        subject *as it was when the read began* is made again (a few times,
        backing off), so that a session rebuilt after a write always includes
        that write. Messages stored while it reads are not waited for: a
        writer that keeps appending (a planner mid-conversation) would make
        every read look behind, and an erasure of the session fail.

        Also returns how many messages the server holds after the last one
        read but cannot serve (`fetch_subject_counted`). A whole read records
        whether the session is damaged (`SessionDamaged` for its appends).
        """
        unread = 0
        for attempt in range(_READ_ATTEMPTS):
            start = 1
            leader = await self._conn.get_message(self._stream, {"last_by_subj": subject})
            if after_seq > 0 and leader is not None:
                start = await tail_start(self._conn, self._stream, subject, after_seq, leader)
            messages, unread = await fetch_subject_counted(self._conn, self._stream, subject, start=start)
            if leader is None or leader.seq < start or (messages and messages[-1].seq >= leader.seq):
                break
            await asyncio.sleep(min(0.005 * 2**attempt, 0.25))
        else:
            raise LogUnavailable(
                f"reads of {subject} stay behind the stream leader (a replica is lagging); retry"
            )
        if unread:  # not those a gap names already, nor those a repair counted (they stay, unreadable)
            unread = max(unread - _missing(messages) - _repaired_unreadable(messages, self.opener), 0)
        if start == 1:  # a tail read does not say the session's seq: nothing learnt
            walked, found = _scan(messages, unread, self.opener)
            if found is None:
                self._damaged.pop(subject, None)
                if messages:
                    self.remember(subject, walked)
            else:  # not cached either: every append of it takes the full path, which refuses it
                self._damaged[subject] = found
                self._recent.pop(subject)
        return messages, unread

    async def load_last(self, subject: str) -> Last:
        """The session's last seq and its subject's last message, from the stream leader.

        The seq is counted by `SessionSequence`, as the fold counts it: from
        what this writer knew of the subject when the subject has only grown
        since (the messages after it are read), else from the whole subject.
        """
        message = await self._conn.get_message(self._stream, {"last_by_subj": subject})
        if message is None:
            self._recent.pop(subject)
            return EMPTY
        known = self._last.get(subject)
        if known is not None and known.stream_seq == message.seq:
            return known
        if known is not None and 0 < known.stream_seq < message.seq:
            after = await fetch_subject(self._conn, self._stream, subject, start=known.stream_seq + 1)
            if after and after[-1].seq >= message.seq:
                last = _walk(after, known, self.opener)
                self.remember(subject, last)
                return last
        await self.read(subject)  # the whole subject (also when a lagging replica answered short)
        return self._last.get(subject, EMPTY)

    async def erase(self, key: MemoryKey, subject: str, at: float) -> int | None:
        """Remove every message of the session's subject for good; returns the events removed.

        None when the subject had no message.

        1. A fence: a `SessionErased` appended on top, conditional on the
           subject's last message, so from here on a stale writer conflicts and
           a reader rebuilds an empty session, never a part of the history.
        2. Every message below the fence is erased (``STREAM.MSG.DELETE``,
           whose default overwrites the stored bytes; a purge only forgets them),
           newest first, so an erasure cut short leaves a history that folds
           up to its fence.
        3. The fence itself is erased. A session begun again on top of it
           meanwhile keeps its events: its `SessionStarted` opens its history.

        A writer that keeps appending (a planner mid-conversation) can win
        every conditional fence; after `_FENCE_ATTEMPTS` the fence is published
        unconditionally, `_FENCE_LEAD` seqs above the last one seen (a fence
        may open a history at any higher seq), so the erasure never waits on
        writers; their next conditional append conflicts on it as on any fence.
        """
        async with self._session(subject):
            last = await self._erasing_last(subject)
            if last is None:  # the subject's last message is unreadable: no fence can be written on it
                held = await fetch_subject(self._conn, self._stream, subject)
                await self._erase_counted(key.tenant_id, held)  # what it can read, then say what stays
                await self._check_erased(key, subject)
                self._recent.pop(subject)
                return None if not held else len(held)
            if last.stream_seq == 0:
                await self._check_erased(key, subject)  # messages it counts and cannot serve stay
                return None
            for attempt in range(_FENCE_ATTEMPTS + 1):
                conditional = attempt < _FENCE_ATTEMPTS
                lead = 1 if conditional else _FENCE_LEAD
                fence = SessionErased(
                    seq=last.seq + lead,
                    event_id=f"erased/{uuid.uuid4().hex}",
                    at=at,
                    reason="erased on request",
                )
                try:
                    await self._publish(
                        key, subject, (fence,), (encode_event(fence),), last, conditional=conditional
                    )
                    break
                except Refused:
                    last = await self._erasing_last(subject) or last
            else:
                raise LogUnavailable(f"erase of {key} kept racing with writers; retry")
            fence_at = self._last[subject].stream_seq
            held = await fetch_subject(self._conn, self._stream, subject)
            below = [m for m in held if m.seq < fence_at]
            if any((session_seq(m.headers) or 0) >= fence.seq for m in below):  # a writer outran the lead
                raise LogUnavailable(f"erase of {key} kept racing with writers; retry")
            await self._erase_counted(key.tenant_id, below)
            await self._erase_counted(key.tenant_id, [m for m in held if m.seq == fence_at] or [fence_at])
            self._recent.pop(subject)
            await self._check_erased(key, subject)
            return sum(1 for m in below if not m.headers.get(MSG_ID, "").startswith("erased/"))

    async def _erasing_last(self, subject: str) -> Last | None:
        """`load_last` for an erasure: also for a damaged session (whose reads remember no last
        message, so `load_last` answers `EMPTY`), the subject's last message and the highest session
        seq read, so a fence goes on top of it. None when the server holds messages of the subject
        but cannot read back its last one (damaged on disk)."""
        last = await self.load_last(subject)
        if last.stream_seq != 0:
            return last
        leader = await self._conn.get_message(self._stream, {"last_by_subj": subject})
        messages = await fetch_subject(self._conn, self._stream, subject)
        if leader is None or not messages:
            return None if messages else EMPTY  # (no message read, none counted: `_check_erased` asks)
        if messages[-1].seq != leader.seq:
            return None
        walked, _ = _scan(messages, 0, self.opener)
        top = max([walked.seq, *((session_seq(m.headers) or 0) for m in messages)])
        return Last(top, leader.seq, leader.headers.get(MSG_ID))

    async def _check_erased(self, key: MemoryKey, subject: str) -> None:
        """`EventsNotErased` when the stream still counts messages of `subject` that it cannot serve:
        left by an erasure, since nats-server neither reads nor deletes them (a message written on
        top of the fence meanwhile is served, and not counted here). One request on a healthy one."""
        left = await unservable(self._conn, self._stream, subject)
        if left:  # asked again: another process deleting its fence between the count and the read
            left = min(left, await unservable(self._conn, self._stream, subject))
        if left:
            raise EventsNotErased(key, self._stream, left)
        self._damaged.pop(subject, None)

    async def drop_before(self, key: MemoryKey, subject: str, seq: int) -> int:
        """Erase the session's messages before its `HistoryCompacted` (or fence) at session seq `seq`.

        The messages are erased as `erase` erases them (``STREAM.MSG.DELETE``,
        their bytes overwritten), not purged: a purge only forgets them. The
        subject's last message stays, so the writer's cache stays true. They go
        newest first (`erase_messages`): a drop cut short (the process killed)
        leaves the history's oldest events and the compaction, which fold as the
        whole does (a compaction may follow any seq), so reads stay right and
        the next drop finishes it.
        """
        async with self._session(subject):
            messages = await fetch_subject(self._conn, self._stream, subject)
            at = next(
                (m for m in messages if session_seq(m.headers) == seq and opens_history(self.opener(m), seq)),
                None,
            )
            if at is None:
                raise InvalidInput("seq", f"{key} has no stored compaction or erasure fence at seq {seq}")
            below = [m for m in messages if m.seq < at.seq]
            await self._erase_counted(key.tenant_id, below)
            return len(below)

    async def erase_messages(self, positions: list[int]) -> None:
        """Erase these stream messages securely (their bytes overwritten), some requests at a time.

        Newest first: what an eraser killed on the way leaves is the oldest of
        them (whole, up to the window that was in flight), so a history still
        opens with its first event and reads up to the event that opens what
        follows (a compaction, or a fence) instead of starting in its middle.
        """
        newest_first = sorted(positions, reverse=True)
        for start in range(0, len(newest_first), _ERASE_WINDOW):
            window = newest_first[start : start + _ERASE_WINDOW]
            await asyncio.gather(*(self._erase_one(p) for p in window))

    async def _erase_counted(self, tenant_id: str, messages: list[StoredMessage] | list[int]) -> None:
        """`erase_messages`, adding the bytes of those this writer deleted to the tenant's `erased`.

        Counted before the deletes are sent, so a count of the tenant's bytes that ends while they
        run knows them (it may have read them: on the safe side); a message found gone (another
        eraser deleted it, and counts it) or a window that failed is taken back (some of it may be
        deleted: on the safe side). A bare position (a message not read) is deleted uncounted."""
        sizes = {m.seq: stored_size(m) for m in messages if isinstance(m, StoredMessage)}
        positions = [m.seq if isinstance(m, StoredMessage) else m for m in messages]
        self.erased[tenant_id] = self.erased.get(tenant_id, 0) + sum(sizes.values())
        newest_first = sorted(positions, reverse=True)
        for start in range(0, len(newest_first), _ERASE_WINDOW):
            window = newest_first[start : start + _ERASE_WINDOW]
            try:
                deleted = await asyncio.gather(*(self._erase_one(p) for p in window))
            except BaseException:
                left = sum(sizes.get(p, 0) for p in newest_first[start:])
                self.erased[tenant_id] = self.erased.get(tenant_id, 0) - left
                raise
            gone = sum(sizes.get(p, 0) for p, done in zip(window, deleted, strict=True) if not done)
            if gone:
                self.erased[tenant_id] = self.erased.get(tenant_id, 0) - gone

    async def _erase_one(self, position: int) -> bool:
        """Delete one message; False when it was not deleted: gone already (erased meanwhile by
        another eraser), or damaged on disk, which nats-server refuses to erase (it stays: an
        erasure's `_check_erased` names it, never counts it as erased)."""
        try:
            await self._conn.api(f"$JS.API.STREAM.MSG.DELETE.{self._stream}", {"seq": position})
        except nats.js.errors.APIError as exc:
            if exc.err_code not in _GONE:
                raise
            if not erased_already(exc):
                _log.warning("stream %s seq %d not erased: %s", self._stream, position, exc.description)
            return False
        return True

    def remember(self, subject: str, last: Last) -> None:
        """What the session's last message is now, unless an older read or ack tells it late."""
        known = self._last.get(subject)
        if known is None:
            self._recent.put(subject.rsplit(".", 3)[-3], subject, last)  # by its tenant's token
        elif known.stream_seq <= last.stream_seq:  # else a read that started before our latest append
            self._recent.renew(subject, last)

    @contextlib.asynccontextmanager
    async def _session(self, subject: str) -> AsyncIterator[None]:
        """Serialise one session's writes; other sessions' go on meanwhile."""
        await self._fast.wait_for(subject)  # a fast-path publish of this session is still unanswered
        lock, users = self._locks.get(subject, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[subject] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[subject]
            if users <= 1:
                del self._locks[subject]
            else:
                self._locks[subject] = (lock, users - 1)


def _walk(messages: list[StoredMessage], known: Last, opener: Opener = _plain) -> Last:
    """What the writer knows of a session after `messages` (the next of its subject after `known`).

    Its seq is counted by `SessionSequence`, as the fold counts it: a message
    that does not fit the session (no header, a rewound or skipping seq)
    moves the subject's last position but not the session's seq.
    """
    walk = SessionSequence(known.seq)
    event_id = known.event_id
    for message in messages:
        if _take(walk, message, opener):
            event_id = message.headers.get(MSG_ID)
    return Last(walk.version, messages[-1].seq, event_id)


def _take(walk: SessionSequence, message: StoredMessage, opener: Opener = _plain) -> bool:
    """Whether `message` is the session's next event, as the fold counts (`decode_logged`): its
    checksum checked, its bytes opened only when the walk must decode them (a seq that skips).

    A message failing its checksum takes its seq only when that is the next one.
    """
    seq = session_seq(message.headers)
    intact, damage = check(message.headers, message.data, seq_header=SEQ_HEADER, id_header=MSG_ID)
    if damage is not None:
        if seq is not None and seq == walk.version + 1:
            walk.version = seq
            return True
        return False
    data = message.data
    if seq is not None and seq > walk.version + 1:
        data = opener(message)
    return walk.take(seq, data, intact=intact) is None


def _scan(
    messages: list[StoredMessage], unread: int, opener: Opener = _plain
) -> tuple[Last, tuple[int | None, int | None, str] | None]:
    """One walk of a session's whole subject: what `_walk` learns, and the first damage that no
    later repair, erasure fence or compaction covers: (seq, position, problem), or None."""
    walk = SessionSequence()
    event_id: str | None = None
    found: tuple[int | None, int | None, str] | None = None
    for message in messages:
        seq = session_seq(message.headers)
        intact, damage = check(message.headers, message.data, seq_header=SEQ_HEADER, id_header=MSG_ID)
        if damage is not None:
            found = found or (seq, message.seq, f"the event at log position {message.seq}: {damage}")
            if seq is not None and seq == walk.version + 1:
                walk.version = seq
                event_id = message.headers.get(MSG_ID)
            continue
        data = message.data
        if seq is not None and seq > walk.version + 1:
            data = opener(message)
        if walk.take(seq, data, intact=intact) is not None:
            continue
        event_id = message.headers.get(MSG_ID)
        if walk.gap is not None and found is None:
            first, last = walk.gap
            found = (
                first,
                None,
                f"events seq {first}-{last} are missing: the store lost them (the next one kept, seq "
                f"{seq}, is at log position {message.seq})",
            )
        elif found is not None and _clears(opener(message)):
            found = None
    if unread and found is None:
        last_seq = walk.version
        found = (
            last_seq + 1,
            None,
            f"the store holds {unread} more message(s) after seq {last_seq} that it cannot read back "
            "(damaged on disk)",
        )
    return Last(walk.version, messages[-1].seq if messages else 0, event_id), found


def _missing(messages: list[StoredMessage]) -> int:
    """How many seqs are missing between the intact messages of `messages` (the gaps' lengths)."""
    previous: int | None = None
    missing = 0
    for message in messages:
        seq = session_seq(message.headers)
        if (
            seq is None
            or not check(message.headers, message.data, seq_header=SEQ_HEADER, id_header=MSG_ID)[0]
        ):
            continue
        if previous is not None and seq > previous + 1:
            missing += seq - previous - 1
        previous = seq if previous is None else max(previous, seq)
    return missing


def _repaired_unreadable(messages: list[StoredMessage], opener: Opener = _plain) -> int:
    """How many unreadable messages the last repair among `messages` counted (0: none)."""
    for message in reversed(messages):
        if message.headers.get(MSG_ID, "").startswith("repaired/"):
            try:
                event = decode_event(opener(message))
            except EventDecodeError:
                continue
            if isinstance(event, SessionRepaired):
                return event.unreadable
    return 0


def _clears(data: bytes) -> bool:
    """Whether `data` is a repair, an erasure fence or a compaction (damage before it is covered)."""
    try:
        return isinstance(decode_event(data), SessionRepaired | SessionErased | HistoryCompacted)
    except EventDecodeError:
        return False


def _events_by_seq(messages: list[StoredMessage], opener: Opener = _plain) -> dict[int, str | None]:
    """The session's events among a whole subject's `messages`: their ids by seq."""
    walk = SessionSequence()
    stored: dict[int, str | None] = {}
    for message in messages:
        if _take(walk, message, opener):
            stored[walk.version] = message.headers.get(MSG_ID)
    return stored
