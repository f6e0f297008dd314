"""The asyncio handle: many tasks, several sessions, a loop that never blocks, PenguiFlow's surface.

No pytest plugin is needed: each test runs its coroutine with `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import pytest
from runtime_helpers import (
    EchoSummarizer,
    Harness,
    PlannedSummarizer,
    key,
    replay_log,
    stored_users,
    summarizing_config,
    turn,
    users,
)

from convmem.actors import AsyncSessionHandle
from convmem.errors import OperationTimeout, SessionClosed
from convmem.events import ConversationTurn, MemoryBudget, MemoryHealth, ShortTermMemoryConfig

TRUNCATION = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))


class Heartbeat:
    """A task that counts how often the event loop let it run."""

    def __init__(self) -> None:
        self.beats = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            self.beats += 1
            await asyncio.sleep(0)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


def test_many_tasks_on_one_session_store_every_turn_once(harness: Harness) -> None:
    """asyncio.gather of many add_turn on one handle: numbers 1..n, each turn stored once."""
    system = harness.system(summarizing_config(full_zone_turns=3), summarizer=EchoSummarizer())
    session = system.async_session(key())

    async def main() -> list[int]:
        numbers = await asyncio.gather(*(session.add_turn(turn(f"a{i}")) for i in range(60)))
        await session.flush(timeout=10)
        return numbers

    numbers = asyncio.run(main())
    assert sorted(numbers) == list(range(1, 61))
    stored = stored_users(harness.log, key())
    assert sorted(stored) == sorted(f"a{i}" for i in range(60))
    by_number = dict(zip(numbers, (f"a{i}" for i in range(60)), strict=True))
    assert stored == [by_number[n] for n in range(1, 61)]  # the returned number is the stored position
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_tasks_on_several_sessions_keep_them_apart(harness: Harness) -> None:
    """Tasks writing to several sessions at once: each session gets exactly its own turns, in order."""
    system = harness.system(TRUNCATION, max_live_sessions=3)
    keys = [key(f"s{i}") for i in range(6)]

    async def writer(i: int) -> None:
        session = system.async_session(keys[i])
        for n in range(15):
            await session.add_turn(turn(f"s{i}-{n}"))

    async def main() -> None:
        await asyncio.gather(*(writer(i) for i in range(len(keys))))

    asyncio.run(main())
    for i, k in enumerate(keys):
        assert stored_users(harness.log, k) == [f"s{i}-{n}" for n in range(15)]
        assert system.session(k).snapshot_state() == replay_log(harness.log, k)


def test_the_event_loop_keeps_running_while_the_summarizer_hangs(harness: Harness) -> None:
    """With a hanging summarizer, awaiting writes and a timing-out flush never stops the loop."""
    summarizer = PlannedSummarizer(default="hang")
    system = harness.system(summarizing_config(), summarizer=summarizer, max_live_sessions=2)
    session = system.async_session(key())

    async def main() -> tuple[int, int]:
        heartbeat = Heartbeat()
        heartbeat.start()
        for i in range(3):
            await session.add_turn(turn(f"t{i}"))
        await asyncio.to_thread(summarizer.wait_calls, 1)
        before = heartbeat.beats
        with pytest.raises(OperationTimeout):
            await session.flush(timeout=0.2)
        during_flush = heartbeat.beats - before
        # Writes to a passivated session activate it off the loop (reading the log).
        for i in range(3, 10):
            system.passivate(key("other"))
            await system.async_session(key("other")).add_turn(turn(f"o{i}"))
            await session.add_turn(turn(f"t{i}"))
        await heartbeat.stop()
        return during_flush, heartbeat.beats

    during_flush, total = asyncio.run(main())
    assert during_flush > 20  # the loop ran the heartbeat while flush was waiting
    assert total > during_flush
    assert summarizer.hanging >= 1
    assert users(replay_log(harness.log, key())) == [f"t{i}" for i in range(10)]


def test_async_reads_see_the_latest_acknowledged_write(harness: Harness) -> None:
    """After `await add_turn`, the async context and token estimate include that turn."""
    system = harness.system(TRUNCATION)
    session = system.async_session(key())

    async def main() -> None:
        for i in range(5):
            await session.add_turn(turn(f"t{i}"))
            context = await session.get_llm_context()
            assert context["conversation_memory"]["recent_turns"][-1]["user"] == f"t{i}"
        assert session.estimate_tokens() > 0
        await session.clear()
        assert (await session.get_llm_context())["conversation_memory"]["recent_turns"] == []

    asyncio.run(main())
    assert session.snapshot_state() == replay_log(harness.log, key())


def test_async_calls_after_close_raise_session_closed(harness: Harness) -> None:
    """Awaiting a handle of a closed system raises SessionClosed."""
    system = harness.system(TRUNCATION)
    session = system.async_session(key())

    async def main() -> None:
        await session.add_turn(turn("t"))
        system.close()
        with pytest.raises(SessionClosed):
            await session.add_turn(turn("late"))
        with pytest.raises(SessionClosed):
            await session.get_llm_context()

    asyncio.run(main())


@runtime_checkable
class ShortTermMemory(Protocol):
    """PenguiFlow's protocol (seed RFC), with its persistence and serialization extensions."""

    @property
    def health(self) -> MemoryHealth: ...

    async def add_turn(self, turn: ConversationTurn) -> Any: ...

    async def get_llm_context(self) -> Mapping[str, Any]: ...

    def estimate_tokens(self) -> int: ...

    async def flush(self) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...

    def from_dict(self, state: dict[str, Any]) -> None: ...

    async def persist(self, store: Any, key: str) -> None: ...

    async def hydrate(self, store: Any, key: str) -> None: ...


def test_async_handle_satisfies_penguiflows_memory_protocol(harness: Harness) -> None:
    """AsyncSessionHandle has PenguiFlow's surface, with the same sync/async split, and it works."""
    system = harness.system(summarizing_config(), summarizer=EchoSummarizer())
    memory = system.async_session(key("a"))
    assert isinstance(memory, ShortTermMemory)
    for name in ("add_turn", "get_llm_context", "flush", "persist", "hydrate"):
        assert inspect.iscoroutinefunction(getattr(AsyncSessionHandle, name)), name
    for name in ("estimate_tokens", "to_dict", "from_dict"):
        assert not inspect.iscoroutinefunction(getattr(AsyncSessionHandle, name)), name
    assert isinstance(AsyncSessionHandle.__dict__.get("health") or AsyncSessionHandle.health, property)

    async def main() -> dict[str, Any]:
        assert memory.health is MemoryHealth.HEALTHY
        for i in range(5):
            await memory.add_turn(turn(f"t{i}"))
        await memory.flush()
        context = await memory.get_llm_context()
        assert context["conversation_memory"]["summary"] == "covers 3 turns; latest: t2"
        assert memory.estimate_tokens() > 0
        await memory.persist(object(), key("a").composite())
        await memory.hydrate(object(), key("a").composite())
        return memory.to_dict()

    exported = asyncio.run(main())
    other = system.async_session(key("b"))
    other.from_dict(exported)  # synchronous, as in the RFC (called off the loop here)
    assert other.to_dict()["turns"] == exported["turns"]
    assert other.to_dict()["summary"] == exported["summary"]

    async def restore_on_loop() -> None:
        third = system.async_session(key("c"))
        await third.restore(exported)
        assert third.to_dict()["summary"] == exported["summary"]
        with pytest.raises(ValueError, match="version"):
            await third.restore({"version": 0})

    asyncio.run(restore_on_loop())
    assert memory.snapshot_state() == replay_log(harness.log, key("a"))
