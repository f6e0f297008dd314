"""Session handles: the seed's memory protocol, blocking (threads) and asyncio.

Writes go to the session's actor and are answered once the log acknowledged
them. Reads use the latest acknowledged state directly and never queue
behind writes. The asyncio handle awaits `concurrent.futures.Future`s through
`asyncio.wrap_future` (never a pykka future), and moves any call that might
block (activating a passivated session reads the log) off the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from convmem.actors._session import Flush, Refresh, StateCell
from convmem.actors._write import Write
from convmem.errors import ConvmemError, InvalidInput, OperationTimeout, SessionClosed
from convmem.events import (
    AnyEvent,
    ConversationTurn,
    ItemPopped,
    MemoryHealth,
    MemoryKey,
    MessageItem,
    TurnAdded,
)
from convmem.projections import (
    AddItems,
    AddTurn,
    AdoptTurns,
    Clear,
    Command,
    PopItem,
    Restore,
    SessionState,
    StartSession,
    estimate_tokens,
    llm_context,
    parse_export,
    to_dict,
)

if TYPE_CHECKING:
    from convmem.actors._system import MemorySystem

__all__ = ["AsyncSessionHandle", "SessionHandle"]

T = TypeVar("T")


def _turn_index(events: list[AnyEvent]) -> int:
    for event in events:
        if isinstance(event, TurnAdded):
            return event.index
    return 0


def _check_turn(turn: object) -> ConversationTurn:
    if not isinstance(turn, ConversationTurn):
        raise InvalidInput("turn", f"must be a ConversationTurn, got {type(turn).__name__}")
    return turn


def _check_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidInput("idempotency_key", "must be a non-empty string of at most 200 characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidInput("idempotency_key", "must not contain control characters")
    return value


def _items(items: Sequence[Mapping[str, Any] | MessageItem]) -> AddItems:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise InvalidInput("items", f"must be a list of items, got {type(items).__name__}")
    parsed = tuple(
        item if isinstance(item, MessageItem) else MessageItem.from_agents(item, field=f"items[{i}]")
        for i, item in enumerate(items)
    )
    if not parsed:
        raise InvalidInput("items", "must not be empty")
    return AddItems(items=parsed)


def _popped(events: list[AnyEvent]) -> dict[str, Any] | None:
    for event in events:
        if isinstance(event, ItemPopped):
            return event.item.to_agents()
    return None


def _start(handle: _Reads, injected_summary: str | None, injected_from: MemoryKey | None) -> StartSession:
    config = handle._system.config_for(handle.key)
    return StartSession(
        key=handle.key, config=config, injected_summary=injected_summary, injected_from=injected_from
    )


def _restore(state: Mapping[str, Any], origin: str = "") -> Restore:
    summary, _health, turns = parse_export(state)
    return Restore(summary=summary, turns=turns, origin=origin)


class _Reads:
    """Read-side views shared by both handles (pure functions of the latest state)."""

    _system: MemorySystem
    key: MemoryKey

    def _state(self) -> SessionState:
        return self._view_state(self._system.cell(self.key).state)

    def _view_state(self, state: SessionState) -> SessionState:
        if not state.started:
            # Nothing stored yet: views follow the configuration the session will start with.
            return msgspec.structs.replace(state, config=self._system.config_for(self.key))
        return state

    def _context(self, cell: StateCell) -> dict[str, Any]:
        """The context view of the cell's state, built once per state.

        A state is immutable, so its view is cached on the session's cell and
        each call gets fresh outer dicts and lists: a caller may add to them
        freely. The turn dicts inside are shared between calls; treat them as
        read-only (changing one changes later views of the same state, never
        the stored state or the log).
        """
        state = self._view_state(cell.state)
        cached = cell.view
        if cached is not None and cached[0] is state:
            patch = cached[1]
        else:
            patch = llm_context(state, self._system.estimator_for(self.key))
            if state is cell.state:
                cell.view = (state, patch)
        if not patch:
            return {}
        memory = patch["conversation_memory"]
        return {"conversation_memory": {k: list(v) if isinstance(v, list) else v for k, v in memory.items()}}

    def snapshot_state(self) -> SessionState:
        """The session's latest acknowledged state (immutable): exactly what a replay gives."""
        return self._system.cell(self.key).state

    @property
    def health(self) -> MemoryHealth:
        """The session's summarization health."""
        return self._state().health

    def estimate_tokens(self) -> int:
        """Tokens of the context view (the configured estimator)."""
        return estimate_tokens(self._state(), self._system.estimator_for(self.key))

    def to_dict(self) -> dict[str, Any]:
        """The RFC's export of the session's memory."""
        return to_dict(self._state())


