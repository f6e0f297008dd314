"""Many writers: one session from many threads, many sessions at once, two systems on one log."""

from __future__ import annotations

import asyncio
import threading

import pytest
from nats_fixtures import EmbeddedNatsServer
from runtime_helpers import (
    EchoSummarizer,
    Harness,
    PlannedSummarizer,
    assert_each_writer_in_order,
    key,
    replay_log,
    run_threads,
    stored_users,
    summarizing_config,
    turn,
    users,
)

import convmem
from convmem.errors import ConcurrencyConflict, InvalidTurn
from convmem.events import MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import SessionState, agent_items

TRUNCATION = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))


def test_many_threads_on_one_session_store_every_turn_once_in_each_threads_order(harness: Harness) -> None:
    """Concurrent add_turn on one session: no turn lost or doubled, each thread's order kept."""
    summarizer = EchoSummarizer()
    system = harness.system(summarizing_config(full_zone_turns=4), summarizer=summarizer)
    threads, per_thread = 8, 25
    numbers: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        session = system.session(key())
        for i in range(per_thread):
            n = session.add_turn(turn(f"w{t}-{i}"))
            with lock:
                numbers.append(n)

    run_threads(threads, work)
    assert sorted(numbers) == list(range(1, threads * per_thread + 1))
    session = system.session(key())
    session.flush(timeout=10)
    assert_each_writer_in_order(stored_users(harness.log, key()), threads, per_thread)
    live = users(session.snapshot_state())  # the last turns, within the live horizon
    stored = stored_users(harness.log, key())
    assert live == stored[len(stored) - len(live) :]
    assert session.snapshot_state() == replay_log(harness.log, key())
    assert summarizer.calls > 0


def test_many_sessions_from_many_threads_keep_their_own_turns(harness: Harness) -> None:
    """Threads writing to many sessions at once: each session holds exactly its turns, in order."""
    system = harness.system(TRUNCATION)
    sessions = [key(f"s{i}") for i in range(12)]
    threads, per_session = 6, 8

    def work(t: int) -> None:
        for i in range(per_session):
            for k in sessions:
                system.session(k).add_turn(turn(f"w{t}-{i}"))

    run_threads(threads, work)
    for k in sessions:
        assert_each_writer_in_order(stored_users(harness.log, k), threads, per_session)
        assert system.session(k).snapshot_state() == replay_log(harness.log, k)


def test_a_writer_with_a_stale_state_reloads_and_stores_after_the_other(harness: Harness) -> None:
    """Two systems on one log: the stale one hits a conflict, reloads and appends after the other's turn."""
    first = harness.system(TRUNCATION, snapshots=None)
    second = harness.system(TRUNCATION, snapshots=None)
    a, b = first.session(key()), second.session(key())
    assert a.add_turn(turn("a1")) == 1
    assert b.add_turn(turn("b1")) == 2  # b's actor activated after a1 and is current
    assert a.add_turn(turn("a2")) == 3  # a's actor is stale: conflict, reload, decide again
    assert first.metrics.snapshot()["counts"]["conflicts"] == 1
    assert stored_users(harness.log, key()) == ["a1", "b1", "a2"]
    assert a.snapshot_state() == replay_log(harness.log, key())
    assert b.refresh(timeout=10) == replay_log(harness.log, key())


def test_two_systems_writing_one_session_concurrently_lose_no_acknowledged_turn(harness: Harness) -> None:
    """Two systems sharing one log and one session: every acknowledged turn is in the log exactly once."""
    systems = [harness.system(TRUNCATION, snapshots=None) for _ in range(2)]
    threads, per_thread = 6, 20
    acked: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        session = systems[t % 2].session(key())
        for i in range(per_thread):
            text = f"w{t}-{i}"
            try:
                session.add_turn(turn(text))
            except ConcurrencyConflict:  # gave up after its retries: not acknowledged, not stored
                with lock:
                    refused.append(text)
                continue
            with lock:
                acked.append(text)

    run_threads(threads, work)
    stored = stored_users(harness.log, key())
    assert sorted(stored) == sorted(acked)
    assert not set(refused) & set(stored)
    assert len(acked) >= threads * per_thread // 2  # a writer may give up under contention, not starve
    for t in range(threads):
        mine = [int(u.split("-")[1]) for u in stored if u.startswith(f"w{t}-")]
        assert mine == sorted(mine), f"thread {t}'s turns out of order"
    replayed = replay_log(harness.log, key())
    assert users(replayed) == stored[len(stored) - len(replayed.turns) :]  # the live horizon's last turns
    assert replayed.next_index == len(stored) + 1
    for system in systems:
        assert system.session(key()).refresh(timeout=10) == replayed


