"""nats-py's client with the shortcuts convmem's hot paths take through its internals.

`NatsClient` overrides and calls private parts of nats-py 2.x's `Client`
(`_process_headers`, `_process_msg`, `_send_command`, `_flush_pending`,
`_flush_queue`, `_max_payload`, `_subs`, `stats`, `Subscription._id`). The
dependency on nats-py is bounded below 3 in pyproject.toml, and
tests/test_patched_internals.py fails, naming the internal, when one of them
changes shape in the installed nats-py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

__all__ = ["DirectHandler", "NatsClient", "close_quietly", "parse_headers"]

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


class NatsClient(Client):
    """nats-py's client with three shortcuts for convmem's hot paths (nats-py 2.x internals).

    - Plain header blocks are parsed faster. nats-py checks every header name
      character by character; a stream read brings ~9 headers per message and
      spent most of its time there. Blocks with an inline status
      (``NATS/1.0 404``) still go to nats-py's parser.
    - `publish_prepared` sends a header block the caller built from checked
      parts, without nats-py's per-header checks and encoding.
    - A `subscribe_direct` subscription hands each message to a plain function
      as it is parsed: no `Msg`, no queue, no task wake per message (acks).
    """

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}

    async def _process_headers(self, headers: bytes | None) -> dict[str, str] | None:
        if headers and headers.startswith(b"NATS/1.0\r\n"):
            return parse_headers(headers) or None
        return await super()._process_headers(headers)

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

    async def subscribe_direct(self, subject: str, handler: DirectHandler) -> Subscription:
        """Subscribe with `handler` called for each message on the loop, as the message is read.

        `handler` must be quick and must not raise; it gets the raw header block (b"" for none).
        """
        subscription = await self.subscribe(subject)
        self._direct[subscription._id] = handler
        return subscription

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:
        handler = self._direct.get(sid)
        if handler is None or sid not in self._subs:
            self._direct.pop(sid, None)
            await super()._process_msg(sid, subject, reply, data, headers)
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(subject, data, headers or b"")
        except Exception:  # never into nats-py's read loop, which would drop the connection
            _log.exception("a handler of subscription %s failed", sid)
