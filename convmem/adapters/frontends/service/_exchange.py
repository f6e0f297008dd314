"""The client side of one request: encode, send, wait, and turn the reply into a result or an error.

`Exchange` runs on whatever loop runs its nats-py client. It also listens to
the client's error callback: the NATS server answers a subject these
credentials may not publish to (or a reply inbox they may not subscribe to)
with an asynchronous permissions error rather than a reply, and the requests
it concerns fail at once with `PermissionDenied` instead of timing out.

Replies come back on the inbox the service answers on (`_inboxes`): a
session request of tenant T on ``_INBOX_{token of T}.…``, an operator
request on ``_OPS_INBOX.…``, whatever the connection's own ``inbox_prefix``.
One wildcard subscription per inbox (`_Inbox`, made on first use) takes every
reply that comes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal, TypedDict

import msgspec
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.nuid import NUID

from convmem.actors._bounds import check_seconds
from convmem.adapters._auth import NatsAuth, redact_url, scrub, url_secrets
from convmem.adapters.backends.jetstream import answered_first, close_quietly, server_list
from convmem.adapters.frontends.service._errors import PermissionDenied, ServiceUnavailable, exception_of
from convmem.adapters.frontends.service._inboxes import reply_inbox
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, decode_reply, unrouted
from convmem.errors import InvalidInput, InvalidTurn, SessionClosed
from convmem.events import ConversationTurn, MessageItem
from convmem.projections import parse_export

__all__ = [
    "GRACE",
    "ClientOptions",
    "Encoding",
    "Exchange",
    "deadlines",
    "items_fields",
    "nats_options",
    "open_client",
    "state_fields",
    "turn_fields",
]

Encoding = Literal["json", "msgpack"]


class ClientOptions(TypedDict, total=False):
    """How a client of the service connects and speaks (each optional)."""

    api_prefix: str
    """The service's subject prefix (default ``convmem.api``)."""
    inbox_prefix: str | None
    """The connection's own inbox prefix (nats-py's); the service's replies come back on the requester's
    inbox whatever it is (``_INBOX_<tenant>`` for a session, ``_OPS_INBOX`` for an operator request)."""
    encoding: Encoding
    """``json`` (default) or ``msgpack`` requests."""
    connect_options: Mapping[str, Any] | None
    """Keywords for nats-py's ``connect``, as they are."""
    auth: NatsAuth | None
    """Credentials and TLS settings (a credentials file, an nkey seed, TLS files, the inbox prefix)."""


def nats_options(options: ClientOptions) -> dict[str, Any]:
    """nats-py's ``connect`` keywords: the credentials' (each file checked now), then `connect_options`."""
    auth = options.get("auth")
    return {**(auth.options() if auth is not None else {}), **(options.get("connect_options") or {})}


GRACE = 0.5
"""Seconds between the service's deadline and the client's, so the service's answer arrives first."""

_NO_RESPONDERS = "503"


class _Inbox:
    """One reply inbox: a wildcard subscription ``{prefix}.{nuid}.*``, a future per request."""

    def __init__(self, prefix: str, nuid: NUID) -> None:
        self.prefix = f"{prefix}.{nuid.next().decode()}."
        self.waiting: dict[str, asyncio.Future[Msg]] = {}
        self.sub: Subscription | None = None
        self.denied: str | None = None
        self._nuid = nuid
        self._count = 0

    async def open(self, nc: Client) -> None:
        if self.sub is None:
            self.sub = await nc.subscribe(self.prefix + "*", cb=self._on_reply)

    def expect(self) -> tuple[str, asyncio.Future[Msg]]:
        self._count += 1
        token = f"{self._count:x}"
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        future.add_done_callback(lambda _f: self.waiting.pop(token, None))
        return self.prefix + token, future

    async def _on_reply(self, msg: Msg) -> None:
        future = self.waiting.get(msg.subject[len(self.prefix) :])
        if future is not None and not future.done():
            future.set_result(msg)


_DENIED = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)
_encoders: dict[str, Callable[[Any], bytes]] = {
    "json": msgspec.json.Encoder().encode,
    "msgpack": msgspec.msgpack.Encoder().encode,
}


