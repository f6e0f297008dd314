"""Session handles: the seed's memory protocol, blocking (threads) and asyncio, from one core.

Every write operation (`add_turn`, `start`, `add_items`, `pop_item`,
`clear`, `restore`, `adopt`) is written once, in `convmem.actors._handle_writes`,
as a function that checks its arguments and prepares a `Call`.
`SessionHandle` runs a call and blocks for its answer (`_blocking`);
`AsyncSessionHandle` runs the same call and awaits it (`_awaitable`); each
class names its methods, ``add_turn = _blocking(add_turn)``, the one way
convmem makes a blocking and an asyncio surface from one definition (the
service's clients do the same with `blocking` and `awaiting`). The reads are
shared as they are (`_Core`).

Writes go to the session (see `convmem.actors._session`) and are answered once
the log acknowledged them. Reads use the latest acknowledged state directly
and never queue behind writes. The asyncio handle awaits through a
`LoopAnswer` or `asyncio.wrap_future` (never a pykka future), and moves any
call that might block (activating a passivated session reads the log) off
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

import msgspec

from convmem.actors._answers import Answering, LoopAnswer, await_for, wait_for
from convmem.actors._handle_writes import (
    Call,
    Handle,
    add_items,
    add_turn,
    adopt,
    call_timeout,
    clear,
    from_dict,
    pop_item,
    restore,
    start,
)
from convmem.actors._live import LiveSessions
from convmem.actors._ports import Settle
from convmem.actors._session import Flush, Refresh, StateCell, Write
from convmem.errors import OperationTimeout, WrongThread
from convmem.events import AnyEvent, ConversationTurn, MemoryHealth, MemoryKey, ShortTermMemoryConfig
from convmem.projections import (
    SessionState,
    TokenEstimator,
    check_query,
    estimate_tokens,
    llm_context,
    to_dict,
)

__all__ = ["AsyncSessionHandle", "SessionHandle"]

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(
    operation: Callable[Concatenate[Handle, P], Call[R]],
) -> Callable[Concatenate[SessionHandle, P], R]:
    """`operation` as a `SessionHandle` method: it blocks until the write is answered."""

    @functools.wraps(operation)
    def method(self: SessionHandle, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(operation(self, *args, **kwargs))

    return _named(method, operation, "SessionHandle")


def _awaitable(
    operation: Callable[Concatenate[Handle, P], Call[R]],
) -> Callable[Concatenate[AsyncSessionHandle, P], Coroutine[Any, Any, R]]:
    """`operation` as an `AsyncSessionHandle` method: a coroutine that awaits the write's answer."""

    @functools.wraps(operation)
    async def method(self: AsyncSessionHandle, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._run(operation(self, *args, **kwargs))

    return _named(method, operation, "AsyncSessionHandle")


F = TypeVar("F", bound=Callable[..., Any])


def _named(method: F, operation: Callable[..., Any], owner: str) -> F:
    """`method` shown as `owner`'s (help, signatures), answering what the operation answers."""
    method.__qualname__ = f"{owner}.{operation.__name__}"
    method.__signature__ = inspect.signature(operation).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty
    )
    return method


# The shared core --------------------------------------------------------------------------