def test_readers_never_see_a_half_applied_write(harness: Harness) -> None:
    """Concurrent readers only ever see states that the log held: turn counts never go backwards."""
    system = harness.system(TRUNCATION)
    done = threading.Event()
    observed: list[list[int]] = []

    def work(t: int) -> None:
        session = system.session(key())
        if t == 0:
            for i in range(150):
                session.add_turn(turn(f"w0-{i}"))
            done.set()
            return
        counts: list[int] = []
        while not done.is_set():
            state = session.snapshot_state()
            counts.append(state.next_index - 1)
            # one SessionStarted (appended on its own, before the first turn), then one event per turn
            assert state.version == state.next_index - 1 + (1 if state.started else 0)
            assert len(state.turns) == min(state.next_index - 1, 100)  # the default live horizon
        observed.append(counts)

    run_threads(4, work)
    for counts in observed:
        assert counts == sorted(counts)
    assert system.session(key()).snapshot_state() == replay_log(harness.log, key())


def test_writes_to_one_session_do_not_block_other_sessions(harness: Harness) -> None:
    """A session whose summarizer hangs does not stop other sessions from being written."""
    summarizer = PlannedSummarizer(default="hang")
    system = harness.system(summarizing_config(), summarizer=summarizer, summarizer_workers=1)
    stuck = system.session(key("stuck"))
    for i in range(3):
        stuck.add_turn(turn(f"t{i}"))
    summarizer.wait_calls(1)
    others: list[MemoryKey] = [key(f"o{i}") for i in range(5)]

    def work(t: int) -> None:
        for i in range(10):
            system.session(others[t]).add_turn(turn(f"w{t}-{i}"), timeout=10)

    run_threads(len(others), work)
    for t, k in enumerate(others):
        assert stored_users(harness.log, k) == [f"w{t}-{i}" for i in range(10)]
    assert summarizer.hanging >= 1


def _kinds(state: SessionState | None) -> list[str]:
    assert state is not None
    return [item["type"] for item in agent_items(state) if "type" in item]


_CALL = {"type": "function_call", "name": "lookup", "call_id": "c1", "arguments": "{}"}
_RESULT = {"type": "function_call_output", "call_id": "c1", "output": "42"}


def test_a_refusal_is_checked_against_the_log_when_another_writer_moved_it(harness: Harness) -> None:
    """A stale live state would refuse a tool result whose call another process stored: it rereads first."""
    first = harness.system(TRUNCATION, snapshots=None)
    second = harness.system(TRUNCATION, snapshots=None)
    a, b = first.session(key()), second.session(key())
    a.add_turn(turn("a1"))
    assert b.snapshot_state().version == a.snapshot_state().version  # b is live and current
    a.add_items([_CALL])  # b does not see it
    b.add_items([_RESULT])  # refused on b's own state; stored once checked against the log
    assert b.snapshot_state() == replay_log(harness.log, key())
    assert _kinds(b.snapshot_state()) == ["function_call", "function_call_output"]


def test_a_refusal_that_holds_against_the_log_is_answered(harness: Harness) -> None:
    """A result with no call anywhere stays refused after the reread, and nothing is stored."""
    first = harness.system(TRUNCATION, snapshots=None)
    a = first.session(key())
    a.add_turn(turn("a1"))
    before = replay_log(harness.log, key())
    with pytest.raises(InvalidTurn, match="no function_call before it"):
        a.add_items([_RESULT])
    assert replay_log(harness.log, key()) == before


def test_a_stale_refusal_on_the_log_loop_is_rechecked(nats_server: EmbeddedNatsServer) -> None:
    """The same through asyncio handles on JetStream, where the write runs on the log's loop."""
    session_key = MemoryKey("acme", "ann", "tools")

    async def scenario() -> list[str]:
        with convmem.connect(nats_server.url) as one, convmem.connect(nats_server.url) as two:
            a, b = one.async_session(session_key), two.async_session(session_key)
            await a.add_turn(turn("a1"))
            await b.get_llm_context()  # b live at version 2
            await a.add_items([_CALL])
            await b.add_items([_RESULT])
            await b.refresh()
            return _kinds(b.state_if_live())

    assert asyncio.run(scenario()) == ["function_call", "function_call_output"]
