"""`ConvmemSession`: an OpenAI Agents SDK `Session` whose history is a convmem session's log.

The SDK's `Runner` reads a session's history before each run (`get_items`)
and appends the run's input and new items (`add_items`); it rolls back with
`pop_item` and resets with `clear_session`. Here every item is stored
verbatim as an `ItemsAdded` event, and `get_items` returns the view that the
session's `agents.strategy` computes from the folded state (none, trimming,
summarizing, compacting). A strategy is a way of *reading* the history, never
a deletion: the log, and therefore an auditor's replay, keeps every item.

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

import asyncio
import functools
import importlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from convmem.actors import AsyncSessionHandle, MemorySystem
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig
from convmem.projections import (
    SessionState,
    agent_items,
    cross_session_instructions,
    latest_summary_for_user,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import Session, SessionSettings

__all__ = ["ConvmemSession"]

_log = logging.getLogger("convmem.agents")

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


class ConvmemSession:
    """An OpenAI Agents SDK session (the `Session` protocol) stored in convmem.

    `system` is the caller's `MemorySystem` (the session never closes it);
    `key` names the conversation, and `session_id` is its composite. `config`
    applies when the session starts; a started session keeps the
    configuration its `SessionStarted` event recorded. `session_settings` is
    the SDK's `SessionSettings` (its `limit` caps `get_items` when the caller
    gives none). `timeout` bounds every write (default: the system's).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        system: MemorySystem,
        key: MemoryKey,
        *,
        config: ShortTermMemoryConfig | None = None,
        session_settings: SessionSettings | None = None,
        timeout: float | None = None,
    ) -> None:
        _require_sdk()
        if not isinstance(system, MemorySystem):
            raise InvalidInput("system", f"must be a MemorySystem, got {type(system).__name__}")
        self._system = system
        self._handle = system.async_session(key, config=config)
        self.key = key
        self.session_id = key.composite()
        self.session_settings = session_settings
        self._timeout = timeout
        self._start_checked = False

    def __repr__(self) -> str:
        return f"ConvmemSession({self.session_id!r})"

    @property
    def handle(self) -> AsyncSessionHandle:
        """The convmem session underneath (state, flush, health, export)."""
        return self._handle

    # The SDK's Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history as the session's strategy shows it; with `limit`, its last `limit` items."""
        if limit is None:
            limit = getattr(self.session_settings, "limit", None)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInput("limit", f"must be None or an integer >= 0, got {limit!r}")
        await self._ensure_started()
        view = agent_items(await self._state())
        if limit is not None:
            view = view[max(len(view) - limit, 0) :]
        # The items are the SDK's own dicts, decoded from the log verbatim.
        return cast("list[TResponseInputItem]", view)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store every item verbatim (one `ItemsAdded` event); nothing is stored for an empty list."""
        if not items:
            return
        await self._ensure_started()
        await self._handle.add_items(items, timeout=self._timeout)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the last stored item (None when the session holds none)."""
        item = await self._handle.pop_item(timeout=self._timeout)
        return cast("TResponseInputItem | None", item)

    async def clear_session(self) -> None:
        """Clear the session's history (a `SessionCleared` event; the log keeps the items)."""
        await self._handle.clear(timeout=self._timeout)

    # Cross-session injection -----------------------------------------------------------------

    async def instructions(self) -> str | None:
        """Instructions text carrying the summary injected into this session, or None.

        None unless the session's configuration has `agents.cross_session_injection`
        and one of the user's other sessions had a summary when this one started.
        """
        await self._ensure_started()
        return cross_session_instructions(await self._state())

    def agent_instructions(self, base: str = "") -> Callable[[Any, Any], Awaitable[str]]:
        """A dynamic instructions callable for `Agent(instructions=...)`: `base` plus the injected memory."""

        # The SDK calls it with (RunContextWrapper, Agent); neither is needed here.
        async def instructions(context: Any, agent: Any) -> str:
            del context, agent
            memory = await self.instructions()
            return "\n\n".join(part for part in (base, memory) if part)

        return instructions

    # Internals -----------------------------------------------------------------------------

    async def _state(self) -> SessionState:
        """The latest acknowledged state; activating a passivated session runs off the loop."""
        if self._system.is_live(self.key):
            return self._handle.snapshot_state()
        return await asyncio.to_thread(self._handle.snapshot_state)

    async def _ensure_started(self) -> None:
        """Open a new session with its cross-session summary before it is first read or written.

        Only when injection is configured: otherwise the first write opens the
        session, as for any convmem session.
        """
        if self._start_checked:
            return
        state = await self._state()
        config = state.config if state.started else self._system.config_for(self.key)
        if not state.started and config.agents.cross_session_injection:
            found = await asyncio.to_thread(self._latest_other_summary)
            summary, source = (found[1], found[0]) if found is not None else (None, None)
            await self._handle.start(injected_summary=summary, injected_from=source, timeout=self._timeout)
        self._start_checked = True

    def _latest_other_summary(self) -> tuple[MemoryKey, str] | None:
        """The latest summary among the user's other sessions (blocking: reads the log)."""
        key = self.key
        states: list[SessionState] = []
        for other in self._system.log.keys(tenant_id=key.tenant_id, user_id=key.user_id):
            if other == key:
                continue
            try:
                states.append(self._system.load(other)[0])
            except ConvmemError as exc:  # one unreadable session must not block a new one
                _log.warning("session %s: skipped %s for cross-session memory: %s", key, other, exc)
        return latest_summary_for_user(states, key)


if TYPE_CHECKING:

    def _conforms(session: ConvmemSession) -> Session:
        """mypy checks here that `ConvmemSession` implements the SDK's `Session` protocol."""
        return session