class SessionHandle(_Reads):
    """Blocking handle for threaded planners; every wait has a timeout."""

    def __init__(self, system: MemorySystem, key: MemoryKey) -> None:
        self._system = system
        self.key = key

    def _send(self, command: Command, timeout: float | None, command_id: str | None = None) -> list[AnyEvent]:
        system = self._system
        _refuse_on_the_log_loop(system, "write")
        reply: concurrent.futures.Future[list[AnyEvent]] = concurrent.futures.Future()
        if timeout is None or timeout >= system.timeout:
            # This thread waits anyway: it runs the write itself when the session is idle (the
            # log's own timeouts bound that). A shorter timeout is kept by waiting apart from it.
            system.call(self.key, Write(command, reply, command_id))
        else:
            system.tell(self.key, Write(command, reply, command_id))
        return _wait(reply, timeout if timeout is not None else system.timeout, "write")

    def add_turn(
        self, turn: ConversationTurn, *, timeout: float | None = None, idempotency_key: str | None = None
    ) -> int:
        """Store a completed turn; returns its number once the log acknowledged it.

        With `idempotency_key`, a retry of the same call stores the turn once
        (the retry then returns 0: the turn was already stored by the first call).
        """
        return _turn_index(
            self._send(AddTurn(turn=_check_turn(turn)), timeout, _check_idempotency_key(idempotency_key))
        )

    def start(
        self,
        *,
        injected_summary: str | None = None,
        injected_from: MemoryKey | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Open the session now, recording a summary injected from another session.

        Returns False when the session had already started (nothing is written).
        """
        return bool(self._send(_start(self, injected_summary, injected_from), timeout))

    def add_items(
        self, items: Sequence[Mapping[str, Any] | MessageItem], *, timeout: float | None = None
    ) -> None:
        """Store agent items (OpenAI-Agents session items) as they arrive."""
        self._send(_items(items), timeout)

    def pop_item(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Remove and return the session's last item (None when the session is empty)."""
        return _popped(self._send(PopItem(), timeout))

    def get_llm_context(self) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context` (its turn dicts are read-only)."""
        return self._context(self._system.cell(self.key))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        _refuse_on_the_log_loop(self._system, "flush")
        reply: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._system.tell(self.key, Flush(reply))
        _wait(reply, timeout if timeout is not None else self._system.timeout, "flush")

    def clear(self, *, timeout: float | None = None) -> None:
        """Forget the turns and summary (the log keeps them for audit)."""
        self._send(Clear(), timeout)

    def from_dict(self, state: Mapping[str, Any], *, timeout: float | None = None, origin: str = "") -> None:
        """Replace the session's content with a `to_dict()` export; ValueError when invalid.

        `origin` is recorded in the `SessionRestored` event (where the state came from).
        """
        self._send(_restore(state, origin), timeout)

    def refresh(self, *, timeout: float | None = None) -> SessionState:
        """Reload from the log (to see another process's writes) and return the state."""
        _refuse_on_the_log_loop(self._system, "refresh")
        reply: concurrent.futures.Future[SessionState] = concurrent.futures.Future()
        self._system.tell(self.key, Refresh(reply))
        return _wait(reply, timeout if timeout is not None else self._system.timeout, "refresh")

    @property
    def aio(self) -> AsyncSessionHandle:
        """The asyncio handle on the same session."""
        return AsyncSessionHandle(self._system, self.key)


class _LoopInbox:
    """Answers for one asyncio loop, settled on other threads and handed over in batches.

    One `call_soon_threadsafe` (a wake-up of the loop) per batch instead of
    one per answer, as `asyncio.wrap_future` would make.
    """

    __slots__ = ("__weakref__", "_items", "_lock", "_loop", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the registry of inboxes is keyed by the loop, and must not keep it alive.
        self._loop = weakref.ref(loop)
        self._items: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def deliver(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        with self._lock:
            self._items.append((future, result, error))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        if loop is None:
            return  # the loop is gone, and whoever waited on it
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for future, result, error in items:
            if future.done():
                continue  # its caller stopped waiting (a timeout)
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopInbox] = weakref.WeakKeyDictionary()
_inboxes_lock = threading.Lock()


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    inbox = _inboxes.get(loop)
    if inbox is None:
        with _inboxes_lock:
            inbox = _inboxes.setdefault(loop, _LoopInbox(loop))
    return inbox


_PENDING, _RUNNING, _CANCELLED, _FINISHED = range(4)


class _LoopReply:
    """A write's answer (`Settle`) for an asyncio caller: settled on any thread, answered on its loop.

    What the session actor needs of a `concurrent.futures.Future`, without its
    condition variable and per-answer wake-up: the answer goes to `future` on
    the caller's loop through the loop's `_LoopInbox`.
    """

    __slots__ = ("_inbox", "_lock", "_state", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[Any] = loop.create_future()
        self._inbox = _inbox(loop)
        self._lock = threading.Lock()
        self._state = _PENDING

    def set_running_or_notify_cancel(self) -> bool:
        with self._lock:
            if self._state == _CANCELLED:
                return False
            if self._state != _PENDING:
                raise RuntimeError("the write's reply was started twice")
            self._state = _RUNNING
            return True

    def running(self) -> bool:
        return self._state == _RUNNING

    def done(self) -> bool:
        return self._state >= _CANCELLED

    def cancel(self) -> bool:
        """Before the write starts: it never will (its caller gave up, or the loop closed)."""
        with self._lock:
            if self._state != _PENDING:
                return self._state == _CANCELLED
            self._state = _CANCELLED
        self._inbox.deliver(self.future, None, SessionClosed("the write was cancelled before it started"))
        return True

    def expire(self, wait: float) -> None:
        """On the caller's loop, once its wait ran out: it gets `OperationTimeout`; the write may go on."""
        if self.future.done():
            return
        self.cancel()  # not started yet: it never will be
        self.future.set_exception(
            OperationTimeout(
                f"write did not finish within {wait:g}s (it may still complete; retry with the same "
                "idempotency_key to store it once)"
            )
        )

    def set_result(self, result: Any, /) -> None:
        self._finish(result, None)

    def set_exception(self, exception: BaseException | None, /) -> None:
        self._finish(None, exception or RuntimeError("a write failed without an error"))

    def _finish(self, result: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._state >= _CANCELLED:
                raise concurrent.futures.InvalidStateError("the write was answered already")
            self._state = _FINISHED
        self._inbox.deliver(self.future, result, error)


class AsyncSessionHandle(_Reads):
    """asyncio handle: PenguiFlow's `ShortTermMemory` protocol (plus the other views)."""

    def __init__(self, system: MemorySystem, key: MemoryKey) -> None:
        self._system = system
        self.key = key

    async def _deliver(self, message: Write | Flush | Refresh) -> None:
        system = self._system
        if not system.tell_if_live(self.key, message):
            await asyncio.to_thread(system.tell, self.key, message)

    async def _send(
        self, command: Command, timeout: float | None, command_id: str | None = None
    ) -> list[AnyEvent]:
        system, key = self._system, self.key
        reply = _LoopReply(asyncio.get_running_loop())
        message = Write(command, reply, command_id)
        # With a log that appends on its own loop, a live session's write needs no thread: it is
        # decided and begun right here (the log settles it). Otherwise the session's thread runs it.
        if system.loop_log is None or not system.claim_live(key, message):
            await self._deliver(message)
        wait = timeout if timeout is not None else system.timeout
        expiry = asyncio.get_running_loop().call_later(wait, reply.expire, wait)
        try:
            result: list[AnyEvent] = await reply.future
            return result
        finally:
            expiry.cancel()

    async def _read_state(self) -> SessionState:
        if self._system.is_live(self.key):
            return self._state()
        return await asyncio.to_thread(self._state)

    async def add_turn(
        self, turn: ConversationTurn, *, timeout: float | None = None, idempotency_key: str | None = None
    ) -> int:
        """Store a completed turn; returns its number once the log acknowledged it."""
        return _turn_index(
            await self._send(
                AddTurn(turn=_check_turn(turn)), timeout, _check_idempotency_key(idempotency_key)
            )
        )

    async def start(
        self,
        *,
        injected_summary: str | None = None,
        injected_from: MemoryKey | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Open the session now, recording a summary injected from another session.

        Returns False when the session had already started (nothing is written).
        """
        return bool(await self._send(_start(self, injected_summary, injected_from), timeout))

    async def add_items(
        self, items: Sequence[Mapping[str, Any] | MessageItem], *, timeout: float | None = None
    ) -> None:
        """Store agent items (OpenAI-Agents session items) as they arrive."""
        await self._send(_items(items), timeout)

    async def pop_item(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Remove and return the session's last item (None when the session is empty)."""
        return _popped(await self._send(PopItem(), timeout))

    async def get_llm_context(self) -> dict[str, Any]:
        """The patch to merge into the planner's `llm_context` (its turn dicts are read-only)."""
        cell = self._system.live_cell(self.key)
        if cell is None:  # activating reads the log: not on the event loop
            cell = await asyncio.to_thread(self._system.cell, self.key)
        return self._context(cell)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until no summarization is pending or in flight (or the session is DEGRADED)."""
        _refuse_on_the_log_loop(self._system, "flush")
        reply: concurrent.futures.Future[None] = concurrent.futures.Future()
        await self._deliver(Flush(reply))
        await _await(reply, timeout if timeout is not None else self._system.timeout, "flush")

    async def clear(
        self,
        *,
        timeout: float | None = None,
        moved_to: MemoryKey | None = None,
        through: int | None = None,
        reason: str = "",
    ) -> None:
        """Forget the turns and summary (the log keeps them for audit).

        `moved_to` records that the turns now live in that session (see
        `adopt`); with `through`, the clear is refused (`InvalidInput`) if
        turns numbered above it arrived meanwhile.
        """
        command = Clear(reason=reason or "cleared by caller", moved_to=moved_to, through=through)
        await self._send(command, timeout)

    async def restore(
        self,
        state: Mapping[str, Any],
        *,
        timeout: float | None = None,
        origin: str = "",
        idempotency_key: str | None = None,
    ) -> bool:
        """Replace the session's content with a `to_dict()` export; ValueError when invalid.

        `origin` is recorded in the `SessionRestored` event. Returns False when
        `idempotency_key` names a restore the session already stored.
        """
        events = await self._send(_restore(state, origin), timeout, _check_idempotency_key(idempotency_key))
        return bool(events)

    async def adopt(
        self,
        source: MemoryKey,
        source_seq: int,
        turns: Sequence[ConversationTurn],
        *,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> bool:
        """Append turns moved here from session `source` (its events up to `source_seq`).

        One `TurnsAdopted` event; False when `idempotency_key` names a move
        the session already stored. Clear `source` with ``moved_to`` after it.
        """
        command = AdoptTurns(source=source, source_seq=source_seq, turns=tuple(_check_turn(t) for t in turns))
        events = await self._send(command, timeout, _check_idempotency_key(idempotency_key))
        return bool(events)

    def from_dict(self, state: Mapping[str, Any]) -> None:
        """Synchronous `from_dict` (the RFC's signature); prefer `await restore(state)` on a loop."""
        SessionHandle(self._system, self.key).from_dict(state)

    async def refresh(self, *, timeout: float | None = None) -> SessionState:
        """Reload from the log and return the state."""
        reply: concurrent.futures.Future[SessionState] = concurrent.futures.Future()
        await self._deliver(Refresh(reply))
        return await _await(reply, timeout if timeout is not None else self._system.timeout, "refresh")

    async def persist(self, store: Any, key: str) -> None:
        """Nothing to do: every change is already durable in the log (PenguiFlow's hook)."""
        del store, key

    async def hydrate(self, store: Any, key: str) -> None:
        """Nothing to do: the session rebuilds itself from the log (PenguiFlow's hook)."""
        del store, key


def _refuse_on_the_log_loop(system: MemorySystem, what: str) -> None:
    """A blocking call on the log's own loop thread would wait for that loop: a clear error instead."""
    log = system.loop_log
    if log is not None and log.on_loop_thread():
        raise RuntimeError(
            f"a blocking {what} was made on the NATS connection's event loop thread, where it would "
            "deadlock; use the asyncio handle (.aio) there, or asyncio.to_thread"
        )


def _wait(reply: concurrent.futures.Future[T], timeout: float, what: str) -> T:
    try:
        return reply.result(timeout=timeout)
    except ConvmemError:
        raise  # the work's own error (an OperationTimeout included), not our wait timing out
    except concurrent.futures.TimeoutError:
        raise OperationTimeout(
            f"{what} did not finish within {timeout:g}s (a write may still complete; retry with "
            "the same idempotency_key to store it once)"
        ) from None


async def _await(reply: concurrent.futures.Future[T], timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(reply), timeout)
    except ConvmemError:
        raise  # the work's own error (an OperationTimeout included), not our wait timing out
    except TimeoutError:
        raise OperationTimeout(f"{what} did not finish within {timeout:g}s") from None
