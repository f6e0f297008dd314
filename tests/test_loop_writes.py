"""Async writes with a log that appends on its own loop: begun on the caller's loop, settled on the log's.

No thread waits and none is woken for a live session's write: the caller's
loop decides it and starts its append, the log's loop settles it (publishing
the state and answering the caller there).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from nats_fixtures import frozen
from runtime_helpers import WAIT, key, live_state, turn, users, wait_until

import convmem
from convmem.actors import MemorySystem, Settle, load_state
from convmem.actors._answers import LoopAnswer
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, JetStreamEventLog, JetStreamSnapshotStore
from convmem.errors import InvalidInput, LogUnavailable, MemoryBudgetExceeded, OperationTimeout, SessionClosed
from convmem.events import Event, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import snapshot_offset

TRUNCATION = ShortTermMemoryConfig(strategy="truncation")


def on_an_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class CountingLog(JetStreamEventLog):
    """The JetStream log, counting the appends begun on a caller's event loop (the path under test)."""

    begun = 0

    def start_append(
        self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int, settle: Settle[int]
    ) -> None:
        if on_an_event_loop() and not self.on_loop_thread():  # the caller's loop, not the log's own
            type(self).begun += 1
        super().start_append(key, events, expected_seq=expected_seq, settle=settle)


@pytest.fixture
def log(nats_server: EmbeddedNatsServer) -> Iterator[CountingLog]:
    CountingLog.begun = 0
    handle = CountingLog.connect(nats_server.url, timeout=10.0)
    yield handle
    handle.close()


@pytest.fixture
def system(log: CountingLog) -> Iterator[MemorySystem]:
    memory = MemorySystem(TRUNCATION, log=log, timeout=WAIT)
    yield memory
    memory.close()


def idle(system: MemorySystem, k: MemoryKey) -> bool:
    """Whether the live session has nothing queued or running (then the next write runs on its caller)."""
    activity = system.activity(k)
    return activity is not None and not activity.busy


def stored(log: JetStreamEventLog, k: MemoryKey) -> list[str]:
    state, _ = load_state(log, None, k)
    return users(state)


def test_async_writes_of_live_sessions_run_on_the_loop_and_keep_each_sessions_order(
    system: MemorySystem, log: CountingLog
) -> None:
    keys = [key(f"a{n}") for n in range(6)]
    for k in keys:  # live first: a session to activate goes through a thread
        system.session(k).add_turn(turn(f"{k.session_id}-0"))

    async def writer(k: MemoryKey) -> None:
        handle = system.session(k).aio
        for n in range(1, 21):
            assert await handle.add_turn(turn(f"{k.session_id}-{n}")) == n + 1

    async def main() -> None:
        await asyncio.gather(*(writer(k) for k in keys))

    asyncio.run(main())
    # Each was begun on the caller's loop, bar perhaps a session's first: its actor may still be
    # finishing the opening write on a thread, and a busy session gets the write as a message.
    assert log.begun >= 6 * 19
    for k in keys:
        expected = [f"{k.session_id}-{n}" for n in range(21)]
        assert stored(log, k) == expected
        assert users(live_state(system, k)) == expected


def test_async_and_blocking_writes_on_one_session_interleave_without_loss(system: MemorySystem) -> None:
    """A session busy with a blocking write gets the async one as a message, in line behind it."""
    k = key("mixed")
    handle = system.session(k)
    handle.add_turn(turn("start"))

    def blocking() -> None:
        for n in range(30):
            handle.add_turn(turn(f"b{n}"))

    async def main() -> None:
        for n in range(30):
            await handle.aio.add_turn(turn(f"a{n}"))

    thread = threading.Thread(target=blocking)
    thread.start()
    asyncio.run(main())
    thread.join(WAIT)
    seen = users(live_state(system, k))
    assert sorted(seen) == sorted(["start"] + [f"b{n}" for n in range(30)] + [f"a{n}" for n in range(30)])
    assert [u for u in seen if u.startswith("a")] == [f"a{n}" for n in range(30)]
    assert [u for u in seen if u.startswith("b")] == [f"b{n}" for n in range(30)]


