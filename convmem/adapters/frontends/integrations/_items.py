"""Where a framework session's items live: in this process, or behind the convmem service.

The framework integrations (the Agents SDK's `Session`, LangChain's chat
history) speak in items (OpenAI-Agents session items, plain dicts) and need
the same five things of a convmem session, from threads and from asyncio:
open it (with cross-session injection when its configuration asks), read its
items as its `agents.strategy` shows them (optionally the last `limit`), add
items, pop the last one, and clear it.

* `LocalItems` does them on a `MemorySystem` in this process.
* `RemoteItems` does them through a `RemoteMemory`, over the NATS service
  API (ops ``agents_start``, ``agents_items``, ``add_items``, ``pop_item``,
  ``clear``); the service answers from its own `MemorySystem` with the very
  same functions, so both give the same results. The tenant travels in the
  request's subject, where NATS permissions confine it.

The functions both sides share live in `convmem.adapters.frontends._views`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from convmem.actors import MemorySystem, SessionHandle
from convmem.actors._handle_writes import call_timeout
from convmem.adapters.frontends._views import (
    as_configured,
    items_view,
    last_items,
    reaches_past_live,
    start_session,
    whole_history,
)
from convmem.adapters.frontends.service._remote import OnConnection, RemoteMemory, awaiting, blocking
from convmem.errors import InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig
from convmem.projections import SessionState, agent_items, cross_session_instructions

__all__ = ["Items", "LocalItems", "RemoteItems", "items_of"]


class Items(Protocol):
    """The operations an integration needs of one convmem session (see the module docstring).

    `start` opens the session if injection asks it and returns the
    instructions carrying the injected summary; `items` is the view of the
    session's strategy (its last `limit` items); `add` stores items verbatim
    (one `ItemsAdded` event); `pop` removes and returns the last item; `clear`
    clears the session (the log keeps everything). The ``a``-prefixed twins
    are for asyncio and never block the loop.
    """

    key: MemoryKey

    def start(self) -> str | None: ...
    def items(self, limit: int | None) -> list[dict[str, Any]]: ...
    def add(self, items: Sequence[Mapping[str, Any]]) -> None: ...
    def pop(self) -> dict[str, Any] | None: ...
    def clear(self) -> None: ...
    async def astart(self) -> str | None: ...
    async def aitems(self, limit: int | None) -> list[dict[str, Any]]: ...
    async def aadd(self, items: Sequence[Mapping[str, Any]]) -> None: ...
    async def apop(self) -> dict[str, Any] | None: ...
    async def aclear(self) -> None: ...


class LocalItems:
    """A session of a `MemorySystem` in this process."""

    def __init__(
        self,
        system: MemorySystem,
        key: MemoryKey,
        *,
        config: ShortTermMemoryConfig | None,
        timeout: float | None,
    ) -> None:
        self.system = system
        self.key = key
        self.timeout = call_timeout(timeout)  # refused here, not at the first call (InvalidInput)
        self.handle: SessionHandle = system.session(key, config=config)
        self.aio = self.handle.aio

    def _state(self) -> SessionState:
        return as_configured(self.handle, self.handle.snapshot_state())

    async def _astate(self) -> SessionState:
        """The latest acknowledged state; loading a session neither live nor cached runs off the loop."""
        if self.system.is_live(self.key) or self.system.is_cached(self.key):
            return self._state()
        return await asyncio.to_thread(self._state)

    def start(self) -> str | None:
        return start_session(self.system, self.key, timeout=self.timeout)

    def _whole(self) -> SessionState:
        return whole_history(self.system, self.key)

    def items(self, limit: int | None) -> list[dict[str, Any]]:
        return items_view(self._state(), limit, self._whole)

    def add(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.handle.add_items(items, timeout=self.timeout)

    def pop(self) -> dict[str, Any] | None:
        return self.handle.pop_item(timeout=self.timeout)

    def clear(self) -> None:
        self.handle.clear(timeout=self.timeout)

    async def astart(self) -> str | None:
        state = await self._astate()
        if state.started or not state.config.agents.cross_session_injection:
            return cross_session_instructions(state)  # nothing to write: no thread needed
        return await asyncio.to_thread(self.start)

    async def aitems(self, limit: int | None) -> list[dict[str, Any]]:
        state = await self._astate()
        view = agent_items(state)
        if reaches_past_live(state, view, limit):  # the whole history is read from the log: not on the loop
            view = agent_items(await asyncio.to_thread(self._whole))
        return last_items(view, limit)

    async def aadd(self, items: Sequence[Mapping[str, Any]]) -> None:
        await self.aio.add_items(items, timeout=self.timeout)

    async def apop(self) -> dict[str, Any] | None:
        return await self.aio.pop_item(timeout=self.timeout)

    async def aclear(self) -> None:
        await self.aio.clear(timeout=self.timeout)


class _ItemRequests(OnConnection):
    """The operations of `Items`, each once, as requests sent on a `RemoteMemory`'s loop."""

    async def start(self) -> str | None:
        result: str | None = await self._call("agents_start")
        return result

    async def items(self, limit: int | None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("agents_items", limit=limit)
        return result

    async def add(self, items: Sequence[Mapping[str, Any]]) -> None:
        await self._call("add_items", items=list(items))

    async def pop(self) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self._call("pop_item")
        return result

    async def clear(self) -> None:
        await self._call("clear")


class RemoteItems:
    """A session served by a convmem service, through `remote`'s connection."""

    def __init__(self, remote: RemoteMemory, key: MemoryKey, *, timeout: float | None) -> None:
        self.remote = remote
        self.key = key
        self.timeout = timeout
        self.on_connection = _ItemRequests(remote, key, timeout)

    start = blocking(_ItemRequests.start)
    items = blocking(_ItemRequests.items)
    add = blocking(_ItemRequests.add)
    pop = blocking(_ItemRequests.pop)
    clear = blocking(_ItemRequests.clear)
    astart = awaiting(_ItemRequests.start)
    aitems = awaiting(_ItemRequests.items)
    aadd = awaiting(_ItemRequests.add)
    apop = awaiting(_ItemRequests.pop)
    aclear = awaiting(_ItemRequests.clear)


def items_of(
    memory: object,
    key: MemoryKey,
    *,
    config: ShortTermMemoryConfig | None,
    timeout: float | None,
    owner: str,
) -> Items:
    """`LocalItems` on a `MemorySystem`, `RemoteItems` on a `RemoteMemory`; `InvalidInput` otherwise."""
    if isinstance(memory, MemorySystem):
        return LocalItems(memory, key, config=config, timeout=timeout)
    if isinstance(memory, RemoteMemory):
        if config is not None:
            raise InvalidInput(
                "config",
                f"a {owner} served by the convmem service runs with the service's configuration; "
                "set it there (convmem serve) instead of passing config=",
            )
        return RemoteItems(memory, key, timeout=timeout)
    raise InvalidInput(
        "memory",
        f"must be a MemorySystem (convmem.connect(...)) or a RemoteMemory (convmem.connect_remote(url)), "
        f"got {type(memory).__name__}",
    )
