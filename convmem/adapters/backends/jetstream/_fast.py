"""The hot path of JetStream appends: one event, published with a reply subject of ours, settled from its ack.

When the writer knows a session's last message and nothing else is writing
the session, its next one-event append goes out as a plain publish with a
prepared header block (`NatsClient.publish_prepared`). Acknowledgements come
on one subscription of ours, handed straight to `_on_ack` as they are read:
no future, no task, no request per event, one expiry timer for every append
in flight. A refusal or a duplicate answer sends the append the full way
(`SessionWriter.append`); an acknowledgement that never comes fails the
append with `LogUnavailable` (it may be stored: retries are exactly-once by
event id); a connection that closes fails those still in flight. Everything
here runs on the connection's loop thread.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Protocol

import nats.errors
from nats.aio.subscription import Subscription

from convmem.adapters.backends._checksum import SUM_HEADER, seal
from convmem.adapters.backends.jetstream._appends import EXPECTED, Last, PendingAppend, Refused, parse_ack
from convmem.adapters.backends.jetstream._connection import NatsConnection, log_error
from convmem.adapters.backends.jetstream._read import MSG_ID, SEQ_HEADER
from convmem.errors import LogUnavailable, SessionClosed

__all__ = ["FastAppends"]

_FAST_HEADER = (
    f"NATS/1.0\r\n{MSG_ID}: %s\r\n{SEQ_HEADER}: %d\r\n{EXPECTED}: %d\r\n{SUM_HEADER}: %s\r\n\r\n".encode()
)


class _Writer(Protocol):
    """What the fast path needs of the writer it serves (`SessionWriter`)."""

    def append_in_task(self, pending: PendingAppend) -> None: ...

    def remember(self, subject: str, last: Last) -> None: ...

    def forget(self, subject: str) -> None: ...

    def sent(self, pending: PendingAppend, size: int) -> None: ...


class _InFlight:
    """A fast-path publish awaiting its acknowledgement."""

    __slots__ = ("deadline", "pending", "waiter")

    def __init__(self, pending: PendingAppend, deadline: float) -> None:
        self.pending = pending
        self.deadline = deadline
        self.waiter: asyncio.Future[None] | None = None
        """Made when a full append of the same session must wait for this one."""


class FastAppends:
    """One-event appends in flight on the fast path, by subject and by reply token."""

    def __init__(self, conn: NatsConnection, writer: _Writer) -> None:
        self._conn = conn
        self._writer = writer
        self._fast: dict[str, _InFlight] = {}
        """Subjects with a fast-path publish awaiting its acknowledgement."""
        self._acks: dict[str, _InFlight] = {}
        """The same publishes by reply token, oldest first (so by deadline: one timeout for all)."""
        self._ack_prefix: str | None = None
        self.ack_subscription: Subscription | None = None
        self._tokens = itertools.count()
        self._sweep: asyncio.TimerHandle | None = None
        conn.on_close(self.abandon)

    async def wait_for(self, subject: str) -> None:
        """Until no fast-path publish of `subject` is unanswered (a full append of it goes after)."""
        while (flight := self._fast.get(subject)) is not None:
            # (`wait`, not `await`: a cancelled waiter must not cancel the future others wait on too.)
            if flight.waiter is None:
                flight.waiter = asyncio.get_running_loop().create_future()
            await asyncio.wait([flight.waiter])

    def abandon(self) -> None:
        """The connection closed: appends whose acknowledgement never came now never will (on the loop)."""
        flights, self._acks = list(self._acks.values()), {}
        self._fast.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for flight in flights:
            if flight.waiter is not None and not flight.waiter.done():
                flight.waiter.set_result(None)
            flight.pending.done.set_exception(
                SessionClosed(f"{flight.pending.what}: the NATS connection closed before its acknowledgement")
            )

    async def start(self, pending: PendingAppend, last: Last) -> bool:
        """Publish `pending`'s one event after `last`; False (nothing sent) when this path cannot take it."""
        subject = pending.subject
        if subject in self._fast or not self._conn.nc.is_connected:
            return False
        event = pending.events[0]
        nc = self._conn.nc
        if self._ack_prefix is None:
            prefix = nc.new_inbox() + "."
            self.ack_subscription = await nc.subscribe_direct(prefix + "*", self._on_ack)
            self._ack_prefix = prefix
        token = str(next(self._tokens))
        # The event id was checked for header use (JetStreamEventLog); the numbers are ours.
        payload = pending.payloads[0]
        checksum = seal(event.seq, event.event_id, payload).encode()
        header = _FAST_HEADER % (event.event_id.encode(), event.seq, last.stream_seq, checksum)
        try:
            await nc.publish_prepared(subject, self._ack_prefix + token, header, payload)
        except BaseException:
            self._writer.forget(subject)  # it may have gone out: ask the server next time
            raise
        self._track(pending, token)
        self._writer.sent(pending, len(header) + len(payload))
        return True

    def start_now(self, pending: PendingAppend, last: Last) -> bool:
        """`start` without awaiting, from the loop: False (nothing sent) when it would have to wait.

        It would wait for its acknowledgements' subscription (the first append) or for the
        client (`NatsClient.send_now`: reconnecting, its buffer full); `start` takes those.
        """
        subject, prefix = pending.subject, self._ack_prefix
        if prefix is None or subject in self._fast:
            return False
        event = pending.events[0]
        token = str(next(self._tokens))
        payload = pending.payloads[0]
        checksum = seal(event.seq, event.event_id, payload).encode()
        header = _FAST_HEADER % (event.event_id.encode(), event.seq, last.stream_seq, checksum)
        if not self._conn.nc.send_now(subject, prefix + token, header, payload):
            return False
        self._track(pending, token)
        self._writer.sent(pending, len(header) + len(payload))
        return True

    def _track(self, pending: PendingAppend, token: str) -> None:
        """`pending` went out with the reply token `token`: await its acknowledgement (or its expiry)."""
        loop = asyncio.get_running_loop()
        flight = _InFlight(pending, loop.time() + self._conn.timeout)
        self._acks[token] = flight
        self._fast[pending.subject] = flight
        if self._sweep is None:
            self._sweep = loop.call_at(flight.deadline, self._expire)

    def _on_ack(self, subject: bytes, data: bytes, header: bytes) -> None:
        assert self._ack_prefix is not None
        flight = self._acks.pop(subject[len(self._ack_prefix) :].decode(), None)
        if flight is None:
            return  # late: its append already timed out
        if header.startswith(b"NATS/1.0 503"):
            self._fast_acked(flight, nats.errors.NoRespondersError())
        else:
            self._fast_acked(flight, data)

    def _expire(self) -> None:
        """Fail the publishes whose acknowledgement is overdue; wake again for the next oldest."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._acks:
            token, flight = next(iter(self._acks.items()))
            if flight.deadline > now:
                self._sweep = loop.call_at(flight.deadline, self._expire)
                return
            del self._acks[token]
            self._fast_acked(flight, None)
        self._sweep = None

    def _fast_acked(self, flight: _InFlight, answer: bytes | Exception | None) -> None:
        """Settle a fast-path append with the server's `answer` (None: no answer in time)."""
        pending = flight.pending
        subject, done = pending.subject, pending.done
        if self._fast.get(subject) is flight:
            del self._fast[subject]
        if flight.waiter is not None:
            flight.waiter.set_result(None)
        if answer is None:  # it may be stored or not
            self._writer.forget(subject)
            done.set_exception(
                LogUnavailable(
                    f"{pending.what} got no acknowledgement within {self._conn.timeout:g}s; the NATS "
                    "server may be down or overloaded (retrying is safe: appends are exactly-once by "
                    "event id)"
                )
            )
            return
        try:
            if isinstance(answer, Exception):
                raise answer
            reply = parse_ack(answer)
        except Refused:
            # Not stored: the full append finds out who wrote meanwhile, or retries.
            self._writer.append_in_task(pending)
            return
        except Exception as exc:
            self._writer.forget(subject)
            done.set_exception(log_error(exc, pending.what))
            return
        if reply.get("duplicate"):  # stored long ago under this id: the full append reports the session
            self._writer.append_in_task(pending)
            return
        event = pending.events[-1]
        self._writer.remember(subject, Last(event.seq, int(reply["seq"]), event.event_id))
        pending.done.set_result(event.seq)