def test_a_conflict_on_the_loop_goes_to_the_actor_which_reloads_and_stores_the_turn(
    system: MemorySystem, log: CountingLog, nats_server: EmbeddedNatsServer
) -> None:
    k = key("conflict")
    handle = system.session(k)
    handle.add_turn(turn("mine-1"))
    other_log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    other = MemorySystem(TRUNCATION, log=other_log, timeout=WAIT)
    try:
        other.session(k).add_turn(turn("theirs"))  # the first system's cached last message is stale now
    finally:
        other.close()
        other_log.close()
    assert asyncio.run(handle.aio.add_turn(turn("mine-2"))) == 3
    assert stored(log, k) == ["mine-1", "theirs", "mine-2"]
    assert users(live_state(system, k)) == ["mine-1", "theirs", "mine-2"]


def test_a_refused_write_on_the_loop_stores_nothing_and_the_session_goes_on(log: CountingLog) -> None:
    config = ShortTermMemoryConfig(
        strategy="truncation",
        budget=MemoryBudget(total_max_tokens=60, summary_max_tokens=30, overflow_policy="error"),
    )
    system = MemorySystem(config, log=log, timeout=WAIT)
    k = key("refused")
    try:
        handle = system.session(k)
        handle.add_turn(turn("first"))
        wait_until(lambda: idle(system, k), message="the session idle")
        with pytest.raises(MemoryBudgetExceeded):
            asyncio.run(handle.aio.add_turn(turn("x" * 400)))
        assert log.begun == 0  # refused before anything was appended
        assert asyncio.run(handle.aio.add_turn(turn("second"))) == 2
        assert stored(log, k) == ["first", "second"]
    finally:
        system.close()


def test_an_unanswered_write_on_the_loop_fails_and_the_session_rereads_the_log(
    nats_server: EmbeddedNatsServer,
) -> None:
    log = JetStreamEventLog.connect(nats_server.url, timeout=0.5)
    system = MemorySystem(TRUNCATION, log=log, timeout=WAIT)
    k = key("frozen")
    try:
        handle = system.session(k)
        handle.add_turn(turn("first"))
        with frozen(nats_server), pytest.raises(LogUnavailable):
            asyncio.run(handle.aio.add_turn(turn("in doubt")))
        assert asyncio.run(handle.aio.add_turn(turn("after"))) >= 2
        logged = stored(log, k)
        assert logged[0] == "first"
        assert logged[-1] == "after"
        assert users(live_state(system, k)) == logged  # "in doubt" there or not: the state is the log's
    finally:
        system.close()
        log.close()


def test_snapshots_that_fall_due_on_the_loop_are_saved_by_the_actor(log: CountingLog) -> None:
    """Saving waits on the log's loop, so the loop hands it to the actor's thread (else it is lost)."""
    snapshots = JetStreamSnapshotStore(log._conn)  # one connection, as `JetStreamBackend` shares it
    system = MemorySystem(TRUNCATION, log=log, snapshots=snapshots, snapshot_every=2, timeout=WAIT)
    k = key("loop-snapshots")
    assert snapshot_offset(k, 2) == 0  # its snapshots fall due at even seqs (the offset rule)
    try:
        handle = system.session(k)
        handle.add_turn(turn("t0"))  # opens the session: two events, a snapshot at seq 2
        for n in (1, 2):  # seq 3 and 4: the second makes a snapshot due, on the loop
            wait_until(lambda: idle(system, k), message="the session idle")
            asyncio.run(handle.aio.add_turn(turn(f"t{n}")))
        assert log.begun == 2

        def saved() -> bool:
            snapshot = snapshots.load(k)
            return snapshot is not None and snapshot.seq == 4

        wait_until(saved, message="a snapshot at seq 4")
    finally:
        system.close()
        snapshots.close()


