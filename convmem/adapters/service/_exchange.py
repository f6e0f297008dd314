"""The client side of one request: encode, send, wait, and turn the reply into a result or an error.

`Exchange` runs on whatever loop runs its nats-py client. It also listens to
the client's error callback: the NATS server answers a subject these
credentials may not publish to (or a reply inbox they may not subscribe to)
with an asynchronous permissions error rather than a reply, and the requests
it concerns fail at once with `PermissionDenied` instead of timing out.
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

from convmem.adapters._auth import NatsAuth, redact_url, scrub, url_secrets
from convmem.adapters.jetstream._client import close_quietly
from convmem.adapters.jetstream._connection import server_list
from convmem.adapters.service._errors import PermissionDenied, ServiceUnavailable, exception_of
from convmem.adapters.service._protocol import decode_reply, unrouted
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
    """Where replies come back (say ``_INBOX_acme``, for credentials confined to a tenant's subjects)."""
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

_DENIED = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE)
_encoders: dict[str, Callable[[Any], bytes]] = {
    "json": msgspec.json.Encoder().encode,
    "msgpack": msgspec.msgpack.Encoder().encode,
}


class Exchange:
    """Requests and replies over one nats-py client, on the loop that runs it."""

    def __init__(self, nc: Client, *, encoding: Encoding) -> None:
        if encoding not in _encoders:
            raise InvalidInput("encoding", f"must be 'json' or 'msgpack', got {encoding!r}")
        self.nc = nc
        self._encode = _encoders[encoding]
        # Subjects the server refused, by lowercased subject (nats-py lowercases the error).
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._inbox_denied: str | None = None

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
        made.append(cls(nc, encoding=encoding))
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
        if kind == "publish":
            waiters = list(self._waiting.get(subject.lower(), ()))
            message = (
                f"the NATS server refused to let these credentials publish to {subject!r}; "
                "a tenant's credentials may only address its own sessions"
            )
        else:  # the only subscription of a client is its reply inbox
            waiters = [w for group in self._waiting.values() for w in group]
            message = (
                f"the NATS server refused to let these credentials subscribe to {subject!r}, where "
                "replies come back; connect with an inbox_prefix they may subscribe to (say _INBOX_<tenant>)"
            )
            self._inbox_denied = message
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(PermissionDenied(message, subject=subject))

    async def call(self, subject: str, fields: Mapping[str, Any], wait: float) -> Any:
        """Send one request and return the reply's result, or raise what the reply stands for."""
        if self._inbox_denied is not None:
            raise PermissionDenied(self._inbox_denied)
        try:
            payload = self._encode(fields)
        except (TypeError, msgspec.EncodeError) as exc:
            raise InvalidInput("request", f"cannot be encoded: {exc}") from None
        denied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watchers = self._waiting.setdefault(subject.lower(), set())
        watchers.add(denied)
        request = asyncio.ensure_future(self.nc.request(subject, payload, timeout=wait))
        waits: set[asyncio.Future[Any]] = {request, denied}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if request not in done:
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
    """(seconds the client waits, seconds the service may take)."""
    if not wait > 0:
        raise InvalidInput("timeout", f"must be a number of seconds > 0, got {wait!r}")
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
