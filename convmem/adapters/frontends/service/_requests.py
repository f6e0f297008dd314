"""Every session operation of the service, written once, and the asyncio handle that sends them.

`SessionRequests` holds each operation as a coroutine over one `_call(op,
timeout, **fields)`; a client supplies `_call`. `AsyncRemoteSession` sends
on a nats-py client on the caller's loop; the blocking `RemoteSession`
(``_remote``) runs the very same coroutines on its `RemoteMemory`'s loop
thread, so no operation is written twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Unpack

from nats.aio.client import Client

from convmem.adapters.frontends.service._exchange import (
    ClientOptions,
    Encoding,
    Exchange,
    deadlines,
    items_fields,
    nats_options,
    state_fields,
    turn_fields,
)
from convmem.adapters.frontends.service._protocol import (
    DEFAULT_API_PREFIX,
    check_api_prefix,
    check_at_time,
    routed_subject,
)
from convmem.errors import InvalidInput, SessionClosed
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, MessageItem
from convmem.projections import check_query

__all__ = ["AsyncRemoteSession", "SessionRequests"]


class SessionRequests:
    """The session API of a local handle, as requests to the service (each a coroutine).

    `_call(op, timeout, **fields)` sends operation `op` about `key` and
    returns the reply's result (or raises its error); `timeout` None means
    the handle's own.
    """

    key: MemoryKey

    async def _call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        raise NotImplementedError

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

    async def get_llm_context(self, query: str | None = None) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context`.

        `query`: the planner's current message; the context then also shows the session's earlier
        lines most relevant to it, when the session's ``budget.recall_max_tokens`` is set. Checked
        here too (`InvalidInput` naming ``query``), so a bad one never travels.
        """
        if check_query(query) is None:
            result: dict[str, Any] = await self._call("context")
        else:
            result = await self._call("context", query=query)
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
        """The session's summarization health (asks the service)."""
        return MemoryHealth(await self._call("health"))

    async def to_dict(self) -> dict[str, Any]:
        """The RFC's export of the session's memory."""
        result: dict[str, Any] = await self._call("export_state")
        return result

    async def restore(self, state: Mapping[str, Any], *, timeout: float | None = None) -> None:
        """Replace the session's content with a `to_dict()` export."""
        await self._call("restore", timeout, **state_fields(state))

    async def clear(self, *, timeout: float | None = None) -> None:
        """Forget the turns and summary (the log keeps them for audit)."""
        await self._call("clear", timeout)

    async def erase(self, *, timeout: float | None = None) -> int:
        """Purge the session's events and snapshot; how many events were purged."""
        result: dict[str, int] = await self._call("erase", timeout)
        return result["events_purged"]

    async def fork(
        self,
        to_session_id: str,
        *,
        to_user_id: str | None = None,
        at_position: int | None = None,
        at_time: float | None = None,
        timeout: float | None = None,
    ) -> dict[str, int]:
        """Start another session of this tenant as this one was (see `MemorySystem.fork`)."""
        if at_time is not None:
            check_at_time(at_time)
        result: dict[str, int] = await self._call(
            "fork",
            timeout,
            to_session_id=to_session_id,
            to_user_id=to_user_id,
            at_position=at_position,
            at_time=at_time,
        )
        return result


def session_request(
    key: MemoryKey, api_prefix: str, op: str, timeout: float, fields: Mapping[str, Any]
) -> tuple[str, dict[str, Any], float]:
    """The subject, the body and the client's wait of one request; the service is given a little less.

    The subject names the session's partition, so a `convmem serve --workers` answers it from the one
    process that owns the session (the exchange falls back to the plain subject when none owns it).
    """
    wait, budget = deadlines(timeout)
    body = {"user_id": key.user_id, "session_id": key.session_id, "timeout": budget, **fields}
    return routed_subject(api_prefix, key.tenant_id, key.user_id, key.session_id, op), body, wait


class AsyncRemoteSession(SessionRequests):
    """An asyncio handle on one session served by a convmem service.

    `target` is a NATS URL (connected on first use, closed by `aclose`) or a
    connected nats-py `Client` on the running loop (the caller's). Replies come back on the
    tenant's inbox ``_INBOX_<tenant token>`` whatever the client's ``inbox_prefix``. Reads that a
    local handle answers from memory (`health`, `estimate_tokens`, `to_dict`) are coroutines here.
    """

    def __init__(
        self, target: str | Client, key: MemoryKey, *, timeout: float = 10.0, **options: Unpack[ClientOptions]
    ) -> None:
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        self.key = key
        self.api_prefix = check_api_prefix(options.get("api_prefix", DEFAULT_API_PREFIX))
        self.timeout = deadlines(timeout)[0]
        self._url = target if isinstance(target, str) else None
        self._encoding: Encoding = options.get("encoding", "json")
        self._inbox_prefix = options.get("inbox_prefix")
        self._connect_options = nats_options(options)
        self._exchange = (
            None
            if isinstance(target, str)
            else Exchange(target, encoding=self._encoding, api_prefix=self.api_prefix)
        )
        self._lock = asyncio.Lock()
        self._closed = False

    from_dict = SessionRequests.restore

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
                    api_prefix=self.api_prefix,
                )
            return self._exchange

    async def _call(self, op: str, timeout: float | None = None, **fields: Any) -> Any:
        chosen = timeout if timeout is not None else self.timeout
        subject, body, wait = session_request(self.key, self.api_prefix, op, chosen, fields)
        exchange = await self._ready()
        return await exchange.call(subject, body, wait)

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