def test_an_async_write_to_a_session_that_is_not_live_is_begun_off_the_loop(
    system: MemorySystem, log: CountingLog
) -> None:
    """Activating a passivated session reads the log: a worker thread does it, never the caller's loop."""
    k = key("gone")
    system.session(k).add_turn(turn("first"))
    system.passivate(k)
    assert asyncio.run(system.session(k).aio.add_turn(turn("second"))) == 2
    assert stored(log, k) == ["first", "second"]
    assert log.begun == 0


def test_a_loop_answer_cancelled_before_it_starts_is_skipped_and_tells_its_caller() -> None:
    async def main() -> None:
        reply = LoopAnswer(asyncio.get_running_loop())
        assert reply.cancel()
        assert reply.done()
        assert not reply.running()
        assert not reply.set_running_or_notify_cancel()  # the write never starts
        with pytest.raises(SessionClosed):
            await asyncio.wait_for(reply.future, WAIT)

    asyncio.run(main())


def test_a_loop_answer_answered_after_its_caller_gave_up_is_dropped(system: MemorySystem) -> None:
    async def main() -> None:
        reply = LoopAnswer(asyncio.get_running_loop())
        assert reply.set_running_or_notify_cancel()
        assert not reply.cancel()  # running: the write goes on
        reply.future.cancel()  # the caller's wait ran out
        reply.set_result(["late"])  # from another thread in real life: must not raise on the loop
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert reply.done()

    asyncio.run(main())


def test_an_async_write_answered_after_its_timeout_raises_operation_timeout_and_still_completes(
    system: MemorySystem, log: CountingLog, nats_server: EmbeddedNatsServer
) -> None:
    """The server stops answering meanwhile: the caller is told in time; the write lands later, once."""
    k = key("slow")
    handle = system.session(k)
    handle.add_turn(turn("first"))
    with frozen(nats_server), pytest.raises(OperationTimeout, match="did not finish within"):
        asyncio.run(handle.aio.add_turn(turn("second"), timeout=0.2))
    assert asyncio.run(handle.aio.add_turn(turn("third"))) == 3
    assert users(live_state(system, k)) == stored(log, k) == ["first", "second", "third"]


def test_awaited_writes_share_one_timer_per_timeout_on_their_loop(system: MemorySystem) -> None:
    """Every awaited write is timed out by its loop's `Deadlines`: one timer per timeout value, not
    one made and cancelled per write; each write leaves the line once answered."""
    k = key("one-timer")
    handle = system.session(k)
    handle.add_turn(turn("first"))

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        timers = 0
        call_at = loop.call_at

        def counted(when: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign]  # (call_later goes through it too)
        for n in range(30):
            await handle.aio.add_turn(turn(f"t{n}"), timeout=30)
        await asyncio.gather(*(handle.aio.add_turn(turn(f"g{n}"), timeout=30) for n in range(10)))
        return timers, LoopAnswer(loop).deadlines.waiting(30)

    timers, waiting = asyncio.run(main())
    assert timers == 1
    assert waiting == 0
    assert len(users(live_state(system, k))) == 41


def test_an_async_write_whose_caller_gave_up_before_it_started_is_never_stored(
    system: MemorySystem, log: CountingLog, nats_server: EmbeddedNatsServer
) -> None:
    """Queued behind a write the server holds up, its wait runs out first: it is cancelled, not run."""
    k = key("given-up")
    handle = system.session(k)
    handle.add_turn(turn("first"))

    async def main() -> None:
        with frozen(nats_server):
            begun = log.begun
            held = asyncio.ensure_future(handle.aio.add_turn(turn("held")))
            await asyncio.sleep(0)  # a yield (no wait): the task begins its write here, on this loop
            assert log.begun == begun + 1  # its append is out: the session is busy until the server answers
            with pytest.raises(OperationTimeout, match="did not finish within"):
                await handle.aio.add_turn(turn("given up"), timeout=0)
        assert await held == 2

    asyncio.run(main())
    assert asyncio.run(handle.aio.add_turn(turn("after"))) == 3
    assert users(live_state(system, k)) == stored(log, k) == ["first", "held", "after"]


