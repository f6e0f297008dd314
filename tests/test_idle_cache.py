"""The idle cache: a session past the live bound keeps its state and view without an actor.

Reads of a cached session need no actor and no log; a write starts an actor
from the cache without reading the log, and optimistic concurrency still
catches another writer. Everything that makes a cached state wrong drops it:
erasure (here or elsewhere), passivation, fork into the key; refresh, clear
and restore go through the session as ever.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import tracemalloc
from collections.abc import Sequence

import pykka
import pytest
from runtime_helpers import WAIT, Harness, key, replay_log, stored_users, turn, users, wait_until

import convmem.actors._idle as idle_module
from convmem import MemorySystem
from convmem.actors import LoggedEvent
from convmem.actors._idle import DEFAULT_IDLE_CACHE_BYTES, idle_bytes
from convmem.actors._session import SessionActor, StateCell
from convmem.adapters import InMemoryErasureJournal, InMemoryEventLog
from convmem.errors import InvalidConfig
from convmem.events import ConversationTurn, Event, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import SessionState, decode_state, encode_state, llm_context

TRUNCATION = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))
A, B, C = key("a"), key("b"), key("c")
EMPTY = {"conversation_memory": {"recent_turns": []}}
"""The context view of a session with no turns."""


class CountingLog(InMemoryEventLog):
    """An in-memory log that counts its reads and records the threads its appends run on."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.append_threads: list[str] = []

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        self.reads += 1
        return super().read(key, after_seq=after_seq)

    def append(self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int) -> int:
        self.append_threads.append(threading.current_thread().name)
        return super().append(key, events, expected_seq=expected_seq)


def evicted(harness: Harness, log: InMemoryEventLog | None = None, **kwargs: object) -> MemorySystem:
    """A system with one live session at most, where A (two turns) was evicted by B: A is cached."""
    system = harness.system(TRUNCATION, log=log, max_live_sessions=1, **kwargs)
    system.session(A).add_turn(turn("a1"))
    system.session(A).add_turn(turn("a2"))
    system.session(B).add_turn(turn("b1"))
    assert not system.is_live(A)
    return system


def counts(system: MemorySystem) -> dict[str, int]:
    return dict(system.metrics.snapshot()["counts"])


def test_reads_of_a_cached_session_need_no_actor_and_no_log(harness: Harness) -> None:
    """The evicted session's view is served from its cached cell: no activation, no read of the log."""
    log = CountingLog()
    system = evicted(harness, log)
    assert system.is_cached(A)
    expected = llm_context(replay_log(log, A))
    before, reads = counts(system), log.reads
    handle = system.session(A)
    assert handle.get_llm_context() == expected
    assert users(handle.snapshot_state()) == ["a1", "a2"]
    assert handle.to_dict()["turns"][-1]["user_message"] == "a2"
    assert log.reads == reads
    assert not system.is_live(A)
    assert counts(system).get("activations") == before.get("activations")


def test_an_async_read_of_a_cached_session_stays_on_the_loop(harness: Harness) -> None:
    """The asyncio handle reads a cached session right on its loop (no worker thread, no log)."""
    log = CountingLog()
    system = evicted(harness, log)
    expected, state = llm_context(replay_log(log, A)), replay_log(log, A)
    reads = log.reads

    async def read() -> None:
        assert await system.async_session(A).get_llm_context() == expected
        assert system.async_session(A).state_if_live() == state

    asyncio.run(read())
    assert log.reads == reads


def test_a_write_to_a_cached_session_starts_its_actor_on_the_callers_thread_without_the_log(
    harness: Harness,
) -> None:
    """Activation from the cache reads nothing, and the write runs at once on the caller's thread."""
    log = CountingLog()
    system = evicted(harness, log)
    reads, hits = log.reads, counts(system).get("idle_cache_hits", 0)
    system.session(A).add_turn(turn("a3"))
    assert log.reads == reads
    assert log.append_threads[-1] == threading.current_thread().name
    assert counts(system)["idle_cache_hits"] == hits + 1
    assert system.is_live(A)
    assert not system.is_live(B)
    assert system.is_cached(B)
    assert not system.is_cached(A)
    # B's actor was idle: it stopped on this thread, before the write returned.
    assert len(pykka.ActorRegistry.get_by_class(SessionActor)) == 1
    assert system.session(A).snapshot_state() == replay_log(log, A)


