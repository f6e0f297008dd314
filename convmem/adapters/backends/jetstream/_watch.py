"""What a NATS server tells a connection outside any reply: refused subjects and reconnections.

The server answers a publish these credentials may not make (or a
subscription they may not hold) with an asynchronous permissions error, not
a reply. `ConnectionWatch` is the connection's error callback: a request
waiting on such a subject (`request_denied`, or `expect`) fails at once with
`PermissionDenied` naming it, instead of timing out as a server that is down
would; listeners are told of each reconnection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import nats.errors
from nats.aio.client import Client

from convmem.adapters._auth import scrub
from convmem.errors import PermissionDenied

__all__ = ["ConnectionWatch", "describe", "publish_denied", "request_denied"]

_log = logging.getLogger("convmem.nats")
_DENIED = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)
_REFUSALS_KEPT = 64


def describe(exc: BaseException) -> str:
    """An exception as one short phrase."""
    return str(exc) or type(exc).__name__


class ConnectionWatch:
    """What the server tells a connection outside any reply: refused subjects, reconnections.

    The server answers a publish these credentials may not make with an
    asynchronous permissions error, not a reply; a request waiting on such
    a subject fails at once with `PermissionDenied` naming it (`expect`).
    Listeners added with `on_reconnect` are told each reconnection (on the loop).
    """

    def __init__(self, secrets: tuple[str, ...] = (), inbox_prefix: str | None = None) -> None:
        self.secrets = secrets
        self.inbox_prefix = (inbox_prefix or "_INBOX").lower()
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._spelled: dict[str, str] = {}
        """Subjects waited on, as written, by their lowercased form."""
        self.refused: OrderedDict[str, str] = OrderedDict()
        """Subjects refused lately, by lowercased subject (nats-py lowercases the error)."""
        self._reconnect: list[Callable[[], None]] = []
        self.closing = False
        """Set by the connection's owner as it closes: nats-py reports a close as a disconnection."""

    def on_reconnect(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` on the loop after each reconnection; returns what removes it."""
        self._reconnect.append(listener)
        return lambda: self._reconnect.remove(listener) if listener in self._reconnect else None

    @contextlib.contextmanager
    def expect(self, subject: str) -> Iterator[asyncio.Future[None]]:
        """A future failed with `PermissionDenied` if the server refuses `subject` meanwhile."""
        denied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiting.setdefault(subject.lower(), set())
        waiters.add(denied)
        self._spelled[subject.lower()] = subject
        try:
            yield denied
        finally:
            waiters.discard(denied)
            if not waiters:
                self._waiting.pop(subject.lower(), None)
                self._spelled.pop(subject.lower(), None)
            if not denied.done():
                denied.cancel()

    async def error_cb(self, exc: Exception) -> None:
        match = _DENIED.search(str(exc))
        if match is None:
            _log.warning("NATS connection error: %s", scrub(describe(exc), self.secrets))
            return
        kind, subject = match.group(1).lower(), match.group(2)
        subject = self._spelled.get(subject.lower(), subject)  # nats-py lowercases the server's words
        self.refused[subject.lower()] = subject
        while len(self.refused) > _REFUSALS_KEPT:
            self.refused.popitem(last=False)
        if kind == "publish":
            message = f"the NATS server refused these credentials permission to publish to {subject!r}"
            waiters = list(self._waiting.get(subject.lower(), ()))
        elif subject.lower().startswith(self.inbox_prefix):  # replies cannot come back: every request fails
            message = (
                f"the NATS server refused these credentials permission to subscribe to {subject!r}, "
                "where replies come back; set an inbox prefix they may use (--inbox-prefix)"
            )
            waiters = [w for group in self._waiting.values() for w in group]
        else:
            message = f"the NATS server refused these credentials permission to subscribe to {subject!r}"
            waiters = []
        _log.warning("%s", message)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(PermissionDenied(message, subject=subject))

    async def disconnected_cb(self) -> None:
        if not self.closing:
            _log.info("disconnected from NATS; reconnecting")

    async def reconnected_cb(self) -> None:
        _log.info("reconnected to NATS")
        for listener in list(self._reconnect):
            try:
                listener()
            except Exception:
                _log.exception("a reconnection listener failed")


async def answered_first(request: asyncio.Future[Any], denied: asyncio.Future[None]) -> bool:
    """Wait for `request` or its refusal; True when the request finished first.

    A caller cancelled meanwhile takes the request with it: it is cancelled and its outcome read,
    so no request is left to time out on its own with an exception nobody retrieves.
    """
    try:
        done, _ = await asyncio.wait({request, denied}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        request.cancel()
        request.add_done_callback(lambda gone: None if gone.cancelled() else gone.exception())
        raise
    return request in done


async def publish_denied(
    js: Any, watch: ConnectionWatch, subject: str, data: bytes, headers: dict[str, str]
) -> Any:
    """`js.publish` (JetStream: its ack), failing at once with `PermissionDenied` when the server
    refuses the subject."""
    return await _unless_denied(watch, subject, lambda: js.publish(subject, data, headers=headers))


async def request_denied(
    nc: Client, watch: ConnectionWatch, subject: str, payload: bytes, timeout: float
) -> Any:
    """`nc.request`, failing at once with `PermissionDenied` when the server refuses the subject."""
    return await _unless_denied(watch, subject, lambda: nc.request(subject, payload, timeout=timeout))


async def _unless_denied(watch: ConnectionWatch, subject: str, send: Callable[[], Awaitable[Any]]) -> Any:
    """What `send()` (a publish or request on `subject`) returns, or `PermissionDenied` once the server
    refuses the subject first: the send is then cancelled and its outcome read."""
    with watch.expect(subject) as denied:
        sending = asyncio.ensure_future(send())
        if not await answered_first(sending, denied):
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                await sending
            denied.result()
        return sending.result()
