"""`ConvmemSession`: an OpenAI Agents SDK `Session` whose history is a convmem session's log.

The SDK's `Runner` reads a session's history before each run (`get_items`)
and appends the run's input and new items (`add_items`); it rolls back with
`pop_item` and resets with `clear_session`. Here every item is stored
verbatim, its keys in the order the SDK gave them, as an `ItemsAdded` event,
and `get_items` returns the view that the session's `agents.strategy`
computes from the folded state (none, trimming, summarizing, compacting). A
strategy is a way of *reading* the history, never a deletion: the log, and
therefore an auditor's replay, keeps every item.

Like the SDK's own sessions it is built from the caller's `session_id`
first; where it lives comes next: a `MemorySystem` in this process, or a
`RemoteMemory` (``convmem.connect_remote(url)``) whose service holds the
sessions, so planners in many processes share one memory. The tenant and
the user are always given explicitly: they are two thirds of the
`MemoryKey`, and no default could keep tenants apart.

Cross-session injection is a prompt-level mechanism, as in the seed: when the
session's configuration turns `agents.cross_session_injection` on, the first
use of a new session looks up the latest summary among the user's other
sessions (same tenant and user, never another's), records it in the session's
`SessionStarted` event, and `instructions()` (or the callable that
`agent_instructions()` builds for `Agent(instructions=...)`) returns it as
instructions text. The choice is made once, so a replay shows exactly what
was injected.

The SDK itself is only needed to run an agent: this module imports it
lazily, when a session is built, and names the extra to install when it is
missing.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from convmem.actors import AsyncSessionHandle, MemorySystem
from convmem.adapters.frontends._views import check_limit
from convmem.adapters.frontends.integrations._items import Items, LocalItems, items_of
from convmem.adapters.frontends.service._remote import RemoteMemory
from convmem.errors import InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import Session, SessionSettings

__all__ = ["ConvmemSession"]

AGENTS_EXTRA_HINT = "pip install convmem[agents]"


@functools.cache
def _require_sdk() -> None:
    """Fail early, with the install command, when the OpenAI Agents SDK is missing."""
    try:
        importlib.import_module("agents.memory")
    except ImportError as exc:
        raise ImportError(
            f"ConvmemSession needs the OpenAI Agents SDK (package openai-agents): {AGENTS_EXTRA_HINT}"
        ) from exc


def _settings(value: object) -> SessionSettings:
    """The SDK's own normalisation: a dict becomes `SessionSettings` (unknown keys refused)."""
    from agents.memory.session_settings import SessionSettings, coerce_session_settings  # noqa: PLC0415

    if value is None:
        return SessionSettings()
    return coerce_session_settings(cast("SessionSettings | dict[str, Any]", value))


def _limit(limit: int | None, settings: SessionSettings | None) -> int | None:
    """An explicit `limit` wins; else the settings' (which may be a dict set after construction)."""
    from agents.memory.session_settings import resolve_session_limit  # noqa: PLC0415

    return check_limit(resolve_session_limit(limit, settings))