def test_the_cache_keeps_to_its_bytes_and_drops_the_least_recently_used(harness: Harness) -> None:
    """Past `idle_cache_bytes` the oldest cells go; their sessions come back from the log, whole."""
    probe = harness.system(TRUNCATION)
    probe.session(C).add_turn(turn("c0"))
    one = idle_bytes(StateCell(probe.session(C).snapshot_state(), 0.0))
    system = harness.system(TRUNCATION, max_live_sessions=1, idle_cache_bytes=3 * one + one // 2)
    keys = [key(f"s{i}") for i in range(8)]
    for k in keys:
        system.session(k).add_turn(turn(f"{k.session_id}-0"))
    sessions, size = system.cached_sessions()
    assert sessions == 3
    assert size <= 3 * one + one // 2
    assert [k for k in keys if system.is_cached(k)] == keys[-4:-1]  # the newest but the live one
    for k in keys:
        assert system.session(k).snapshot_state() == replay_log(harness.log, k)
    assert system.cached_sessions()[1] <= 3 * one + one // 2


def test_a_passivated_state_is_counted_outside_the_live_sets_lock_and_exactly(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count of an evicted session's cell (an encode of its whole state) never runs under the lock
    every write takes, and the cache's bytes are each cell's exact count once the evicting write returns."""
    system = harness.system(TRUNCATION, max_live_sessions=1)
    lock = system._sessions._lock
    counted: list[bool] = []
    real = idle_module.state_bytes

    def watched(state: SessionState) -> int:
        counted.append(lock._is_owned())  # type: ignore[attr-defined]
        return real(state)

    monkeypatch.setattr(idle_module, "state_bytes", watched)
    keys = [key(f"s{i}") for i in range(6)]
    for n in range(3):
        for k in keys:
            system.session(k).add_turn(turn(f"{k.session_id}-{n}"))
            assert system.session(k).get_llm_context()  # the live session's view: counted with it
    assert counted, "no cached cell was counted"
    assert not any(counted), f"{counted.count(True)} of {len(counted)} counts ran under the live set's lock"
    monkeypatch.undo()
    cached = [k for k in keys if system.is_cached(k)]
    assert len(cached) == 5
    cells = [system._sessions.idle._entries[k].cell for k in cached]
    assert all(cell.view is not None for cell in cells)
    assert system.cached_sessions() == (5, sum(idle_bytes(cell) for cell in cells))


def test_a_cell_too_big_for_the_cache_is_not_kept(harness: Harness) -> None:
    """With `idle_cache_bytes=0` nothing is cached: every read of an evicted session reads the log."""
    log = CountingLog()
    system = evicted(harness, log, idle_cache_bytes=0)
    assert system.cached_sessions() == (0, 0)
    reads = log.reads
    assert users(system.session(A).snapshot_state()) == ["a1", "a2"]
    assert log.reads > reads


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1GB"])
def test_idle_cache_bytes_is_checked(harness: Harness, bad: object) -> None:
    with pytest.raises(InvalidConfig, match="idle_cache_bytes"):
        harness.system(TRUNCATION, idle_cache_bytes=bad)


def test_the_default_bound_is_512_mib(harness: Harness) -> None:
    assert DEFAULT_IDLE_CACHE_BYTES == 512 * 1024 * 1024
    system = harness.system(TRUNCATION)
    assert system._sessions.idle.max_bytes == DEFAULT_IDLE_CACHE_BYTES


@pytest.mark.parametrize("char", ["a", "字", "🙂"])
def test_idle_bytes_is_at_least_what_a_cached_session_holds_and_at_most_twice(char: str) -> None:
    """`idle_bytes` of 20-turn sessions with their views against tracemalloc's measure of them."""
    log = InMemoryEventLog()
    with MemorySystem(ShortTermMemoryConfig(strategy="truncation"), log=log) as system:
        handle = system.session(A)
        for _ in range(20):
            handle.add_turn(ConversationTurn(user_message=char * 150, assistant_response=char * 380))
        blob = encode_state(handle.snapshot_state())
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        cells = []
        for _ in range(50):
            cell = StateCell(decode_state(blob), 0.0)
            cell.view = (cell.state, llm_context(cell.state))
            cells.append(cell)
        measured = (tracemalloc.get_traced_memory()[0] - start) / len(cells)
    finally:
        tracemalloc.stop()
    estimate = idle_bytes(cells[0])
    assert measured <= estimate <= 2 * measured, (measured, estimate)


# What makes a cached state wrong drops it, or goes through the session -------------------------


def test_erase_drops_the_cached_session(harness: Harness) -> None:
    system = evicted(harness)
    assert system.is_cached(A)
    system.erase(A)
    assert not system.is_cached(A)
    assert system.session(A).get_llm_context() == EMPTY
    assert system.session(A).to_dict()["turns"] == []


def test_an_erasure_by_another_system_drops_the_cached_session() -> None:
    """The erasure watch reaches the cache: the holder forgets its cached copy, then reads the log."""
    log, journal = InMemoryEventLog(), InMemoryErasureJournal()
    with (
        MemorySystem(TRUNCATION, log=log, journal=journal) as eraser,
        MemorySystem(TRUNCATION, log=log, journal=journal, max_live_sessions=1) as holder,
    ):
        holder.session(A).add_turn(turn("secret"))
        holder.session(B).add_turn(turn("kept"))
        assert holder.is_cached(A)
        eraser.erase(A)
        wait_until(lambda: not holder.is_cached(A), message="the holder drops its cached copy")
        assert holder.session(A).get_llm_context() == EMPTY
        assert users(holder.session(B).snapshot_state()) == ["kept"]


def test_passivate_drops_the_cached_state(harness: Harness) -> None:
    log = CountingLog()
    system = evicted(harness, log)
    assert system.passivate(A)
    assert not system.is_cached(A)
    assert not system.passivate(A)
    reads = log.reads
    assert users(system.session(A).snapshot_state()) == ["a1", "a2"]
    assert log.reads > reads


def test_a_write_by_another_system_is_caught_when_the_cached_session_writes(harness: Harness) -> None:
    """The cached state is behind the log: the next write conflicts, rereads it and stores after it."""
    system = evicted(harness)
    other = harness.system(TRUNCATION)
    other.session(A).add_turn(turn("elsewhere"))
    other.close()
    assert users(system.session(A).snapshot_state()) == ["a1", "a2"]  # as a live session: until it writes
    conflicts = counts(system).get("conflicts", 0)
    system.session(A).add_turn(turn("a3"))
    assert counts(system)["conflicts"] == conflicts + 1
    assert stored_users(harness.log, A) == ["a1", "a2", "elsewhere", "a3"]
    system.session(C).add_turn(turn("c"))  # A goes back to the cache, with the log's truth
    assert system.is_cached(A)
    assert system.session(A).snapshot_state() == replay_log(harness.log, A)


def test_refresh_of_a_cached_session_reads_the_log(harness: Harness) -> None:
    system = evicted(harness)
    other = harness.system(TRUNCATION)
    other.session(A).add_turn(turn("elsewhere"))
    other.close()
    assert users(system.session(A).refresh()) == ["a1", "a2", "elsewhere"]
    assert system.session(A).snapshot_state() == replay_log(harness.log, A)


def test_clear_and_restore_of_a_cached_session(harness: Harness) -> None:
    system = evicted(harness)
    system.session(A).clear()
    system.session(C).add_turn(turn("c"))
    assert system.is_cached(A)
    assert system.session(A).get_llm_context() == llm_context(replay_log(harness.log, A))
    assert users(system.session(A).snapshot_state()) == []
    assert system.session(A).restore(system.session(B).to_dict())
    system.session(C).add_turn(turn("c2"))
    assert system.is_cached(A)
    assert users(system.session(A).snapshot_state()) == ["b1"]
    assert system.session(A).snapshot_state() == replay_log(harness.log, A)


def test_a_fork_into_a_cached_key_shows_the_fork(harness: Harness) -> None:
    """A read of a session with no events caches its empty state; a fork into it replaces that."""
    system = evicted(harness)
    fork = key("fork")
    assert system.session(fork).get_llm_context() == EMPTY
    assert system.is_cached(fork)
    system.fork(A, to=fork)
    assert users(system.session(fork).snapshot_state()) == ["a1", "a2"]


class StaleReadLog(InMemoryEventLog):
    """An in-memory log whose next read, once armed, returns what it read only when the gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def read(self, key: MemoryKey, *, after_seq: int = 0) -> list[LoggedEvent]:
        records = super().read(key, after_seq=after_seq)
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        return records


def test_a_read_that_loaded_the_log_across_an_erasure_reads_it_again(harness: Harness) -> None:
    """A cell read from the log before an erasure and cached after it would hold erased turns."""
    log = StaleReadLog()
    system = harness.system(TRUNCATION, log=log, snapshots=None)
    system.session(A).add_turn(turn("secret"))
    assert system.passivate(A)
    log.armed = True
    shown: list[list[str]] = []
    reader = threading.Thread(target=lambda: shown.append(users(system.session(A).snapshot_state())))
    reader.start()
    assert log.entered.wait(WAIT)
    log.erase(A, at=1.0)
    system.forget(lambda k: k == A)  # what the erasure watch does on hearing of it
    log.gate.set()
    reader.join(WAIT)
    assert shown == [[]]
    assert users(system.session(A).snapshot_state()) == []


def test_a_twenty_turn_session_costs_about_22_kb_in_the_cache(harness: Harness) -> None:
    """The README's figure: 20 turns of 150 + 380 characters, with the view, about 22 KB."""
    system = harness.system(ShortTermMemoryConfig(strategy="truncation"))
    handle = system.session(A)
    for n in range(20):
        handle.add_turn(ConversationTurn(user_message=f"{n:03}" + "u" * 147, assistant_response="a" * 380))
    cell = StateCell(handle.snapshot_state(), 0.0)
    cell.view = (cell.state, handle.get_llm_context())
    assert 20_000 <= idle_bytes(cell) <= 24_000
    assert 23_000 <= DEFAULT_IDLE_CACHE_BYTES // idle_bytes(cell) <= 26_000
