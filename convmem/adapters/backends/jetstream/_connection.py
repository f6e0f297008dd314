"""One NATS connection on its own loop thread, shared by the JetStream log and snapshot store.

Everything that touches nats-py runs on the loop; the adapters' synchronous
methods wait on it through `call`, always with a timeout. The connection is
leased: the log and the snapshot store each hold a lease and the connection
closes when the last lease is released (or when it is closed outright).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypedDict, TypeVar, Unpack

import msgspec
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from convmem.actors import Settle
from convmem.actors._bounds import check_timeout
from convmem.adapters._auth import NatsAuth, redact_url, scrub, url_secrets
from convmem.adapters._loop_thread import EventLoopThread, Start
from convmem.adapters.backends.jetstream._client import NatsClient, close_quietly, parse_headers
from convmem.adapters.backends.jetstream._watch import ConnectionWatch, describe, request_denied
from convmem.errors import ConvmemError, InvalidInput, InvalidKey, LogUnavailable, SessionClosed, StoreFull

__all__ = [
    "DEFAULT_MAX_CONTROL_LINE",
    "MIN_SERVER_VERSION",
    "ConnectionOptions",
    "NatsConnection",
    "StoredMessage",
    "log_error",
    "parse_headers",
    "unavailable",
]

T = TypeVar("T")

DEFAULT_MAX_CONTROL_LINE = 4096
"""nats-server's default; the embedded server allows more, enough for the longest ids."""
_CONTROL_OVERHEAD = 160  # "HPUB", the reply inbox and the sizes around the subject

MIN_SERVER_VERSION = (2, 12)
"""Atomic batch publish (one append of several events is all or nothing) came in 2.12."""

_log = logging.getLogger("convmem.nats")
_HDR_LINE = b"NATS/1.0"


class StoredMessage(msgspec.Struct, frozen=True):
    """A stream message as a get or a direct get returns it."""

    subject: str
    seq: int
    headers: dict[str, str]
    data: bytes


def server_list(url: str) -> list[str]:
    """The servers of a URL option: one URL, or several separated by commas (a cluster)."""
    return [u.strip() for u in url.split(",") if u.strip()]


_STORE_FULL = frozenset({10023, 10028, 10047})
"""Insufficient resources; memory, storage resources exceeded (a server's or account's store is full)."""
_STREAM_LIMIT = 10077
"""A stream store failure; "maximum bytes/messages exceeded" when a stream that discards new is full."""


def unavailable(exc: BaseException, what: str) -> LogUnavailable | InvalidInput:
    """Turn a nats-py failure into the error that names its cause (the ports promise `LogUnavailable`).

    A full store is `StoreFull`; a message over the server's or stream's size
    limit is `InvalidInput` (a permanent error: retrying cannot help); anything
    else means the server could not be reached or did not answer.
    """
    if isinstance(exc, nats.errors.MaxPayloadError):
        return InvalidInput(
            "payload", f"{what}: the message is over the NATS server's max_payload; nothing was sent"
        )
    if isinstance(exc, nats.js.errors.APIError):
        detail = f"{exc.description or _describe(exc)} (code {exc.code}, err_code {exc.err_code})"
        code = exc.err_code
        if code in _STORE_FULL or (code == _STREAM_LIMIT and "maximum" in (exc.description or "")):
            return StoreFull(
                f"{what} failed: the JetStream store is full: {detail}; nothing was stored. Make room "
                "(purge or remove streams or messages, raise max_file_store or the stream's max_bytes), "
                "then retry: writes resume as soon as there is room. A server started without "
                "max_file_store sized its store from the disk's free space then: disk freed since "
                "counts only once nats-server restarts",
                err_code=code,
            )
        if code == _TOO_LARGE:
            return InvalidInput(
                "payload",
                f"{what}: {detail}: the message is over the stream's max_msg_size; nothing was stored",
            )
    else:
        detail = _describe(exc)
    return LogUnavailable(f"{what} failed: {detail}; check that nats-server is up with JetStream, then retry")


_TOO_LARGE = 10054
"""The message is over the stream's max_msg_size."""


class ConnectionOptions(TypedDict, total=False):
    """How `NatsConnection.connect` connects (each optional)."""

    timeout: float
    """Seconds to connect, and then for each call (default 5)."""
    max_control_line: int
    """The server's setting of that name: a publish whose subject would not fit is refused here,
    because the server answers one by dropping the whole connection (default 4096)."""
    name: str
    """The client's name, as the server shows it (default ``convmem``)."""
    auth: NatsAuth | None
    """Credentials and TLS settings (none: the URL's own, if any)."""