class ConvmemSession:
    """An OpenAI Agents SDK session (the `Session` protocol) stored in convmem.

    `session_id` is the caller's id for the conversation and reads back as
    given. `memory` is a `MemorySystem` (in this process; the session never
    closes it) or a `RemoteMemory` (a convmem service, whose tenant
    permissions apply: the tenant travels in the request's subject).
    `tenant_id` and `user_id` complete the session's `MemoryKey`.

    `config` applies when the session starts (in process only: a service
    runs its own); a started session keeps the configuration its
    `SessionStarted` event recorded. `session_settings` is the SDK's
    `SessionSettings` or a dict of its fields (default `SessionSettings()`);
    its `limit` caps `get_items` when the caller gives none. `timeout` bounds
    every call (default: the system's, or the remote connection's).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        memory: MemorySystem | RemoteMemory,
        *,
        tenant_id: str,
        user_id: str,
        config: ShortTermMemoryConfig | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> None:
        _require_sdk()
        if not isinstance(session_id, str):
            raise InvalidInput(
                "session_id",
                f"must be a string, got {type(session_id).__name__} "
                "(ConvmemSession(session_id, memory, tenant_id=..., user_id=...))",
            )
        self.key = MemoryKey(tenant_id, user_id, session_id)
        self._items: Items = items_of(
            memory, self.key, config=config, timeout=timeout, owner="ConvmemSession"
        )
        self.session_id = session_id
        self.session_settings = _settings(session_settings)
        self._started = False

    @classmethod
    def for_key(
        cls,
        memory: MemorySystem | RemoteMemory,
        key: MemoryKey,
        *,
        config: ShortTermMemoryConfig | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> ConvmemSession:
        """The session of `key` (its `session_id` is the key's session id)."""
        if not isinstance(key, MemoryKey):
            raise InvalidInput("key", f"must be a MemoryKey, got {type(key).__name__}")
        return cls(
            key.session_id,
            memory,
            tenant_id=key.tenant_id,
            user_id=key.user_id,
            config=config,
            session_settings=session_settings,
            timeout=timeout,
        )

    def __repr__(self) -> str:
        key = self.key
        return f"ConvmemSession({self.session_id!r}, tenant_id={key.tenant_id!r}, user_id={key.user_id!r})"

    @property
    def handle(self) -> AsyncSessionHandle:
        """The convmem session underneath (state, flush, health, export), in process only."""
        if not isinstance(self._items, LocalItems):
            raise InvalidInput(
                "handle",
                "a ConvmemSession served by the convmem service has no in-process handle; "
                "use RemoteMemory.session(session.key) for the session's other operations",
            )
        return self._items.aio

    # The SDK's Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> list[TResponseInputItem]:
        """The history as the session's strategy shows it; with a limit, its last `limit` items.

        The limit is `limit` when given, else `session_settings.limit`. A limit never
        splits a tool call from its result: a result whose call falls outside it is left
        out too (so fewer than `limit` items may come back). `wrapper` is the run context
        the SDK passes to sessions that accept it; the history does not depend on it.
        """
        del wrapper
        resolved = _limit(limit, self.session_settings)
        await self._ensure_started()
        # The items are the SDK's own dicts, decoded from the log as they were written.
        return cast("list[TResponseInputItem]", await self._items.aitems(resolved))

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Store every item verbatim (one `ItemsAdded` event); nothing is stored for an empty list."""
        del wrapper
        if not items:
            return
        await self._ensure_started()
        await self._items.aadd(cast("list[dict[str, Any]]", items))

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Remove and return the last stored item (None when the session holds none)."""
        del wrapper
        return cast("TResponseInputItem | None", await self._items.apop())

    async def clear_session(self, *, wrapper: Any = None) -> None:
        """Clear the session's history (a `SessionCleared` event; the log keeps the items)."""
        del wrapper
        await self._items.aclear()

    # Cross-session injection -----------------------------------------------------------------

    async def instructions(self) -> str | None:
        """Instructions text carrying the summary injected into this session, or None.

        None unless the session's configuration has `agents.cross_session_injection`
        and one of the user's other sessions had a summary when this one started.
        """
        text = await self._items.astart()
        self._started = True
        return text

    def agent_instructions(self, base: str = "") -> Callable[[Any, Any], Awaitable[str]]:
        """A dynamic instructions callable for `Agent(instructions=...)`: `base` plus the injected memory."""

        # The SDK calls it with (RunContextWrapper, Agent); neither is needed here.
        async def instructions(context: Any, agent: Any) -> str:
            del context, agent
            memory = await self.instructions()
            return "\n\n".join(part for part in (base, memory) if part)

        return instructions

    async def _ensure_started(self) -> None:
        """Open a new session with its cross-session summary before it is first read or written."""
        if not self._started:
            await self._items.astart()
            self._started = True


if TYPE_CHECKING:

    def _conforms(session: ConvmemSession) -> Session:
        """mypy checks here that `ConvmemSession` implements the SDK's `Session` protocol."""
        return session
