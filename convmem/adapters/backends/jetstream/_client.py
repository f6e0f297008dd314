"""nats-py's client with the shortcuts convmem's hot paths take through its internals.

`NatsClient` overrides and calls private parts of nats-py 2.x's `Client`
(`_process_headers`, `_process_msg`, `_send_command`, `_flush_pending`,
`_flush_queue`, `_max_payload`, `_subs`, `stats`, `Subscription._id`). The
dependency on nats-py is bounded below 3 in pyproject.toml, and
tests/test_patched_internals.py fails, naming the internal, when one of them
changes shape in the installed nats-py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from convmem.errors import InternalError

__all__ = ["DirectHandler", "NatsClient", "RequestHandler", "close_quietly", "parse_headers"]

_log = logging.getLogger("convmem.nats")


async def close_quietly(nc: Client) -> None:
    """Close `nc` whatever state its connection is in: a dead socket's error on the way out is no news.

    nats-py's close flushes what is pending to the server; when the server died that
    raises (``ConnectionResetError``), which would hide the error that led here.
    """
    try:
        await nc.close()
    except (OSError, nats.errors.Error) as exc:
        _log.debug("closing a NATS connection whose server is gone: %s", exc)


def parse_headers(raw: bytes) -> dict[str, str]:
    """Parse a NATS header block as UTF-8 (``email``'s parser mangles non-ASCII values)."""
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


DirectHandler = Callable[[bytes, bytes, bytes], None]
"""Told (subject, data, raw header block) of each message of a direct subscription, on the loop."""

RequestHandler = Callable[[bytes, bytes, bytes], None]
"""Told (subject, reply subject, data) of each message of a request subscription, on the loop."""


class NatsClient(Client):
    """nats-py's client with shortcuts for convmem's hot paths (nats-py 2.x internals).

    - Plain header blocks are parsed faster. nats-py checks every header name
      character by character; a stream read brings ~9 headers per message and
      spent most of its time there. Blocks with an inline status
      (``NATS/1.0 404``) still go to nats-py's parser.
    - `publish_prepared` sends a header block the caller built from checked
      parts, without nats-py's per-header checks and encoding.
    - A `subscribe_direct` subscription hands each message to a plain function
      as it is parsed: no `Msg`, no queue, no task wake per message (acks);
      `subscribe_requests` the same with the reply subject (the service's requests).
    - `send_now` publishes from the loop without awaiting (a task-free hot path),
      or says it cannot and the caller awaits `publish_prepared` / `publish`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}
        self._requests: dict[int, RequestHandler] = {}
        self._kick: asyncio.Future[None] | None = None

    async def _process_headers(self, headers: bytes | None) -> dict[str, str] | None:
        if headers and headers.startswith(b"NATS/1.0\r\n"):
            return parse_headers(headers) or None
        return await super()._process_headers(headers)

    def headers_of(self, raw: bytes) -> dict[str, str] | None:
        """A message's raw header block read as `_process_headers` reads it (None: no headers), at once.

        For direct handlers. An inline status block (``NATS/1.0 204 EOB``) goes to nats-py's own
        parser, a coroutine that never waits: it is run to its end right here.
        """
        if not raw:
            return None
        if raw.startswith(b"NATS/1.0\r\n"):
            return parse_headers(raw) or None
        reading = Client._process_headers(self, raw)
        try:
            reading.send(None)
        except StopIteration as done:
            parsed: dict[str, str] | None = done.value
            return parsed
        reading.close()
        raise InternalError("nats-py's header parser waited for something: it cannot be read at once")

    async def publish_prepared(self, subject: str, reply: str, header: bytes, payload: bytes) -> None:
        """`publish` of a complete header block (``NATS/1.0`` line to blank line) built by the caller.

        The subject, reply subject and header values must already be valid: nothing is checked here.
        """
        if self.is_closed:
            raise nats.errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not self.is_connected:  # buffering while reconnecting has limits: nats-py's publish keeps them
            await self.publish(subject, payload, reply=reply, headers=parse_headers(header))
            return
        if len(payload) > self._max_payload:
            raise nats.errors.MaxPayloadError
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(payload)
        await self._send_command(
            b"HPUB %s %s %d %d\r\n%s%s\r\n"
            % (subject.encode(), reply.encode(), len(header), len(header) + len(payload), header, payload)
        )
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    def send_now(self, subject: str, reply: str, header: bytes, payload: bytes) -> bool:
        """`publish_prepared` (or a plain publish, with `header` b"" and `reply` "") without awaiting.

        On the connection's loop only. False, with nothing sent, whenever nats-py's own publish
        would have to check, buffer or wait: not connected, draining, over `max_payload`, the
        pending buffer at its limit, no flusher task. The caller then takes the awaited way.
        """
        flush_queue = self._flush_queue
        if (
            self._status != Client.CONNECTED  # (draining or reconnecting: nats-py's publish decides)
            or flush_queue is None
            or self._flusher_task is None
            or self._flusher_task.done()
            or len(payload) > self._max_payload
        ):
            return False
        if header:
            command = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(),
                reply.encode(),
                len(header),
                len(header) + len(payload),
                header,
                payload,
            )
        elif reply:
            command = b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(payload), payload)
        else:
            command = b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)
        size = self._pending_data_size + len(command)
        if self._max_pending_size > 0 and size > self._max_pending_size:
            return False  # nats-py flushes and waits here: the awaited way does
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(payload)
        self._pending.append(command)
        self._pending_data_size = size
        if flush_queue.empty():  # kick the flusher (it writes whatever is pending by the time it runs)
            kick = self._kick
            if kick is None:  # one future, done at once: the flusher settles only what nobody has
                kick = self._kick = asyncio.get_running_loop().create_future()
                kick.set_result(None)
            flush_queue.put_nowait(kick)
        return True

    async def subscribe_direct(self, subject: str, handler: DirectHandler) -> Subscription:
        """Subscribe with `handler` called for each message on the loop, as the message is read.

        `handler` must be quick and must not raise; it gets the raw header block (b"" for none).
        """
        subscription = await self.subscribe(subject)
        self._direct[subscription._id] = handler
        return subscription

    async def subscribe_requests(self, subject: str, queue: str, handler: RequestHandler) -> Subscription:
        """Subscribe (in `queue`'s group, "" for none) with `handler` called for each message on the
        loop as it is read, with its reply subject (b"" for none): no `Msg`, no queue, no task wake.

        `handler` must not block and must not raise. A request's headers are not read. Draining the
        subscription ends it once the server sent its last message: each was handled as it came.
        """
        subscription = await self.subscribe(subject, queue=queue)
        self._requests[subscription._id] = handler
        return subscription

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        """A subscription ended (unsubscribed, drained): its direct or request handler goes with it
        (a read's subscription lives for one read: kept, they would pile up)."""
        self._direct.pop(sid, None)
        self._requests.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            served = self._requests.get(sid)
            if served is None or sid not in self._subs:
                self._requests.pop(sid, None)
                await super()._process_msg(sid, subject, reply, data, headers)
                return
            self.stats["in_msgs"] += 1
            self.stats["in_bytes"] += len(data)
            try:
                served(subject, reply, data)
            except Exception:  # never into nats-py's read loop, which would drop the connection
                _log.exception("a handler of subscription %s failed", sid)
            return
        if sid not in self._subs:
            self._direct.pop(sid, None)
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(subject, data, headers or b"")
        except Exception:  # never into nats-py's read loop, which would drop the connection
            _log.exception("a handler of subscription %s failed", sid)
