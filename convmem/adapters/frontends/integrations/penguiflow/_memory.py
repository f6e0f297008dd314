"""`DefaultShortTermMemory`: PenguiFlow's class of that name, on convmem's event log.

PenguiFlow's planner builds one memory per key with
``DefaultShortTermMemory(config=..., summarizer=...)`` and names the key only
through ``hydrate(store, key)`` before reading and ``persist(store, key)``
after adding a turn, when it has a state store. So each memory:

* keeps its turns, until it learns its key, in a private session of its own
  (tenant and user ``penguiflow:unbound``, a random session id): durable,
  auditable, seen by nobody else;
* learns its key from `hydrate`/`persist` with a store that has PenguiFlow's
  memory methods (a store without them means persistence is off, as in
  PenguiFlow), imports a memory state that PenguiFlow saved there (see
  `_store`), and moves its private turns under the key as events: one
  `TurnsAdopted` on the key, then a `SessionCleared` naming the key on the
  private session, so a process dying between the two loses nothing;
* from then on reads and writes the key's session, shared with every other
  memory and process on that key; the log is the source of truth, and
  `persist` also writes PenguiFlow's memory-state dict so a deployment can
  switch back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from convmem.actors import AsyncSessionHandle, MemorySystem, SessionServices
from convmem.adapters.frontends.integrations.penguiflow import _runtime, _store
from convmem.adapters.frontends.integrations.penguiflow._planner_loop import (
    CallerLoop,
    LoopCallback,
    LoopSummarizer,
)
from convmem.adapters.frontends.integrations.penguiflow._summarizer import offline_summarizer
from convmem.adapters.frontends.integrations.penguiflow._values import (
    CONVMEM_MARK,
    UNBOUND,
    budget_exceeded,
    config_from_penguiflow,
    health_to_penguiflow,
    penguiflow_memory,
    state_to_penguiflow,
    turn_from_penguiflow,
)
from convmem.errors import InvalidInput, WrongThread
from convmem.errors import MemoryBudgetExceeded as ConvmemBudgetExceeded
from convmem.events import MemoryHealth, MemoryKey
from convmem.projections import (
    CONTEXT_STRATEGIES,
    SessionState,
    default_token_estimator,
    estimate_tokens,
    llm_context,
)

__all__ = ["DefaultShortTermMemory"]

_log = logging.getLogger("convmem.penguiflow")


class DefaultShortTermMemory:
    """PenguiFlow's short-term memory (same constructor, types and behaviour) kept in convmem's log.

    `config` is PenguiFlow's `ShortTermMemoryConfig` (convmem's is accepted
    too). `summarizer` is PenguiFlow's async summarizer (ReactPlanner passes
    one built on its LLM); without one, a rolling summary uses convmem's
    offline extractive summarizer. `time_source` is accepted for PenguiFlow's
    signature; convmem's timers run on the memory system's clock.
    """

    def __init__(self, *, config: Any, summarizer: Any = None, time_source: Any = None) -> None:
        self._pf = penguiflow_memory()
        self._penguiflow_config = config
        self.config = config_from_penguiflow(config)
        del time_source  # retries and probes run on the system's clock (configure(clock=...) in tests)
        self._loop = CallerLoop()
        estimator = getattr(config, "token_estimator", None)
        self._estimator = estimator or default_token_estimator
        if summarizer is not None and not callable(summarizer):
            raise InvalidInput("summarizer", f"must be callable, got {type(summarizer).__name__}")
        chosen = None
        if self.config.summarizes:
            timeout = self.config.health.summarize_timeout_seconds
            chosen = (
                LoopSummarizer(summarizer, self._loop, timeout)
                if summarizer is not None
                else offline_summarizer(self.config, estimator)
            )
        self._on_turn_added: Callable[..., Any] | None = getattr(config, "on_turn_added", None)
        if self._on_turn_added is not None and not callable(self._on_turn_added):
            raise InvalidInput("on_turn_added", f"must be callable, got {type(self._on_turn_added).__name__}")
        summary_cb = getattr(config, "on_summary_updated", None)
        health_cb = getattr(config, "on_health_changed", None)
        self._services = SessionServices(
            config=self.config,
            summarizer=chosen,
            token_estimator=estimator,
            on_summary_updated=None if summary_cb is None else LoopCallback(summary_cb, self._loop, _same),
            on_health_changed=None if health_cb is None else LoopCallback(health_cb, self._loop, _healths),
        )
        self._guard = threading.Lock()
        self._key: MemoryKey | None = None
        """The key this memory learned from `hydrate`/`persist`."""
        self._private: MemoryKey | None = None
        """The private session holding turns added before the key was known."""
        self._imported: set[str] = set()
        self._generation = 0
        """Where the session's current generation began in the log, as this memory knows it
        (0: the first; a new one starts when a state store holds no state for the key)."""
        self._handles: tuple[MemorySystem, AsyncSessionHandle] | None = None
        _runtime.current_system()  # the first memory opens the process-wide system

    def __repr__(self) -> str:
        where = self._key or self._private or "no session yet"
        return f"DefaultShortTermMemory(strategy={self.config.strategy!r}, session={where})"

    # Sessions -------------------------------------------------------------------------------

    @property
    def key(self) -> MemoryKey | None:
        """The convmem key this memory learned (None until `hydrate`/`persist` named it)."""
        return self._key

    @property
    def session_key(self) -> MemoryKey | None:
        """The session this memory reads and writes now: its key's, else its private one (if any)."""
        return self._key or self._private

    def _system(self) -> MemorySystem:
        return _runtime.current_system()

    def _handle(self, key: MemoryKey, *, register: bool = False) -> AsyncSessionHandle:
        """The session's handle; `register` (on writes) makes this memory's services the session's."""
        system = self._system()
        cached = self._handles
        if not register and cached is not None and cached[0] is system and cached[1].key == key:
            return cached[1]
        handle = system.async_session(key, services=self._services)
        self._handles = (system, handle)
        return handle

    def _writable(self) -> MemoryKey:
        """The session a turn goes to: the key's, else the private one (made on first need)."""
        with self._guard:
            if self._key is None and self._private is None:
                self._private = MemoryKey(UNBOUND, UNBOUND, uuid.uuid4().hex)
            key = self._key or self._private
        assert key is not None
        return key

    def _state_now(self) -> SessionState:
        """The latest state of the current session (for PenguiFlow's synchronous reads).

        A live session's state is at hand; a passivated one is activated from
        the log on this thread (PenguiFlow's `health`, `estimate_tokens` and
        `to_dict` are not coroutines). The memory keeps no state of its own,
        so a planner's map of memories costs a few references per key.
        """
        key = self.session_key
        state = SessionState()
        if key is not None:
            handle = self._handle(key)
            live = handle.state_if_live()
            if live is None:
                log = self._system().loop_log
                if log is not None and log.on_loop_thread():
                    raise WrongThread(
                        "a synchronous read of a passivated session was made on the NATS connection's "
                        "event loop thread, where it would deadlock: await get_llm_context() first"
                    )
                live = handle.snapshot_state()
            state = live
        if not state.started:
            state = SessionState(config=self.config)
        return state

    # PenguiFlow's ShortTermMemory protocol ---------------------------------------------------

    @property
    def health(self) -> Any:
        """The session's summarization health, as PenguiFlow's `MemoryHealth`."""
        return health_to_penguiflow(self._state_now().health)

    async def add_turn(self, turn: Any) -> None:
        """Store a finished turn (PenguiFlow's or convmem's) once the log acknowledged it.

        Never waits for a summary. Over budget under the ``error`` policy it
        raises `MemoryBudgetExceeded`, PenguiFlow's and convmem's at once.
        """
        if not CONTEXT_STRATEGIES[self.config.strategy].shows_memory:
            return  # PenguiFlow's `none` stores nothing
        converted = turn_from_penguiflow(turn)
        self._loop.capture()
        key = self._writable()
        try:
            await self._handle(key, register=True).add_turn(converted)
        except ConvmemBudgetExceeded as exc:
            raise budget_exceeded(exc) from None
        if self._on_turn_added is not None:
            _fire(self._on_turn_added, turn)

    async def get_llm_context(self) -> Mapping[str, Any]:
        """The patch for the planner's `llm_context` (``{}`` for strategy ``none``)."""
        if not CONTEXT_STRATEGIES[self.config.strategy].shows_memory:
            return {}
        key = self.session_key
        if key is None:
            return llm_context(SessionState(config=self.config), self._estimator)
        return await self._handle(key).get_llm_context()

    def estimate_tokens(self) -> int:
        """Tokens of the context patch, with the configured estimator (PenguiFlow's measure)."""
        state = self._state_now()
        if not CONTEXT_STRATEGIES[state.config.strategy].shows_memory:
            return self._estimator("{}")
        return estimate_tokens(state, self._estimator)

    async def flush(self) -> None:
        """Wait for the summary work of the session (at once for other strategies or when DEGRADED)."""
        key = self.session_key
        if key is None or not self.config.summarizes:
            return
        self._loop.capture()
        await self._handle(key).flush()

    # PenguiFlow's persistence extension ------------------------------------------------------

    async def hydrate(self, store: Any, key: str) -> None:
        """Learn the key; import a memory state PenguiFlow saved in `store`; see another process's writes.

        A store without ``load_memory_state`` turns persistence off, as in PenguiFlow. A
        state store (it saves too) that holds no state for `key` means no memory: whatever
        the log holds for the key is cleared (a new generation; the log keeps the old events
        for audit and erasure), so a fresh store gives a fresh memory.
        """
        if not hasattr(store, "load_memory_state"):
            return
        target = _store.target_key(key)
        with self._guard:
            known = self._key == target
        saved = await store.load_memory_state(key)
        handle = self._handle(target, register=True)
        if saved is None and hasattr(store, "save_memory_state"):
            # The store is the source of truth: a key it holds no state for has no memory. Turns an
            # earlier run left in the log (another store, a deleted state) start a new generation.
            if known:
                await _store.catch_up(self._system(), handle, target)
            await self._fresh_generation(target)
        elif isinstance(saved, Mapping) and isinstance(saved.get(CONVMEM_MARK), Mapping):
            known_generation = saved[CONVMEM_MARK].get("generation")
            if isinstance(known_generation, int) and not isinstance(known_generation, bool):
                self._generation = known_generation
        penguiflows = await _store.import_saved(self._system(), self._imported, handle, target, saved)
        if known:
            await _store.catch_up(self._system(), handle, target)
        await self._bind(target)
        if penguiflows and hasattr(store, "save_memory_state"):
            await self._save(store, key)  # the store now holds convmem's state: no more checks

    async def persist(self, store: Any, key: str) -> None:
        """Learn the key; write PenguiFlow's memory-state dict through ``save_memory_state``.

        The log already holds every turn; the dict lets a deployment switch
        back to PenguiFlow. A store without the method turns persistence off.
        """
        if not hasattr(store, "save_memory_state"):
            return
        target = _store.target_key(key)
        with self._guard:
            first = self._key != target
        if first and hasattr(store, "load_memory_state") and await store.load_memory_state(key) is None:
            await self._fresh_generation(target)  # the store holds no memory for the key: nor does the log
        await self._bind(target)
        await self._save(store, key)

    async def _fresh_generation(self, target: MemoryKey) -> None:
        started = await _store.new_generation(self._handle(target, register=True), self.config)
        if started is not None:
            self._generation = started

    async def _save(self, store: Any, key: str) -> None:
        state = self._state_now()
        saved = state_to_penguiflow(state, self._penguiflow_config, self._key)
        if CONVMEM_MARK in saved:
            saved[CONVMEM_MARK]["generation"] = self._generation  # which generation the store holds
        await store.save_memory_state(key, saved)

    async def _bind(self, target: MemoryKey) -> None:
        """Make `target` this memory's session, moving the private session's turns there first."""
        with self._guard:
            if self._key == target:
                return
            if self._key is not None:
                raise InvalidInput(
                    "key",
                    f"this memory holds session {self._key.composite()!r}; PenguiFlow makes one memory "
                    f"per key, so it cannot also hold {target.composite()!r}",
                )
            private = self._private
        if private is not None:
            await _store.move(self._system(), self._services, private, target)
        with self._guard:
            self._key, self._private = target, None

    # PenguiFlow's serialization extension ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """PenguiFlow's memory-state dict of the session (marked as convmem's)."""
        return state_to_penguiflow(self._state_now(), self._penguiflow_config, self.session_key)

    def from_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the session's content with a saved state (one `SessionRestored`); ValueError when invalid.

        A state convmem wrote for this very session, at or before the log's
        position, is already in the log: nothing is imported.
        """
        if _store.already_in_log(state, self.session_key, self._state_now()):
            return
        key = self._writable()
        origin = _store.origin_of(state)
        self._system().session(key, services=self._services).from_dict(state, origin=origin)

    def get_artifact(self, ref: str) -> Any | None:
        """PenguiFlow's artifact extension: convmem keeps no hidden artifacts (None)."""
        del ref
        return None


_tasks: set[asyncio.Task[None]] = set()
"""Callback tasks under way (a task nobody holds may be collected before it runs)."""


def _fire(callback: Callable[..., Any], turn: Any) -> None:
    """Fire `on_turn_added` as PenguiFlow does: a task on the running loop, its errors swallowed."""
    task = asyncio.get_running_loop().create_task(_quietly(callback, turn))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _quietly(callback: Callable[..., Any], *args: Any) -> None:
    try:
        result = callback(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        _log.debug("memory callback %r failed (ignored, as PenguiFlow does)", callback, exc_info=True)


def _same(*args: Any) -> tuple[Any, ...]:
    return args


def _healths(old: MemoryHealth, new: MemoryHealth) -> tuple[Any, Any]:
    return health_to_penguiflow(old), health_to_penguiflow(new)