class _Core:
    """What both handles hold and the reads they share (each offers the write operations its own way)."""

    def __init__(self, sessions: LiveSessions, key: MemoryKey) -> None:
        self._sessions = sessions
        self.key = key

    def _state(self) -> SessionState:
        return self._view_state(self._sessions.cell(self.key).state)

    def view_state(self, state: SessionState) -> SessionState:
        """`state` as this handle's reads see it: a session with nothing stored yet follows the
        configuration it will start with (so a service answers a read of it as a handle does)."""
        return self._view_state(state)

    def _view_state(self, state: SessionState) -> SessionState:
        if not state.started:
            # Nothing stored yet: views follow the configuration the session will start with.
            return msgspec.structs.replace(state, config=self.starting_config)
        return state

    def _context(self, cell: StateCell, query: str | None = None) -> dict[str, Any]:
        """The context view of the cell's state, built once per state (with a `query`, built for it:
        the lines recalled for the query are not cached).

        A state is immutable, so its view is cached on the session's cell and
        each call gets fresh outer dicts and lists: a caller may add to them
        freely. The turn dicts inside are shared between calls; treat them as
        read-only (changing one changes later views of the same state, never
        the stored state or the log).
        """
        state = self._view_state(cell.state)
        if check_query(query) is not None:
            return llm_context(state, self.estimator_of(state), query=query)
        cached = cell.view
        if cached is not None and cached[0] is state:
            patch = cached[1]
        else:
            patch = llm_context(state, self.estimator_of(state))
            if state is cell.state:
                cell.view = (state, patch)
        if not patch:
            return {}
        memory = patch["conversation_memory"]
        return {"conversation_memory": {k: list(v) if isinstance(v, list) else v for k, v in memory.items()}}

    @property
    def starting_config(self) -> ShortTermMemoryConfig:
        """The configuration the session starts with, if it has not yet (a started one keeps its own)."""
        return self._sessions.services.config_for(self.key)

    def snapshot_state(self) -> SessionState:
        """The session's latest acknowledged state (immutable): exactly what a replay gives.

        Activates a passivated session (reading the log) on the calling thread.
        """
        return self._sessions.cell(self.key).state

    def state_if_live(self) -> SessionState | None:
        """`snapshot_state()` if the session is live now, else None: never reads the log (safe on a loop)."""
        cell = self._sessions.live_cell(self.key)
        return cell.state if cell is not None else None

    @property
    def health(self) -> MemoryHealth:
        """The session's summarization health."""
        return self._state().health

    def estimate_tokens(self) -> int:
        """Tokens of the context view (the configured estimator)."""
        state = self._state()
        return estimate_tokens(state, self.estimator_of(state))

    def estimator_of(self, state: SessionState) -> TokenEstimator:
        """The token counter that measures `state` (the encoding its config names, else the runtime's)."""
        return self._sessions.services.estimator_for(self.key, state.config if state.started else None)

    def to_dict(self) -> dict[str, Any]:
        """The RFC's export of the session's memory."""
        return to_dict(self._state())

    def _refuse_on_the_log_loop(self, what: str) -> None:
        """A blocking call on the log's own loop thread would wait for that loop: a clear error instead."""
        if self._sessions.storage.on_loop_thread():
            raise WrongThread(
                f"a blocking {what} was made on the NATS connection's event loop thread, where it would "
                "deadlock; use the asyncio handle (.aio) there, or asyncio.to_thread"
            )

    def _wait(self, timeout: float | None) -> float:
        return timeout if timeout is not None else self._sessions.timeout