class Exchange:
    """Requests and replies over one nats-py client, on the loop that runs it."""

    def __init__(self, nc: Client, *, encoding: Encoding, api_prefix: str = DEFAULT_API_PREFIX) -> None:
        if encoding not in _encoders:
            raise InvalidInput("encoding", f"must be 'json' or 'msgpack', got {encoding!r}")
        self.nc = nc
        self.api_prefix = api_prefix
        self._encode = _encoders[encoding]
        # Subjects the server refused, by lowercased subject (nats-py lowercases the error).
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._inboxes: dict[str, _Inbox] = {}
        self._nuid = NUID()

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        encoding: Encoding = "json",
        name: str,
        inbox_prefix: str | None = None,
        timeout: float,
        connect_options: Mapping[str, Any],
        api_prefix: str = DEFAULT_API_PREFIX,
    ) -> Exchange:
        """Connect to `url`, the client's error callback feeding the new exchange's `on_error`."""
        made: list[Exchange] = []

        async def on_error(exc: Exception) -> None:
            if made:
                await made[0].on_error(exc)

        nc = await open_client(
            url,
            name=name,
            inbox_prefix=inbox_prefix,
            timeout=timeout,
            exchange_errors=on_error,
            connect_options=connect_options,
        )
        made.append(cls(nc, encoding=encoding, api_prefix=api_prefix))
        return made[0]

    async def close(self, timeout: float) -> None:
        """Drain the client (replies in flight arrive), or close it when draining fails."""
        try:
            await asyncio.wait_for(self.nc.drain(), timeout)
        except Exception:
            await close_quietly(self.nc)

    async def on_error(self, exc: Exception) -> None:
        """nats-py's error callback: a refused subject fails the requests it concerns at once."""
        match = _DENIED.search(str(exc))
        if match is None:
            return
        kind, subject = match.group(1).lower(), match.group(2)
        waiters: list[asyncio.Future[Any]]
        if kind == "publish":
            waiters = list(self._waiting.get(subject.lower(), ()))
            message = (
                f"the NATS server refused to let these credentials publish to {subject!r}; "
                "a tenant's credentials may only address its own sessions"
            )
        else:  # a client subscribes to its reply inboxes only
            denied = subject.lower()
            inbox = next((i for i in self._inboxes.values() if (i.prefix + "*").lower() == denied), None)
            if inbox is None:
                return
            subject = inbox.prefix + "*"  # as sent (the server's error may have lowercased it)
            waiters = list(inbox.waiting.values())
            message = (
                f"the NATS server refused to let these credentials subscribe to {subject!r}, where the "
                f"service's replies come back; allow them to subscribe to {inbox.prefix.split('.')[0]}.> "
                "(a tenant's credentials: _INBOX_<tenant token>.>, an operator's: _OPS_INBOX.>)"
            )
            inbox.denied = message
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(PermissionDenied(message, subject=subject))

    async def _inbox(self, prefix: str) -> _Inbox:
        inbox = self._inboxes.get(prefix)
        if inbox is None:
            inbox = self._inboxes[prefix] = _Inbox(prefix, self._nuid)
        await inbox.open(self.nc)
        return inbox

    async def _request(self, inbox: _Inbox, subject: str, payload: bytes, wait: float) -> Msg:
        """nats-py's request, replies on `inbox`: the reply, `NoRespondersError` or `TimeoutError`."""
        reply, future = inbox.expect()
        try:
            await self.nc.publish(subject, payload, reply=reply)
            msg = await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise nats.errors.TimeoutError from None
        finally:
            future.cancel()
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS and not msg.data:
            raise nats.errors.NoRespondersError
        return msg

    async def call(self, subject: str, fields: Mapping[str, Any], wait: float) -> Any:
        """Send one request and return the reply's result, or raise what the reply stands for."""
        inbox = await self._inbox(reply_inbox(self.api_prefix, subject))
        if inbox.denied is not None:
            raise PermissionDenied(inbox.denied)
        try:
            payload = self._encode(fields)
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInput("request", f"cannot be encoded: {exc}") from None
        denied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watchers = self._waiting.setdefault(subject.lower(), set())
        watchers.add(denied)
        request = asyncio.ensure_future(self._request(inbox, subject, payload, wait))
        try:
            if not await answered_first(request, denied):
                request.cancel()
                with contextlib.suppress(asyncio.CancelledError, nats.errors.Error):
                    await request
                denied.result()  # raises PermissionDenied
            msg = request.result()
        except nats.errors.NoRespondersError:
            plain = unrouted(subject)
            if plain is not None:  # no worker owns the partition right now (one is taking it over)
                return await self.call(plain, fields, wait)
            raise ServiceUnavailable(
                f"no convmem service is subscribed to {subject!r}; start one (`convmem serve`) "
                "or check the api_prefix"
            ) from None
        except nats.errors.TimeoutError:
            raise ServiceUnavailable(
                f"no reply on {subject!r} within {wait:g}s; the convmem service may be down or overloaded "
                "(a write may still complete: retry with the same idempotency_key)"
            ) from None
        except nats.errors.MaxPayloadError:
            problem = (
                f"makes a request of {len(payload):,} bytes, over the server's max_payload of "
                f"{self.nc.max_payload:,}; nothing was sent"
            )
            carried = next((name for name in ("turn", "items") if name in fields), None)
            if carried is not None:  # a turn too large to send: permanent, as in process
                raise InvalidTurn(carried, problem) from None
            raise InvalidInput("request", problem) from None
        except nats.errors.Error as exc:
            raise SessionClosed(f"the connection to the convmem service failed: {exc}") from None
        finally:
            watchers.discard(denied)
            if not watchers:
                self._waiting.pop(subject.lower(), None)
            if not denied.done():
                denied.cancel()
        reply = decode_reply(msg.data)
        if not reply.ok:
            if reply.error is None:
                raise ServiceUnavailable("the service sent an error reply without an error")
            raise exception_of(reply.error)
        return reply.result