# The connection on the planner's own loop ---------------------------------------------------------


def test_a_backend_on_the_planners_loop_writes_there_and_refuses_blocking_calls_on_it(
    nats_server: EmbeddedNatsServer,
) -> None:
    k = key("here")

    async def main() -> None:
        backend = await JetStreamBackend.connect_here(nats_server.url, timeout=10.0)
        system = MemorySystem(TRUNCATION, log=backend.log, snapshots=backend.snapshots, timeout=WAIT)
        try:
            handle = system.session(k)
            for n in range(5):  # the first activates the session on a worker thread; the rest stay here
                assert await handle.aio.add_turn(turn(f"t{n}")) == n + 1
            assert "t4" in str(await handle.aio.get_llm_context())
            await handle.aio.flush()  # awaitables wait without blocking the loop: never refused here
            assert (await handle.aio.refresh()).version == 6  # its start and five turns
            with pytest.raises(RuntimeError, match="event loop thread"):
                handle.add_turn(turn("blocking, on the loop"))
            with pytest.raises(RuntimeError, match="event loop thread"):
                handle.flush()
            with pytest.raises(RuntimeError, match="event loop thread"):
                handle.refresh()
            assert await asyncio.to_thread(handle.add_turn, turn("t5")) == 6  # from a worker: fine
        finally:
            await system.aclose()
            await backend.aclose()

    asyncio.run(main())
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    try:
        assert stored(log, k) == [f"t{n}" for n in range(6)]
    finally:
        log.close()


def test_an_embedded_backend_on_the_planners_loop_stops_its_server_on_aclose(tmp_path: Path) -> None:
    async def main() -> int | None:
        backend = await JetStreamBackend.embedded_here(tmp_path / "store", sync_interval=None)
        assert backend.server is not None
        pid = backend.server.pid
        system = MemorySystem(TRUNCATION, log=backend.log, snapshots=backend.snapshots, timeout=WAIT)
        try:
            assert await system.session(key("e")).aio.add_turn(turn("one")) == 1
        finally:
            await system.aclose()
            await backend.aclose()
        assert not backend.server.running
        return pid

    pid = asyncio.run(main())
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_connect_here_opens_memory_on_the_running_loop_and_aclose_closes_it(
    nats_server: EmbeddedNatsServer,
) -> None:
    async def main() -> None:
        memory = await convmem.connect_here(nats_server.url, config=TRUNCATION)
        try:
            assert memory.loop_log is not None
            assert await memory.session(key("c")).aio.add_turn(turn("hello")) == 1
        finally:
            await memory.aclose()
        assert memory.closed
        with pytest.raises(InvalidInput, match="not a NATS URL"):
            await convmem.connect_here("http://127.0.0.1:4222")
        scratch = await convmem.connect_here("memory://", config=TRUNCATION)
        try:
            assert await scratch.session(key("m")).aio.add_turn(turn("in memory")) == 1
        finally:
            await scratch.aclose()

    asyncio.run(main())
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    try:
        assert stored(log, key("c")) == ["hello"]
    finally:
        log.close()


