"""Clients of the convmem NATS service: the session API of a local handle, across the network.

```python
with RemoteSession("nats://127.0.0.1:4222", MemoryKey("acme", "alice", "chat-1")) as session:
    session.add_turn(ConversationTurn(user_message="Hi", assistant_response="Hello"))
    context = session.get_llm_context()
```

* `RemoteMemory`: one connection (on its own loop thread) for many sessions,
  plus the operator requests; `RemoteSession`: the blocking handle;
  `AsyncRemoteSession` (``_requests``): the asyncio handle (on the caller's loop).
* Each operation is written once, as a coroutine (``_requests``). A blocking
  method is derived from it (`blocking`): the coroutine runs on the
  connection's loop while the caller's thread waits; `awaiting` derives the
  method that awaits it from any other event loop.
* An error reply is raised as the exception the session would have raised in
  process: same class, message and fields (`InvalidTurn.field`,
  `MemoryBudgetExceeded.tokens`, ...).
* No service subscribed, or no reply in time: `ServiceUnavailable` (an
  `OperationTimeout`). A subject the server refuses to these credentials:
  `PermissionDenied`, as soon as the server says so.
* `timeout` is how long a call waits; the service is told to give up a
  little earlier, so a slow write comes back as a structured `OperationTimeout`.
* Replies come back on the requester's own inbox (``_INBOX_<tenant token>``
  for a session, ``_OPS_INBOX`` for an operator request; `_inboxes`), the only
  inboxes the service answers on: a tenant's credentials need subscribe
  permission there and nowhere else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.frontends.service._errors import ServiceUnavailable
from convmem.adapters.frontends.service._exchange import ClientOptions, Exchange, deadlines, nats_options
from convmem.adapters.frontends.service._protocol import (
    DEFAULT_API_PREFIX,
    check_api_prefix,
    operator_subject,
    session_subject,
)
from convmem.adapters.frontends.service._requests import AsyncRemoteSession, SessionRequests, session_request
from convmem.errors import ConvmemError, InvalidInput, SessionClosed
from convmem.events import MemoryHealth, MemoryKey

__all__ = ["AsyncRemoteSession", "OnConnection", "RemoteMemory", "RemoteSession", "awaiting", "blocking"]

_log = logging.getLogger("convmem.service")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

_SLACK = 2.0
"""Seconds a caller waits for the loop beyond a request's own wait (which the loop enforces)."""