async def open_client(
    url: str,
    *,
    name: str,
    inbox_prefix: str | None,
    timeout: float,
    exchange_errors: Callable[[Exception], Coroutine[Any, Any, None]],
    connect_options: Mapping[str, Any],
) -> Client:
    user_error_cb = connect_options.get("error_cb")

    async def error_cb(exc: Exception) -> None:
        await exchange_errors(exc)
        if user_error_cb is not None:
            await user_error_cb(exc)

    options: dict[str, Any] = {
        "name": name,
        "connect_timeout": max(1, int(timeout)),
        "allow_reconnect": True,
        "max_reconnect_attempts": 1,  # on the first connect only; unbounded once connected
        "reconnect_time_wait": 0.25,
    }
    options.update(connect_options)
    options["error_cb"] = error_cb
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    try:
        nc = await asyncio.wait_for(nats.connect(servers=server_list(url), **options), timeout + 1.0)
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        secrets = (*url_secrets(url), *(str(options[k]) for k in ("password", "token") if options.get(k)))
        detail = scrub(str(exc) or type(exc).__name__, secrets)
        raise ServiceUnavailable(
            f"cannot connect to NATS at {redact_url(url)} ({detail}); check the URL and credentials"
        ) from None
    nc.options["max_reconnect_attempts"] = connect_options.get("max_reconnect_attempts", -1)
    return nc


def deadlines(wait: float) -> tuple[float, float]:
    """(seconds the client waits, seconds the service may take); `InvalidInput` unless `wait` is above 0
    and at most a day (a longer wait overflowed time_t)."""
    wait = check_seconds("timeout", wait, error=InvalidInput)
    return wait, max(wait - GRACE, wait / 2)


def turn_fields(turn: object, idempotency_key: str | None) -> dict[str, Any]:
    if not isinstance(turn, ConversationTurn):
        raise InvalidTurn("turn", f"must be a ConversationTurn, got {type(turn).__name__}")
    return {"turn": turn, "idempotency_key": idempotency_key}


def items_fields(items: Sequence[Mapping[str, Any] | MessageItem]) -> dict[str, Any]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidTurn("items", f"must be a list of items, got {type(items).__name__}")
    for i, item in enumerate(items):  # the checks the service makes, before JSON turns a NaN into null
        if not isinstance(item, MessageItem):
            MessageItem.from_agents(item, field=f"items[{i}]")
    return {"items": [item.to_agents() if isinstance(item, MessageItem) else item for item in items]}


def state_fields(state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise InvalidInput("state", f"must be a mapping, got {type(state).__name__}")
    parse_export(state)  # the service's checks, before JSON turns a NaN into null
    return {"state": dict(state)}