class SessionHandle(_Core):
    """Blocking handle for threaded planners; every wait has a timeout."""

    add_turn = _blocking(add_turn)
    start = _blocking(start)
    add_items = _blocking(add_items)
    pop_item = _blocking(pop_item)
    clear = _blocking(clear)
    restore = _blocking(restore)
    adopt = _blocking(adopt)
    from_dict = _blocking(from_dict)

    def _run(self, call: Call[R]) -> R:
        self._refuse_on_the_log_loop("write")
        reply: concurrent.futures.Future[list[AnyEvent]] = concurrent.futures.Future()
        wait = self._wait(call.timeout)
        # This thread waits anyway: it runs the write itself when the session is idle (the log's own
        # timeouts bound that). A shorter timeout is kept by waiting apart from it.
        here = wait >= self._sessions.timeout
        self._sessions.deliver(self.key, Write(call.command, reply, call.command_id), here=here)
        try:
            events = wait_for(reply, wait, "write")
        except OperationTimeout:
            # Not started yet: it never will be (as the asyncio handle's writes). Left queued, a
            # write outlived its caller: a service's tenant freed its place at each timeout and
            # piled up writes past its max_in_flight and its quota (timeout 1 us: 467 queued).
            reply.cancel()
            raise
        return call.answer(events)

    def get_llm_context(self, query: str | None = None) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context` (its turn dicts are read-only).

        `query`: the planner's current message. With ``budget.recall_max_tokens`` set, the context
        then also shows ``recalled``, the session's earlier lines most relevant to it, within the
        same budget. A string of at most 8,000 characters (`InvalidInput` otherwise).
        """
        check_query(query)
        return self._context(self._sessions.cell(self.key), query)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        self._ask(Flush(concurrent.futures.Future()), timeout, "flush")

    def refresh(self, *, timeout: float | None = None) -> SessionState:
        """Reload from the log (to see another process's writes) and return the state."""
        state: SessionState = self._ask(Refresh(concurrent.futures.Future()), timeout, "refresh")
        return state

    def _ask(self, message: Flush | Refresh, timeout: float | None, what: str) -> Any:
        self._refuse_on_the_log_loop(what)
        wait = self._wait(call_timeout(timeout))
        self._sessions.deliver(self.key, message)
        reply: concurrent.futures.Future[Any] = message.reply
        try:
            return wait_for(reply, wait, what)
        except OperationTimeout:
            if isinstance(message, Flush):
                reply.cancel()  # its session forgets it (a flush waits on nothing a caller needs)
            raise

    @property
    def aio(self) -> AsyncSessionHandle:
        """The asyncio handle on the same session."""
        return AsyncSessionHandle(self._sessions, self.key)


class AsyncSessionHandle(_Core):
    """asyncio handle: PenguiFlow's `ShortTermMemory` protocol (plus the other views)."""

    add_turn = _awaitable(add_turn)
    start = _awaitable(start)
    add_items = _awaitable(add_items)
    pop_item = _awaitable(pop_item)
    clear = _awaitable(clear)
    restore = _awaitable(restore)
    adopt = _awaitable(adopt)

    async def _run(self, call: Call[R]) -> R:
        sessions, key = self._sessions, self.key
        loop = asyncio.get_running_loop()
        reply = LoopAnswer(loop)
        message = Write(call.command, reply, call.command_id)
        # With a log that appends on its own loop, a live session's write needs no thread: it is
        # decided and begun right here (the log settles it). Otherwise the session's thread runs it.
        if sessions.storage.loop_log is None or not sessions.claim_live(key, message):
            await self._deliver(message)
        wait = self._wait(call.timeout)
        deadlines = reply.deadlines  # the loop's: one timer per timeout, none made per write
        deadlines.add(reply, wait, loop)
        try:
            events: list[AnyEvent] = await reply.future
            return call.answer(events)
        finally:
            deadlines.answered(wait)

    def add_turn_now(
        self, turn: ConversationTurn, reply: Settle[int], *, idempotency_key: str | None = None
    ) -> bool:
        """`add_turn` begun from the log's own loop without awaiting: `reply` gets the turn's number.

        For a caller that answers from a callback (the service): no task, no future. The write runs
        here when the session is idle, else queues behind its mail; `reply` is settled on this loop
        once the log acknowledged (or from an actor's thread, when the session was busy: the caller
        hands it over), perhaps before this returns. False, with nothing done, when the log does not
        append on a loop or the session is neither live nor cached here (activating it reads the
        log): `await add_turn(...)` then. The caller keeps the timeout.
        """
        call = add_turn(self, turn, idempotency_key=idempotency_key)
        sessions = self._sessions
        if sessions.storage.loop_log is None:
            return False
        return sessions.claim_live(
            self.key, Write(call.command, Answering(reply, call.answer), call.command_id)
        )

    async def _deliver(self, message: Write | Flush | Refresh) -> None:
        sessions = self._sessions
        if not sessions.tell(self.key, message):  # activating reads the log: not on the event loop
            await asyncio.to_thread(sessions.deliver, self.key, message)

    async def get_llm_context(self, query: str | None = None) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context` (its turn dicts are read-only).

        `query`: the planner's current message (see `SessionHandle.get_llm_context`).
        """
        check_query(query)
        cell = self._sessions.live_cell(self.key)
        if cell is None:  # activating reads the log: not on the event loop
            cell = await asyncio.to_thread(self._sessions.cell, self.key)
        return self._context(cell, query)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        await self._ask(Flush(concurrent.futures.Future()), timeout, "flush")

    async def refresh(self, *, timeout: float | None = None) -> SessionState:
        """Reload from the log and return the state."""
        state: SessionState = await self._ask(Refresh(concurrent.futures.Future()), timeout, "refresh")
        return state

    async def _ask(self, message: Flush | Refresh, timeout: float | None, what: str) -> Any:
        # No `_refuse_on_the_log_loop` here, unlike the blocking twins: this awaits, so the log's
        # loop stays free to answer the reads the session makes for it on its own thread.
        wait = self._wait(call_timeout(timeout))
        await self._deliver(message)
        reply: concurrent.futures.Future[Any] = message.reply
        return await await_for(reply, wait, what)

    def from_dict(self, state: Mapping[str, Any]) -> None:
        """Synchronous `from_dict` (the RFC's signature); prefer `await restore(state)` on a loop."""
        SessionHandle(self._sessions, self.key).from_dict(state)

    async def persist(self, store: Any, key: str) -> None:
        """Nothing to do: every change is already durable in the log (PenguiFlow's hook)."""
        del store, key

    async def hydrate(self, store: Any, key: str) -> None:
        """Nothing to do: the session rebuilds itself from the log (PenguiFlow's hook)."""
        del store, key
