"""Clients of the convmem NATS service: the session API of a local handle, across the network.

```python
with RemoteSession("nats://127.0.0.1:4222", MemoryKey("acme", "alice", "chat-1")) as session:
    session.add_turn(ConversationTurn(user_message="Hi", assistant_response="Hello"))
    context = session.get_llm_context()
```

* `RemoteMemory`: one connection (on its own loop thread) for many sessions,
  plus the operator requests; `RemoteSession`: the blocking handle;
  `AsyncRemoteSession`: the asyncio handle (on the caller's loop).
* An error reply is raised as the exception the session would have raised in
  process: same class, message and fields (`InvalidTurn.field`,
  `MemoryBudgetExceeded.tokens`, ...).
* No service subscribed, or no reply in time: `ServiceUnavailable` (an
  `OperationTimeout`). A subject the server refuses to these credentials:
  `PermissionDenied`, as soon as the server says so.
* `timeout` is how long a call waits; the service is told to give up a
  little earlier, so a slow write comes back as a structured `OperationTimeout`.
* `inbox_prefix` (say ``_INBOX_acme``) makes replies come back on subjects a
  tenant's credentials may be confined to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from nats.aio.client import Client

from convmem.adapters._auth import NatsAuth
from convmem.adapters._loop import EventLoopThread
from convmem.adapters.service._errors import ServiceUnavailable
from convmem.adapters.service._exchange import (
    Encoding,
    Exchange,
    deadlines,
    items_fields,
    state_fields,
    turn_fields,
)
from convmem.adapters.service._protocol import (
    DEFAULT_API_PREFIX,
    check_api_prefix,
    operator_subject,
    session_subject,
)
from convmem.errors import ConvmemError, InvalidInput, SessionClosed
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, MessageItem

__all__ = ["AsyncRemoteSession", "RemoteMemory", "RemoteSession"]

T = TypeVar("T")


class RemoteMemory:
    """A connection to the convmem service, shared by the `RemoteSession`s it hands out.

    `auth` holds credentials and TLS settings (`NatsAuth`: a credentials
    file, an nkey seed, TLS files, the inbox prefix); `connect_options` go to
    nats-py's ``connect`` as they are.
    """

    def __init__(
        self,
        url: str,
        *,
        api_prefix: str = DEFAULT_API_PREFIX,
        timeout: float = 10.0,
        inbox_prefix: str | None = None,
        encoding: Encoding = "json",
        name: str = "convmem-client",
        connect_options: Mapping[str, Any] | None = None,
        auth: NatsAuth | None = None,
    ) -> None:
        self.url = url
        options = {**(auth.options() if auth is not None else {}), **(connect_options or {})}
        self.api_prefix = check_api_prefix(api_prefix)
        self.timeout = deadlines(timeout)[0]
        self._loop = EventLoopThread(name=f"{name}-loop")
        try:
            self._exchange = self._submit(
                lambda: Exchange.connect(
                    url,
                    encoding=encoding,
                    name=name,
                    inbox_prefix=inbox_prefix,
                    timeout=self.timeout,
                    connect_options=options,
                ),
                self.timeout + 2.0,
                "connect",
            )
        except BaseException:
            self._loop.stop()
            raise
        self._closed = False

    def _submit(self, fn: Callable[[], Coroutine[Any, Any, T]], wait: float, what: str) -> T:
        future = self._loop.submit(fn)
        try:
            return future.result(wait)
        except ConvmemError:  # raised by `fn` (some are TimeoutErrors too: not our wait's)
            raise
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ServiceUnavailable(f"{what} got no answer within {wait:g}s; NATS may be down") from None
        except concurrent.futures.CancelledError:
            raise SessionClosed(f"{what} was cancelled: the connection closed") from None

    def call(self, subject: str, fields: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """One request on `subject` (blocking); the reply's result, or its error raised."""
        if self._closed:
            raise SessionClosed("this RemoteMemory is closed")
        wait = deadlines(timeout if timeout is not None else self.timeout)[0]
        return self._submit(lambda: self._exchange.call(subject, fields, wait), wait + 2.0, subject)

    async def acall(self, subject: str, fields: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """`call` from any asyncio loop: the request runs on this connection's own loop."""
        if self._closed:
            raise SessionClosed("this RemoteMemory is closed")
        wait = deadlines(timeout if timeout is not None else self.timeout)[0]
        future = self._loop.submit(lambda: self._exchange.call(subject, fields, wait))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), wait + 2.0)
        except ConvmemError:
            raise
        except TimeoutError:
            raise ServiceUnavailable(
                f"{subject} got no answer within {wait + 2.0:g}s; NATS may be down"
            ) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled, not the request
            raise SessionClosed(f"{subject} was cancelled: the connection closed") from None

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
        """The tenant's sessions (of one user), with events, last activity and health."""
        subject = session_subject(self.api_prefix, tenant_id, "sessions")
        result: list[Any] = self.call(subject, {"user_id": user_id or "", "limit": limit})
        return result

    def erase_user(self, tenant_id: str, user_id: str) -> dict[str, int]:
        """Purge every session of one user (and their snapshots)."""
        subject = session_subject(self.api_prefix, tenant_id, "erase")
        result: dict[str, int] = self.call(subject, {"user_id": user_id, "scope": "user"})
        return result

    def close(self) -> None:
        """Drain the connection and stop its loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True

        try:
            self._submit(lambda: self._exchange.close(self.timeout), self.timeout + 2.0, "close")
        finally:
            self._loop.stop()

    def __enter__(self) -> RemoteMemory:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RemoteSession:
    """A blocking handle on one session served by a convmem service: `SessionHandle`'s API.

    `target` is a NATS URL (the session then owns its connection; further
    keywords configure it) or a shared `RemoteMemory`.
    """

    def __init__(
        self,
        target: str | RemoteMemory,
        key: MemoryKey,
        *,
        timeout: float | None = None,
        api_prefix: str = DEFAULT_API_PREFIX,
        inbox_prefix: str | None = None,
        encoding: Encoding = "json",
        connect_options: Mapping[str, Any] | None = None,
        auth: NatsAuth | None = None,
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        self._owned = isinstance(target, str)
        self.memory = (
            RemoteMemory(
                target,
                api_prefix=api_prefix,
                timeout=timeout if timeout is not None else 10.0,
                inbox_prefix=inbox_prefix,
                encoding=encoding,
                connect_options=connect_options,
                auth=auth,
            )
            if isinstance(target, str)
            else target
        )
        self.key = key
        self.timeout = deadlines(timeout)[0] if timeout is not None else self.memory.timeout

    def _call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        wait, budget = deadlines(timeout if timeout is not None else self.timeout)
        body = {"user_id": self.key.user_id, "session_id": self.key.session_id, "timeout": budget, **fields}
        return self.memory.call(
            session_subject(self.memory.api_prefix, self.key.tenant_id, op), body, timeout=wait
        )

    def add_turn(
        self, turn: ConversationTurn, *, timeout: float | None = None, idempotency_key: str | None = None
    ) -> int:
        """Store a completed turn; its number once the log acknowledged it (0: already stored)."""
        result: int = self._call("add_turn", timeout, **turn_fields(turn, idempotency_key))
        return result

    def add_items(
        self, items: Sequence[Mapping[str, Any] | MessageItem], *, timeout: float | None = None
    ) -> None:
        """Store agent items (OpenAI-Agents session items) as they arrive."""
        self._call("add_items", timeout, **items_fields(items))

    def pop_item(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Remove and return the session's last item (None when the session is empty)."""
        result: dict[str, Any] | None = self._call("pop_item", timeout)
        return result

    def get_llm_context(self) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context`."""
        result: dict[str, Any] = self._call("context")
        return result

    def estimate_tokens(self) -> int:
        """Tokens of the context view."""
        result: int = self._call("tokens")
        return result

    def view(self, name: str) -> list[dict[str, Any]]:
        """A conversation view: ``agents``, ``buffer``, ``window``, ``summary`` or ``entity``."""
        result: list[dict[str, Any]] = self._call("views", view=name)
        return result

    def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        self._call("flush", timeout)

    @property
    def health(self) -> MemoryHealth:
        """The session's summarization health (asks the service)."""
        return MemoryHealth(self._call("health"))

    def to_dict(self) -> dict[str, Any]:
        """The RFC's export of the session's memory."""
        result: dict[str, Any] = self._call("export_state")
        return result

    def from_dict(self, state: Mapping[str, Any], *, timeout: float | None = None) -> None:
        """Replace the session's content with a `to_dict()` export."""
        self._call("restore", timeout, **state_fields(state))

    def clear(self, *, timeout: float | None = None) -> None:
        """Forget the turns and summary (the log keeps them for audit)."""
        self._call("clear", timeout)

    def erase(self, *, timeout: float | None = None) -> int:
        """Purge the session's events and snapshot; how many events were purged."""
        result: dict[str, int] = self._call("erase", timeout)
        return result["events_purged"]

    def fork(
        self,
        to_session_id: str,
        *,
        to_user_id: str | None = None,
        at_position: int | None = None,
        at_time: float | None = None,
        timeout: float | None = None,
    ) -> dict[str, int]:
        """Start another session of this tenant as this one was (see `MemorySystem.fork`)."""
        result: dict[str, int] = self._call(
            "fork",
            timeout,
            to_session_id=to_session_id,
            to_user_id=to_user_id,
            at_position=at_position,
            at_time=at_time,
        )
        return result

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


class AsyncRemoteSession:
    """An asyncio handle on one session served by a convmem service.

    `target` is a NATS URL (connected on first use, closed by `aclose`) or a
    connected nats-py `Client` on the running loop (the caller's; its own
    ``inbox_prefix`` applies). Reads that a local handle answers from memory
    (`health`, `estimate_tokens`, `to_dict`) are coroutines here.
    """

    def __init__(
        self,
        target: str | Client,
        key: MemoryKey,
        *,
        timeout: float = 10.0,
        api_prefix: str = DEFAULT_API_PREFIX,
        inbox_prefix: str | None = None,
        encoding: Encoding = "json",
        connect_options: Mapping[str, Any] | None = None,
        auth: NatsAuth | None = None,
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        self.key = key
        self.api_prefix = check_api_prefix(api_prefix)
        self.timeout = deadlines(timeout)[0]
        self._url = target if isinstance(target, str) else None
        self._encoding: Encoding = encoding
        self._inbox_prefix = inbox_prefix
        self._connect_options = {**(auth.options() if auth is not None else {}), **(connect_options or {})}
        self._exchange = None if isinstance(target, str) else Exchange(target, encoding=encoding)
        self._lock = asyncio.Lock()
        self._closed = False

    async def _ready(self) -> Exchange:
        if self._closed:
            raise SessionClosed("this AsyncRemoteSession is closed")
        async with self._lock:
            if self._exchange is None:
                assert self._url is not None
                self._exchange = await Exchange.connect(
                    self._url,
                    encoding=self._encoding,
                    name="convmem-client",
                    inbox_prefix=self._inbox_prefix,
                    timeout=self.timeout,
                    connect_options=self._connect_options,
                )
            return self._exchange

    async def _call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        wait, budget = deadlines(timeout if timeout is not None else self.timeout)
        exchange = await self._ready()
        body = {"user_id": self.key.user_id, "session_id": self.key.session_id, "timeout": budget, **fields}
        return await exchange.call(session_subject(self.api_prefix, self.key.tenant_id, op), body, wait)

    async def add_turn(
        self, turn: ConversationTurn, *, timeout: float | None = None, idempotency_key: str | None = None
    ) -> int:
        """Store a completed turn; its number once the log acknowledged it (0: already stored)."""
        result: int = await self._call("add_turn", timeout, **turn_fields(turn, idempotency_key))
        return result

    async def add_items(
        self, items: Sequence[Mapping[str, Any] | MessageItem], *, timeout: float | None = None
    ) -> None:
        """Store agent items (OpenAI-Agents session items) as they arrive."""
        await self._call("add_items", timeout, **items_fields(items))

    async def pop_item(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Remove and return the session's last item (None when the session is empty)."""
        result: dict[str, Any] | None = await self._call("pop_item", timeout)
        return result

    async def get_llm_context(self) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context`."""
        result: dict[str, Any] = await self._call("context")
        return result

    async def estimate_tokens(self) -> int:
        """Tokens of the context view."""
        result: int = await self._call("tokens")
        return result

    async def view(self, name: str) -> list[dict[str, Any]]:
        """A conversation view: ``agents``, ``buffer``, ``window``, ``summary`` or ``entity``."""
        result: list[dict[str, Any]] = await self._call("views", view=name)
        return result

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        await self._call("flush", timeout)

    async def health(self) -> MemoryHealth:
        """The session's summarization health."""
        return MemoryHealth(await self._call("health"))

    async def to_dict(self) -> dict[str, Any]:
        """The RFC's export of the session's memory."""
        result: dict[str, Any] = await self._call("export_state")
        return result

    async def restore(self, state: Mapping[str, Any], *, timeout: float | None = None) -> None:
        """Replace the session's content with a `to_dict()` export."""
        await self._call("restore", timeout, **state_fields(state))

    from_dict = restore

    async def clear(self, *, timeout: float | None = None) -> None:
        """Forget the turns and summary (the log keeps them for audit)."""
        await self._call("clear", timeout)

    async def erase(self, *, timeout: float | None = None) -> int:
        """Purge the session's events and snapshot; how many events were purged."""
        result: dict[str, int] = await self._call("erase", timeout)
        return result["events_purged"]

    async def aclose(self) -> None:
        """Close the connection when this session opened it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._url is not None and self._exchange is not None:
            await self._exchange.close(self.timeout)

    async def __aenter__(self) -> AsyncRemoteSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