class NatsConnection:
    """A nats-py client, its JetStream context and the loop thread that owns them."""

    def __init__(
        self,
        loop: EventLoopThread,
        nc: NatsClient,
        js: JetStreamContext,
        *,
        url: str,
        timeout: float,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        watch: ConnectionWatch | None = None,
    ) -> None:
        self._loop = loop
        self.nc = nc
        self.js = js
        self.url = url
        self.watch = watch if watch is not None else ConnectionWatch(url_secrets(url))
        self.timeout = timeout
        self.max_control_line = max_control_line
        self._lock = threading.Lock()
        self._leases = 1  # the creator's
        self._closed = False
        self._closing: list[Callable[[], None]] = []

    @classmethod
    def connect(cls, url: str, **options: Unpack[ConnectionOptions]) -> NatsConnection:
        """Connect to `url` and check that JetStream is there; `LogUnavailable` if not.

        The connection runs on a loop thread of its own, which it stops when
        it closes: this is `connect_here` run on that thread.
        """
        timeout = options.get("timeout", 5.0)
        check_timeout(timeout)  # at most a day, before anything connects: longer overflowed a wait
        loop = EventLoopThread(name=f"{options.get('name', 'convmem')}-nats-loop")
        try:
            return loop.call(
                lambda: cls._made_on(loop, url, options), timeout=2 * timeout + 2.0, what="connect"
            )
        except BaseException:
            loop.stop()
            raise

    @classmethod
    async def connect_here(cls, url: str, **options: Unpack[ConnectionOptions]) -> NatsConnection:
        """`connect`, on the event loop running here: nats-py's I/O then shares this loop and thread.

        Blocking calls on the connection (the adapters' synchronous methods)
        must then come from other threads; on this one they raise.
        """
        timeout = options.get("timeout", 5.0)
        check_timeout(timeout)
        return await asyncio.wait_for(cls._made_on(EventLoopThread.here(), url, options), 2 * timeout + 2.0)

    @classmethod
    async def _made_on(cls, loop: EventLoopThread, url: str, options: ConnectionOptions) -> NatsConnection:
        """The connection to `url`, made on `loop` (which runs this coroutine) and kept there."""
        auth = options.get("auth") or NatsAuth()
        timeout = options.get("timeout", 5.0)
        watch = ConnectionWatch((*url_secrets(url), *auth.secrets), auth.inbox_prefix)
        nc, js = await _open(url, timeout, options.get("name", "convmem"), auth.options(), watch)
        max_control_line = options.get("max_control_line", DEFAULT_MAX_CONTROL_LINE)
        return cls(loop, nc, js, url=url, timeout=timeout, max_control_line=max_control_line, watch=watch)

    def on_loop_thread(self) -> bool:
        """Whether the caller is the connection's event loop thread."""
        return self._loop.on_loop_thread()

    def check_subject(self, subject: str, key: object) -> None:
        """Refuse to publish on a subject the server would drop the connection for."""
        size = len(subject.encode()) + _CONTROL_OVERHEAD
        if size > self.max_control_line:
            raise InvalidKey(
                "key",
                f"{key}'s subject makes a {size}-byte protocol line, over the server's max_control_line "
                f"of {self.max_control_line}; use shorter ids or raise max_control_line on the server "
                "(and pass it to convmem)",
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def on_close(self, hook: Callable[[], None]) -> None:
        """Call `hook()` on the loop once the connection is closed (drained): to settle what never will be."""
        self._closing.append(hook)

    def lease(self) -> None:
        """Take a share of the connection; `release` gives it back."""
        with self._lock:
            if self._closed:
                raise SessionClosed("the NATS connection is closed")
            self._leases += 1

    def release(self) -> None:
        """Give back a share; the last one closes the connection."""
        with self._lock:
            self._leases -= 1
            last = self._leases <= 0
        if last:
            self.close()

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], *, what: str, timeout: float | None = None) -> T:
        """Run `fn()` on the loop, waiting at most the timeout; nats-py errors become `LogUnavailable`."""
        if self._closed:
            raise SessionClosed("the NATS connection is closed")
        wait = self.timeout if timeout is None else timeout
        return self._loop.call(_guarded(fn, what), timeout=wait, what=what)

    def submit(self, fn: Callable[[], Coroutine[Any, Any, T]], *, what: str) -> concurrent.futures.Future[T]:
        """Schedule `fn()` without waiting; the caller waits on the future (`_loop.wait`)."""
        if self._closed:
            raise SessionClosed("the NATS connection is closed")
        return self._loop.submit(_guarded(fn, what))

    def post(self, start: Start, future: Settle[Any], *, what: str) -> None:
        """Start `start()` on the loop in a batch with other posted work (see `EventLoopThread.post`).

        nats-py errors raised while starting become `LogUnavailable`, as in `call` and `submit`.
        """
        if self._closed:
            raise SessionClosed("the NATS connection is closed")
        self._loop.post(_guarded(start, what), future)

    def start_here(self, start: Start, future: Settle[Any], *, what: str) -> None:
        """`post` from the loop's own thread, for work already started (`future` asked): a task of its own."""
        if self._closed:
            future.set_exception(SessionClosed("the NATS connection is closed"))
            return
        self._loop.start_here(_guarded(start, what), future)

    def close(self) -> None:
        """Drain and close the connection and stop the loop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.watch.closing = True

        async def shut() -> None:
            try:
                await asyncio.wait_for(self.nc.drain(), self.timeout)
            except Exception:  # a dead server: close without draining
                await close_quietly(self.nc)
            for hook in self._closing:
                try:
                    hook()
                except Exception:
                    _log.exception("a hook run as the NATS connection closed failed")

        try:
            self._loop.call(shut, timeout=self.timeout + 1.0, what="close")
        except ConvmemError:
            _log.warning("closing the NATS connection to %s timed out", redact_url(self.url))
        finally:
            self._loop.stop()

    async def api(
        self, subject: str, request: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """A JetStream API request (waiting `timeout`, else the connection's); an error reply raises
        nats-py's `APIError`."""
        payload = json.dumps(request).encode() if request is not None else b""
        wait = self.timeout if timeout is None else timeout
        msg = await request_denied(self.nc, self.watch, subject, payload, wait)
        reply: dict[str, Any] = json.loads(msg.data)
        if "error" in reply:
            error = reply["error"]
            raise nats.js.errors.APIError(
                code=error.get("code"), description=error.get("description"), err_code=error.get("err_code")
            )
        return reply

    async def get_message(self, stream: str, request: dict[str, Any]) -> StoredMessage | None:
        """A message by `STREAM.MSG.GET` (answered by the stream leader); None when there is none."""
        try:
            reply = await self.api(f"$JS.API.STREAM.MSG.GET.{stream}", request)
        except nats.js.errors.APIError as exc:
            if exc.err_code == 10037:  # no message found
                return None
            raise
        message = reply["message"]
        raw = base64.b64decode(message["hdrs"]) if message.get("hdrs") else b""
        return StoredMessage(
            subject=message["subject"],
            seq=int(message["seq"]),
            headers=parse_headers(raw) if raw.startswith(_HDR_LINE) else {},
            data=base64.b64decode(message.get("data") or b""),
        )


def log_error(exc: BaseException, what: str) -> BaseException:
    """The error a caller of the log sees for `exc`: nats-py failures become `LogUnavailable`."""
    if isinstance(exc, ConvmemError) or not isinstance(exc, TimeoutError | nats.errors.Error | OSError):
        return exc
    return unavailable(exc, what)


def _guarded(fn: Callable[[], Coroutine[Any, Any, T]], what: str) -> Callable[[], Coroutine[Any, Any, T]]:
    async def guarded() -> T:
        try:
            return await fn()
        except BaseException as exc:
            error = log_error(exc, what)
            if error is exc:
                raise
            raise error from None

    return guarded


async def _open(
    url: str, timeout: float, name: str, options: dict[str, Any], watch: ConnectionWatch
) -> tuple[NatsClient, JetStreamContext]:
    shown = redact_url(url)
    nc = NatsClient()
    try:
        await asyncio.wait_for(
            nc.connect(
                servers=server_list(url),
                name=name,
                connect_timeout=max(1, int(timeout)),
                allow_reconnect=True,
                max_reconnect_attempts=1,  # on the first connect only; unbounded once connected
                reconnect_time_wait=0.25,  # type: ignore[arg-type]  # nats-py annotates int, uses float
                error_cb=watch.error_cb,
                disconnected_cb=watch.disconnected_cb,
                reconnected_cb=watch.reconnected_cb,
                **options,
            ),
            timeout,
        )
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        await close_quietly(nc)
        raise LogUnavailable(
            f"cannot connect to NATS at {shown} ({scrub(_describe(exc), watch.secrets)}); check the URL "
            "and the credentials, and that nats-server runs with JetStream"
        ) from None
    nc.options["max_reconnect_attempts"] = -1
    try:
        version = nc.connected_server_version
        if (version.major, version.minor) < MIN_SERVER_VERSION:
            raise LogUnavailable(
                f"the NATS server at {shown} is version {version}; convmem needs nats-server "
                f"{MIN_SERVER_VERSION[0]}.{MIN_SERVER_VERSION[1]} or newer (atomic batch publish)"
            )
        js = nc.jetstream(timeout=timeout)
        try:
            await request_denied(nc, watch, "$JS.API.INFO", b"", timeout)
        except (TimeoutError, nats.errors.Error) as exc:
            raise LogUnavailable(
                f"the NATS server at {shown} does not answer JetStream requests "
                f"({scrub(_describe(exc), watch.secrets)}); enable JetStream (nats-server -js, or a "
                "jetstream block in its config)"
            ) from None
    except BaseException:
        await close_quietly(nc)
        raise
    return nc, js


def _describe(exc: BaseException) -> str:
    return describe(exc)