class RemoteMemory:
    """A connection to the convmem service, shared by the `RemoteSession`s it hands out.

    `options` (`ClientOptions`): the service's `api_prefix`, the reply
    `inbox_prefix`, the `encoding`, `auth` (credentials and TLS settings) and
    `connect_options` for nats-py's ``connect`` as they are.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        name: str = "convmem-client",
        **options: Unpack[ClientOptions],
    ) -> None:
        self.url = url
        connect_options = nats_options(options)
        self.api_prefix = check_api_prefix(options.get("api_prefix", DEFAULT_API_PREFIX))
        self.timeout = deadlines(timeout)[0]
        self._loop = EventLoopThread(name=f"{name}-loop")
        self._closed = False
        try:
            self._exchange = self.run(
                lambda: Exchange.connect(
                    url,
                    encoding=options.get("encoding", "json"),
                    name=name,
                    inbox_prefix=options.get("inbox_prefix"),
                    timeout=self.timeout,
                    connect_options=connect_options,
                    api_prefix=self.api_prefix,
                ),
                wait=self.timeout,
                what="connect",
            )
        except BaseException:
            self._loop.stop()
            raise

    def run(self, work: Callable[[], Coroutine[Any, Any, T]], *, wait: float, what: str) -> T:
        """Run `work()` on this connection's loop; wait here (a thread) for its result.

        `wait` is what the work itself may take: past it and a little slack,
        `ServiceUnavailable`; the connection closing under it, `SessionClosed`.
        """
        future = self._loop.submit(work)
        try:
            return future.result(wait + _SLACK)
        except ConvmemError:  # raised by `work` (some are TimeoutErrors too: not our wait's)
            raise
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServiceUnavailable(
                f"{what} got no answer within {wait + _SLACK:g}s; NATS may be down"
            ) from None
        except concurrent.futures.CancelledError:
            raise SessionClosed(f"{what} was cancelled: the connection closed") from None

    async def arun(self, work: Callable[[], Coroutine[Any, Any, T]], *, wait: float, what: str) -> T:
        """`run`, awaited from any event loop: the work still runs on this connection's loop."""
        future = self._loop.submit(work)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), wait + _SLACK)
        except ConvmemError:
            raise
        except TimeoutError:
            raise ServiceUnavailable(
                f"{what} got no answer within {wait + _SLACK:g}s; NATS may be down"
            ) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled, not the request
            raise SessionClosed(f"{what} was cancelled: the connection closed") from None

    async def request(self, subject: str, fields: Mapping[str, Any], wait: float) -> Any:
        """One request on `subject`, on this connection's loop: the reply's result, or its error raised."""
        self.check_open()
        return await self._exchange.call(subject, fields, wait)

    def call(self, subject: str, fields: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """One request on `subject` (blocking); the reply's result, or its error raised."""
        wait = self._wait(timeout)
        return self.run(lambda: self.request(subject, fields, wait), wait=wait, what=subject)

    async def acall(self, subject: str, fields: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """`call` from any asyncio loop: the request runs on this connection's own loop."""
        wait = self._wait(timeout)
        return await self.arun(lambda: self.request(subject, fields, wait), wait=wait, what=subject)

    def _wait(self, timeout: float | None) -> float:
        self.check_open()
        return deadlines(timeout if timeout is not None else self.timeout)[0]

    def check_open(self) -> None:
        """`SessionClosed` once this connection is closed."""
        if self._closed:
            raise SessionClosed("this RemoteMemory is closed")

    def session(self, key: MemoryKey, *, timeout: float | None = None) -> RemoteSession:
        """A blocking handle on the session `key` over this connection."""
        return RemoteSession(self, key, timeout=timeout)

    def service_health(self) -> dict[str, Any]:
        """The operator health report of the first service instance to answer."""
        result: dict[str, Any] = self.call(operator_subject(self.api_prefix, "health"), {})
        return result

    def service_metrics(self) -> dict[str, Any]:
        """The operator metrics of the first service instance to answer."""
        result: dict[str, Any] = self.call(operator_subject(self.api_prefix, "metrics"), {})
        return result

    def sessions(self, tenant_id: str, user_id: str | None = None, *, limit: int | None = None) -> list[Any]:
        """The tenant's sessions (of one user), with events, last activity and health: at most 1,000
        (`MalformedRequest` naming ``limit`` past that without a limit: see `sessions_page`)."""
        subject = session_subject(self.api_prefix, tenant_id, "sessions")
        result: list[Any] = self.call(subject, {"user_id": user_id or "", "limit": limit})
        return result

    def sessions_page(
        self,
        tenant_id: str,
        user_id: str | None = None,
        *,
        after: Mapping[str, str] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page of the tenant's sessions (of one user) in key order: those past `after` (a page's
        ``after``; None for the first page), at most `limit` (at most 1,000, the default).

        ``{"sessions": [...], "more": bool, "after": cursor or None}``: while ``more``, pass
        ``after`` back for the next page.
        """
        subject = session_subject(self.api_prefix, tenant_id, "sessions")
        cursor = dict(after) if isinstance(after, Mapping) else after
        result: dict[str, Any] = self.call(
            subject, {"user_id": user_id or "", "limit": limit, "after": cursor}
        )
        return result

    def all_sessions(
        self, tenant_id: str, user_id: str | None = None, *, page_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every session of the tenant (of one user) in key order, a page of `sessions_page` a request."""
        after: Mapping[str, str] | None = None
        while True:
            page = self.sessions_page(tenant_id, user_id, after=after, limit=page_size)
            yield from page["sessions"]
            if not page["more"]:
                return
            after = page["after"]

    def erase_user(self, tenant_id: str, user_id: str) -> dict[str, int]:
        """Purge every session of one user (and their snapshots)."""
        subject = session_subject(self.api_prefix, tenant_id, "erase")
        result: dict[str, int] = self.call(subject, {"user_id": user_id, "scope": "user"})
        return result

    def close(self) -> None:
        """Drain the connection and stop its loop thread. Idempotent, and quiet whatever the
        connection's state (a server gone, a drain that times out): a ``with`` block's own
        error is never masked by its close."""
        if self._closed:
            return
        self._closed = True
        try:
            self.run(lambda: self._exchange.close(self.timeout), wait=self.timeout, what="close")
        except ConvmemError as exc:
            _log.debug("closing the service connection: %s", exc)
        finally:
            self._loop.stop()

    def __enter__(self) -> RemoteMemory:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class OnConnection:
    """Requests about one session, made on a `RemoteMemory`'s loop (see `blocking` and `awaiting`)."""

    def __init__(self, memory: RemoteMemory, key: MemoryKey, timeout: float | None) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        self.memory = memory
        self.key = key
        self.timeout = deadlines(timeout)[0] if timeout is not None else memory.timeout

    def wait(self, timeout: float | None) -> float:
        """What a request of `timeout` (None: this session's) may take; `InvalidInput` for a bad one."""
        self.memory.check_open()
        return deadlines(timeout if timeout is not None else self.timeout)[0]

    async def _call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        chosen = timeout if timeout is not None else self.timeout
        subject, body, wait = session_request(self.key, self.memory.api_prefix, op, chosen, fields)
        return await self.memory.request(subject, body, wait)


def _timeout_of(operation: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """How to find the `timeout` argument of a call of `operation` (None when it has none)."""
    names = list(inspect.signature(operation).parameters)[1:]  # after self
    if "timeout" not in names:
        return lambda args, kwargs: None
    at = names.index("timeout")
    return lambda args, kwargs: kwargs.get("timeout", args[at] if len(args) > at else None)


def blocking(
    operation: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], R]:
    """A blocking method running `operation` (a coroutine method of an `OnConnection`) on its loop.

    The handle that gets the method holds the `OnConnection` as `on_connection`.
    """
    timeout_of = _timeout_of(operation)

    def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        requests: OnConnection = self.on_connection
        wait = requests.wait(timeout_of(args, kwargs))
        return requests.memory.run(
            lambda: operation(requests, *args, **kwargs), wait=wait, what=_what(requests, operation)
        )

    functools.update_wrapper(method, operation)  # its name, docstring and signature, for help()
    return method


def awaiting(
    operation: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """`blocking` for asyncio: a method awaiting `operation` from any loop (it runs on the connection's)."""
    timeout_of = _timeout_of(operation)

    async def method(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        requests: OnConnection = self.on_connection
        wait = requests.wait(timeout_of(args, kwargs))
        return await requests.memory.arun(
            lambda: operation(requests, *args, **kwargs), wait=wait, what=_what(requests, operation)
        )

    functools.update_wrapper(method, operation)
    return method


def _what(requests: OnConnection, operation: Callable[..., Any]) -> str:
    return f"{operation.__name__} of session {requests.key.composite()}"


class _SessionOnConnection(OnConnection, SessionRequests):
    """The session operations, sent on a `RemoteMemory`'s loop."""


class RemoteSession:
    """A blocking handle on one session served by a convmem service: `SessionHandle`'s API.

    `target` is a NATS URL (the session then owns its connection; further
    keywords configure it) or a shared `RemoteMemory`. Each method is the
    operation of `SessionRequests`, run on the connection's loop.
    """

    def __init__(
        self,
        target: str | RemoteMemory,
        key: MemoryKey,
        *,
        timeout: float | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        self._owned = isinstance(target, str)
        self.memory = (
            RemoteMemory(target, timeout=timeout if timeout is not None else 10.0, **options)
            if isinstance(target, str)
            else target
        )
        self.on_connection = _SessionOnConnection(self.memory, key, timeout)
        self.key = key
        self.timeout = self.on_connection.timeout

    add_turn = blocking(SessionRequests.add_turn)
    add_items = blocking(SessionRequests.add_items)
    pop_item = blocking(SessionRequests.pop_item)
    get_llm_context = blocking(SessionRequests.get_llm_context)
    estimate_tokens = blocking(SessionRequests.estimate_tokens)
    view = blocking(SessionRequests.view)
    flush = blocking(SessionRequests.flush)
    to_dict = blocking(SessionRequests.to_dict)
    from_dict = blocking(SessionRequests.restore)
    clear = blocking(SessionRequests.clear)
    erase = blocking(SessionRequests.erase)
    fork = blocking(SessionRequests.fork)
    _health = blocking(SessionRequests.health)

    @property
    def health(self) -> MemoryHealth:
        """The session's summarization health (asks the service)."""
        return self._health()

    def close(self) -> None:
        """Close the connection when this session opened it."""
        if self._owned:
            self.memory.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
