"""PenguiFlow's `ReactPlanner` on convmem: one memory object, one convmem session per key.

How ReactPlanner (penguiflow 3.11) uses a memory it is given:

* A `ShortTermMemoryConfig` makes the planner build one in-process memory per
  key. Any other object is a *singleton*: the planner (and every per-session
  fork it makes to run sessions concurrently) calls that one object for every
  key, and `get_llm_context()` and `add_turn(turn)` carry no key. A single
  convmem session handle given to the planner would show every user's turns
  to every other user.
* The planner names the key of a call only through `hydrate(store, composite)`,
  right before `get_llm_context()`, and `persist(store, composite)`, right
  after `add_turn(turn)`; it calls both only when it resolved a key (explicit
  `memory_key=`, or ids in `tool_context`; none means no memory call at all)
  and only when it has a `state_store`.
* Each run is one asyncio task; runs of different sessions interleave.

So `ConvmemShortTermMemory` binds each call through a context variable (one
value per task, so interleaved runs never see each other's binding):
`hydrate` binds the session it names, `get_llm_context` reads that session once,
`add_turn` holds the converted turn on the binding, and `persist` stores it in
the session it names, only when that is the session the call is bound to.
Without a binding nothing is read or written: memory fails closed, as in
PenguiFlow. The planner's state store is only the trigger; the log is the store.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Mapping
from contextvars import ContextVar
from types import ModuleType
from typing import Any

from convmem.actors import AsyncSessionHandle, MemorySystem
from convmem.adapters.frontends.integrations.penguiflow import _values
from convmem.adapters.frontends.integrations.penguiflow._values import convmem_key, turn_from_penguiflow
from convmem.errors import InvalidConfig, InvalidInput, InvalidKey
from convmem.events import (
    ConversationTurn,
    MemoryHealth,
    MemoryIsolation,
    MemoryKey,
    ShortTermMemoryConfig,
)

__all__ = ["ConvmemShortTermMemory", "config_from_penguiflow", "turn_from_penguiflow"]

# penguiflow ships no type information (no py.typed), so its objects cross this
# boundary as `Any` and are read field by field.

_log = logging.getLogger("convmem.penguiflow")

_INSTALL = "pip install convmem[penguiflow]"
_MAX_NESTING = 32
"""Bindings kept per task: a paused run leaves one behind (it never persists)."""

_CALLABLE_FIELDS = ("token_estimator", "on_turn_added", "on_summary_updated", "on_health_changed")


def _penguiflow_memory() -> ModuleType:
    try:
        return importlib.import_module("penguiflow.planner.memory")
    except ImportError as exc:
        raise ImportError(f"the PenguiFlow integration needs the penguiflow package: {_INSTALL}") from exc


def config_from_penguiflow(config: Any) -> ShortTermMemoryConfig:
    """Map PenguiFlow's `ShortTermMemoryConfig` to convmem's for the singleton memory.

    As `DefaultShortTermMemory` maps it (zeros with PenguiFlow's meaning), but
    settings this one memory for every key cannot honour raise `InvalidConfig`
    rather than being dropped: callables (they belong to `MemorySystem(...)`),
    and a non-default isolation (ReactPlanner resolves the key of a custom
    memory with its default paths).
    """
    if isinstance(config, ShortTermMemoryConfig):
        return config
    for name in _CALLABLE_FIELDS:
        if getattr(config, name, None) is not None:
            raise InvalidConfig(
                name, f"is a callable, not configuration: pass {name}= to MemorySystem(...) instead"
            )
    converted = _values.config_from_penguiflow(config)
    if converted.isolation != MemoryIsolation():
        raise InvalidConfig(
            "isolation",
            "ReactPlanner resolves the key of a custom memory with the default MemoryIsolation "
            "(tool_context ids tenant_id/user_id/session_id, explicit key required); "
            "pass memory_key= to run() and resume() instead of custom paths",
        )
    return converted


def _parse_composite(composite: str) -> MemoryKey | None:
    """The key ReactPlanner names as ``tenant:user:session`` (unescaped), or None when ambiguous."""
    parts = composite.split(":") if isinstance(composite, str) else []
    if len(parts) != 3:
        _log.warning(
            "memory off for this call: ReactPlanner named the session %r, which is not three "
            "':'-free ids (it does not escape ':' inside ids, so the session is ambiguous)",
            composite,
        )
        return None
    try:
        return MemoryKey(*parts)
    except InvalidKey as exc:
        _log.warning("memory off for this call: %s", exc)
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """What one planner call is bound to; immutable, so a task that copies it cannot change ours."""

    composite: str
    handle: AsyncSessionHandle | None
    """None: the planner named an unusable key; the call gets no memory."""
    read: bool = False
    turn: ConversationTurn | None = None
    outer: _Call | None = None
    """The binding before this call's `hydrate` (a run nested in a tool, or a paused run)."""
    depth: int = 1


class ConvmemShortTermMemory:
    """PenguiFlow's `ShortTermMemory` for `ReactPlanner`: one convmem session per `MemoryKey`.

    Give it to the planner together with any `state_store` (yours, or
    ``penguiflow.state.InMemoryStateStore()``): ReactPlanner names the session of
    a call only through `hydrate`/`persist`, which it calls only when it has a
    store. Without one the memory stays off (nothing read, nothing written).

    `config` (PenguiFlow's or convmem's) applies to sessions when they start;
    by default they start with the system's configuration.
    """

    def __init__(self, system: MemorySystem, config: ShortTermMemoryConfig | Any | None = None) -> None:
        self._pf = _penguiflow_memory()
        self.system = system
        self.config: ShortTermMemoryConfig | None = None if config is None else config_from_penguiflow(config)
        if self.config is not None and self.config.summarizes and system.pool is None:
            raise InvalidConfig(
                "summarizer",
                "strategy 'rolling_summary' needs a summarizer on the MemorySystem "
                "(e.g. MemorySystem(..., summarizer=convmem.adapters.ExtractiveSummarizer()))",
            )
        self._call: ContextVar[_Call | None] = ContextVar(f"convmem_penguiflow_{id(self):x}", default=None)
        self._warned_unbound = False

    def __repr__(self) -> str:
        return f"ConvmemShortTermMemory(config={self.config!r})"

    def session(self, key: Any) -> AsyncSessionHandle:
        """The convmem session of `key` (convmem's or PenguiFlow's `MemoryKey`), for direct use."""
        return self.system.async_session(convmem_key(key), config=self.config)

    # PenguiFlow's persistence hooks: the per-call key -----------------------------------

    async def hydrate(self, store: Any, key: str) -> None:
        """Bind this call to the session `key` (``tenant:user:session``); the log holds its state."""
        del store  # the session rebuilds itself from the log
        outer = self._call.get()
        if outer is not None and outer.depth >= _MAX_NESTING:
            outer = None
        handle: AsyncSessionHandle | None = None
        try:
            parsed = _parse_composite(key)
            if parsed is not None:
                handle = self.session(parsed)
        finally:  # bound even on failure, so that no earlier binding serves this call
            depth = 1 if outer is None else outer.depth + 1
            self._call.set(_Call(composite=key, handle=handle, outer=outer, depth=depth))

    async def persist(self, store: Any, key: str) -> None:
        """Store the call's turn in the session `key`, if that is the session the call is bound to."""
        del store  # every acknowledged turn is already durable in the log
        call = self._call.get()
        if call is None or call.composite != key:
            _log.warning(
                "nothing stored: ReactPlanner persists session %r but this call is bound to %r",
                key,
                None if call is None else call.composite,
            )
            return
        self._call.set(call.outer)
        if call.turn is not None and call.handle is not None:
            await call.handle.add_turn(call.turn)

    # PenguiFlow's ShortTermMemory protocol ----------------------------------------------------

    def _bound(self) -> AsyncSessionHandle | None:
        call = self._call.get()
        return None if call is None else call.handle

    @property
    def health(self) -> Any:
        """The bound session's health as PenguiFlow's `MemoryHealth` (HEALTHY when unbound)."""
        handle = self._bound()
        health = MemoryHealth.HEALTHY if handle is None else handle.health
        return self._pf.MemoryHealth(health.value)

    async def get_llm_context(self) -> Mapping[str, Any]:
        """The bound session's context patch, once per `hydrate`; ``{}`` when unbound."""
        call = self._call.get()
        if call is None:
            if not self._warned_unbound:
                self._warned_unbound = True
                _log.warning(
                    "memory off: ReactPlanner asked for context without naming a session. It names "
                    "the session of a custom memory only through hydrate()/persist(), which it calls "
                    "only when it has a state_store: pass ReactPlanner(..., state_store=...)"
                )
            return {}
        if call.read or call.handle is None:
            return {}
        self._call.set(dataclasses.replace(call, read=True))
        return await call.handle.get_llm_context()

    async def add_turn(self, turn: Any) -> None:
        """Hold the finished turn (PenguiFlow's or convmem's) until `persist` names its session."""
        converted = turn_from_penguiflow(turn)
        call = self._call.get()
        if call is None or call.handle is None:
            _log.warning("turn not stored: no session is bound to this call (memory is off)")
            return
        if call.turn is not None:
            raise InvalidInput("turn", f"the call bound to {call.composite!r} already added its turn")
        self._call.set(dataclasses.replace(call, turn=converted))

    def estimate_tokens(self) -> int:
        """Tokens of the bound session's context (0 when unbound)."""
        handle = self._bound()
        return 0 if handle is None else handle.estimate_tokens()

    async def flush(self, key: Any | None = None) -> None:
        """Wait for the summaries of session `key` (default: the bound session, if any)."""
        handle = self._bound() if key is None else self.session(key)
        if handle is not None:
            await handle.flush()