def test_async_writes_over_a_small_live_set_lose_nothing(nats_server: EmbeddedNatsServer) -> None:
    """Sessions passivate and reactivate under the writes (claims, queued stops, activations off the loop)."""
    keys = [key(f"churn{n}") for n in range(12)]

    async def main() -> None:
        memory = await convmem.connect_here(nats_server.url, config=TRUNCATION, max_live_sessions=3)
        try:

            async def writer(k: MemoryKey) -> None:
                handle = memory.session(k).aio
                for n in range(8):
                    await handle.add_turn(turn(f"{k.session_id}-{n}"), idempotency_key=f"{k.session_id}-{n}")

            await asyncio.gather(*(writer(k) for k in keys))
            counts = memory.metrics.snapshot()["counts"]
            assert counts["passivations"] > 0  # the bound was felt
            assert counts["activations"] > len(keys)
            assert counts["idle_cache_hits"] > 0  # reactivated from the idle cache, some right on the loop
        finally:
            await memory.aclose()

    asyncio.run(main())
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    try:
        for k in keys:
            assert stored(log, k) == [f"{k.session_id}-{n}" for n in range(8)]
    finally:
        log.close()


def test_an_async_write_to_a_cached_session_runs_on_the_loop_without_a_thread(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session in the idle cache starts its actor on the caller's loop: no worker thread, no log read."""

    async def main() -> None:
        memory = await convmem.connect_here(nats_server.url, config=TRUNCATION, max_live_sessions=1)
        try:
            a, b = memory.session(key("loop-a")).aio, memory.session(key("loop-b")).aio
            await a.add_turn(turn("a1"))
            await b.add_turn(turn("b1"))
            assert memory.is_cached(a.key)
            threads: list[object] = []
            to_thread = asyncio.to_thread

            async def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
                threads.append(fn)
                return await to_thread(fn, *args, **kwargs)

            monkeypatch.setattr(asyncio, "to_thread", counted)
            await a.add_turn(turn("a2"))
            context = await a.get_llm_context()
            assert threads == []
            assert memory.is_live(a.key)
            assert [t["user"] for t in context["conversation_memory"]["recent_turns"]] == ["a1", "a2"]
        finally:
            await memory.aclose()

    asyncio.run(main())


def test_loops_that_made_async_writes_are_not_kept_alive(system: MemorySystem) -> None:
    """Each asyncio.run makes a loop; the registry of per-loop answer inboxes must let it go."""
    import gc  # noqa: PLC0415 (this test alone)
    import weakref  # noqa: PLC0415

    k = key("loops")
    handle = system.session(k)
    handle.add_turn(turn("first"))
    seen: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def write(n: int) -> None:
        seen.append(weakref.ref(asyncio.get_running_loop()))
        await handle.aio.add_turn(turn(f"t{n}"))

    for n in range(3):
        asyncio.run(write(n))
    gc.collect()
    assert [ref() for ref in seen] == [None, None, None]


class RefusingLog(CountingLog):
    """Fails the next append begun on an event loop, as a connection dropped just then would."""

    fail_next = False

    def start_append(
        self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int, settle: Settle[int]
    ) -> None:
        if type(self).fail_next and on_an_event_loop() and not self.on_loop_thread():
            type(self).fail_next = False
            raise LogUnavailable("the publish was cut short")
        super().start_append(key, events, expected_seq=expected_seq, settle=settle)


def test_an_append_that_fails_to_begin_on_the_loop_is_reported_and_the_session_rereads_the_log(
    nats_server: EmbeddedNatsServer,
) -> None:
    log = RefusingLog.connect(nats_server.url, timeout=10.0)
    system = MemorySystem(TRUNCATION, log=log, timeout=WAIT)
    k = key("cut-short")
    try:
        handle = system.session(k)
        handle.add_turn(turn("first"))
        wait_until(lambda: idle(system, k), message="the session idle")
        RefusingLog.fail_next = True
        with pytest.raises(LogUnavailable, match="cut short"):
            asyncio.run(handle.aio.add_turn(turn("lost")))
        assert not RefusingLog.fail_next  # it was the loop path that failed
        assert asyncio.run(handle.aio.add_turn(turn("second"))) == 2
        assert users(live_state(system, k)) == stored(log, k) == ["first", "second"]
    finally:
        system.close()
        log.close()
