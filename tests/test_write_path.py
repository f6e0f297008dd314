"""The hot write path: posted batches on the loop, the JetStream fast path, answers given on the ack."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from nats_fixtures import frozen
from runtime_helpers import WAIT, Harness, key, live_state, turn, users

from convmem.actors import MemorySystem, NotifyingEventLog, SessionHandle
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, JetStreamEventLog
from convmem.adapters._loop import EventLoopThread, wait
from convmem.errors import ConcurrencyConflict, LogUnavailable, SessionClosed
from convmem.events import Event, MemoryKey, SessionCleared, ShortTermMemoryConfig

KEY = MemoryKey("acme", "alice", "s1")
TRUNCATION = ShortTermMemoryConfig(strategy="truncation")


def cleared(seq: int, event_id: str) -> Event:
    return SessionCleared(seq=seq, event_id=event_id, at=1.0, cleared_through=0)


# EventLoopThread.post ---------------------------------------------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[EventLoopThread]:
    thread = EventLoopThread(name="test-loop")
    yield thread
    thread.stop()


def test_posted_work_started_together_settles_each_future(loop_thread: EventLoopThread) -> None:
    """Work posted from many threads runs on the loop; each future gets its own answer."""
    seen_threads: set[int] = set()

    def post(n: int) -> concurrent.futures.Future[int]:
        future: concurrent.futures.Future[int] = concurrent.futures.Future()

        async def start() -> None:
            seen_threads.add(threading.get_ident())
            asyncio.get_running_loop().call_soon(future.set_result, n * n)

        loop_thread.post(start, future)
        return future

    futures: list[concurrent.futures.Future[int]] = []
    threads = [threading.Thread(target=lambda i=i: futures.append(post(i))) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(f.result(WAIT) for f in futures) == sorted(n * n for n in range(50))
    assert len(seen_threads) == 1
    assert threading.get_ident() not in seen_threads


def test_an_error_raised_while_starting_settles_that_future_only(loop_thread: EventLoopThread) -> None:
    bad: concurrent.futures.Future[int] = concurrent.futures.Future()
    good: concurrent.futures.Future[int] = concurrent.futures.Future()

    async def fail() -> None:
        raise ValueError("refused at start")

    async def succeed() -> None:
        good.set_result(7)

    loop_thread.post(fail, bad)
    loop_thread.post(succeed, good)
    with pytest.raises(ValueError, match="refused at start"):
        bad.result(WAIT)
    assert good.result(WAIT) == 7


def test_work_whose_caller_gave_up_before_the_loop_got_to_it_is_not_started(
    loop_thread: EventLoopThread,
) -> None:
    gate = threading.Event()
    started: list[str] = []
    blocker: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def block() -> None:
        gate.wait(WAIT)  # holds the loop so the next post waits in the list
        blocker.set_result(None)

    loop_thread.post(block, blocker)
    late: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def record() -> None:
        started.append("late")
        late.set_result(None)

    loop_thread.post(record, late)
    assert late.cancel()
    gate.set()
    blocker.result(WAIT)
    after: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def done() -> None:
        after.set_result(None)

    loop_thread.post(done, after)
    after.result(WAIT)
    assert started == []


def test_posting_to_a_stopped_loop_is_refused() -> None:
    thread = EventLoopThread(name="test-loop")
    thread.stop()
    future: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def start() -> None:
        future.set_result(None)

    with pytest.raises(SessionClosed):
        thread.post(start, future)


def test_waiting_on_work_that_never_settles_times_out_clearly(loop_thread: EventLoopThread) -> None:
    future: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def never() -> None:
        return None

    loop_thread.post(never, future)
    with pytest.raises(LogUnavailable, match="did not finish within"):
        wait(future, timeout=0.05, what="a posted job")


# JetStreamEventLog.append_notifying -------------------------------------------------------------


@pytest.fixture
def log(nats_server: EmbeddedNatsServer) -> Iterator[JetStreamEventLog]:
    handle = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    yield handle
    handle.close()


def test_the_jetstream_log_tells_of_each_ack_before_append_returns(log: JetStreamEventLog) -> None:
    """on_stored runs once per append, with the last seq, before the waiting caller wakes."""
    assert isinstance(log, NotifyingEventLog)
    told: list[tuple[int, int]] = []
    returns = 0

    def on_stored(last: int) -> None:
        told.append((last, returns))

    for seq in range(1, 6):  # the first append reads the session's last message; the rest use the cache
        events = [cleared(seq, f"n-{seq}")]
        stored = log.append_notifying(KEY, events, expected_seq=seq - 1, on_stored=on_stored)
        assert stored == seq
        returns += 1
    assert told == [(seq, seq - 1) for seq in range(1, 6)]  # each told before its own append returned
    assert [e.seq for e in log.read(KEY)] == [1, 2, 3, 4, 5]


def test_a_refused_fast_append_is_a_conflict_and_tells_nothing(
    log: JetStreamEventLog, nats_server: EmbeddedNatsServer
) -> None:
    """A writer whose cached last message went stale is refused by the server, never stored twice."""
    log.append(KEY, [cleared(1, "a-1")], expected_seq=0)  # caches the session's last message
    other = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    try:
        other.append(KEY, [cleared(2, "b-2")], expected_seq=1)
    finally:
        other.close()
    told: list[int] = []
    with pytest.raises(ConcurrencyConflict) as caught:
        log.append_notifying(KEY, [cleared(2, "a-2")], expected_seq=1, on_stored=told.append)
    assert caught.value.actual_seq == 2
    assert told == []
    assert log.append_notifying(KEY, [cleared(3, "a-3")], expected_seq=2, on_stored=told.append) == 3
    assert told == [3]
    assert [e.event_id for e in log.read(KEY)] == ["a-1", "b-2", "a-3"]


def test_a_retried_fast_append_is_stored_once(log: JetStreamEventLog) -> None:
    """The same event id again (a caller's retry after a lost answer) is answered, not stored again."""
    log.append(KEY, [cleared(1, "r-1")], expected_seq=0)
    log.append(KEY, [cleared(2, "r-2")], expected_seq=1)
    assert log.append(KEY, [cleared(2, "r-2")], expected_seq=1) == 2
    assert [e.event_id for e in log.read(KEY)] == ["r-1", "r-2"]


def test_an_unanswered_fast_append_fails_and_its_retry_is_stored_once(
    nats_server: EmbeddedNatsServer,
) -> None:
    """No ack in time (the server frozen): a log error; once it answers, the retry is stored once."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=0.5)
    k = MemoryKey("acme", "alice", "unanswered")
    try:
        log.append(k, [cleared(1, "u-1")], expected_seq=0)  # caches the last message: the fast path next
        with frozen(nats_server), pytest.raises(LogUnavailable):
            log.append(k, [cleared(2, "u-2")], expected_seq=1)
        assert log.append(k, [cleared(2, "u-2")], expected_seq=1) == 2  # stored late, or now: once
        assert log.append(k, [cleared(3, "u-3")], expected_seq=2) == 3
        assert [e.event_id for e in log.read(k)] == ["u-1", "u-2", "u-3"]
    finally:
        log.close()


def test_a_lost_ack_expires_and_the_next_append_finds_the_event_stored(
    nats_server: EmbeddedNatsServer,
) -> None:
    """The server stored the event but its ack never came: the append fails, the retry succeeds once."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=1.0)
    k = MemoryKey("acme", "alice", "lost-ack")
    try:
        log.append(k, [cleared(1, "l-1")], expected_seq=0)
        log.append(k, [cleared(2, "l-2")], expected_seq=1)  # the fast path: its ack subscription exists
        subscription = log._writer._ack_subscription
        assert subscription is not None

        async def lose_acks() -> None:
            await subscription.unsubscribe()

        log._conn.call(lose_acks, what="dropping the ack subscription", timeout=WAIT)
        with pytest.raises(LogUnavailable):
            log.append(k, [cleared(3, "l-3")], expected_seq=2)
        # Its publish stays in flight until it expires; then the full append finds l-3 stored, as ours.
        assert log.append(k, [cleared(3, "l-3")], expected_seq=2) == 3
        assert [e.event_id for e in log.read(k)] == ["l-1", "l-2", "l-3"]
    finally:
        log.close()


def test_a_failing_hook_does_not_cost_the_append_its_answer(log: JetStreamEventLog) -> None:
    def on_stored(last: int) -> None:
        raise RuntimeError("hook broke")

    assert log.append_notifying(KEY, [cleared(1, "h-1")], expected_seq=0, on_stored=on_stored) == 1
    assert [e.seq for e in log.read(KEY)] == [1]


# The session actor answers from the ack ---------------------------------------------------------


class HoldingLog(InMemoryEventLog):
    """A `NotifyingEventLog` that, once armed, tells of the ack and then keeps the actor waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.fail_after_telling = False
        self.gate = threading.Event()
        self.held = threading.Event()
        self.last_override: int | None = None

    def append_notifying(
        self,
        key: MemoryKey,
        events: Sequence[Event],
        *,
        expected_seq: int,
        on_stored: Callable[[int], None],
    ) -> int:
        last = self.append(key, events, expected_seq=expected_seq)
        if not self.armed:
            on_stored(last)
            return last
        self.armed = False
        on_stored(last if self.last_override is None else self.last_override)
        self.held.set()
        assert self.gate.wait(WAIT), "the test never opened the gate"
        if self.fail_after_telling:
            raise LogUnavailable("the wait gave up just as the ack came in")
        return last


APART = WAIT / 2
"""A blocking call's timeout below the system's: the write runs on the actor's thread, not the caller's."""


def test_a_write_is_answered_and_readable_while_the_actor_still_waits(harness: Harness) -> None:
    """The caller's answer and its read of the new state do not wait for the actor to wake."""
    log = HoldingLog()
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    handle.add_turn(turn("first"))
    log.armed = True
    try:
        assert handle.add_turn(turn("second"), timeout=APART) == 2
        assert log.held.is_set()
        assert not log.gate.is_set()
        assert users(live_state(system, key())) == ["first", "second"]
        assert "second" in str(handle.get_llm_context())
    finally:
        log.gate.set()
    assert handle.add_turn(turn("third")) == 3
    assert users(live_state(system, key())) == ["first", "second", "third"]


def held_second_turn(
    harness: Harness, log: HoldingLog
) -> tuple[MemorySystem, SessionHandle, concurrent.futures.Future[int], threading.Thread]:
    """A session with one turn; its second add_turn (on a thread) held inside the armed `log`."""
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    handle.add_turn(turn("first"))
    log.armed = True
    reply: concurrent.futures.Future[int] = concurrent.futures.Future()
    worker = threading.Thread(target=lambda: reply.set_result(handle.add_turn(turn("second"), timeout=APART)))
    worker.start()
    assert log.held.wait(WAIT)
    return system, handle, reply, worker


def test_an_ack_that_lands_as_the_wait_fails_counts_as_stored(harness: Harness) -> None:
    """Told of the ack, then the wait raises: the caller already has its answer, the state keeps it."""
    log = HoldingLog()
    log.fail_after_telling = True
    system, handle, reply, worker = held_second_turn(harness, log)
    assert reply.result(WAIT) == 2
    log.gate.set()
    worker.join(WAIT)
    assert handle.add_turn(turn("third")) == 3
    assert users(live_state(system, key())) == ["first", "second", "third"]


def test_an_ack_for_other_events_is_not_answered_early(harness: Harness) -> None:
    """When the log reports another last seq (a retry it already held), the actor decides, not the hook."""
    log = HoldingLog()
    log.last_override = 99
    system, _, reply, worker = held_second_turn(harness, log)
    assert not reply.done()
    log.gate.set()
    assert reply.result(WAIT) == 2
    worker.join(WAIT)
    assert users(live_state(system, key())) == ["first", "second"]


def test_the_jetstream_runtime_answers_every_write_with_its_state_visible(
    nats_server: EmbeddedNatsServer,
) -> None:
    """Many threads, one session each: after each answer, that thread reads its own turn."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    system = MemorySystem(TRUNCATION, log=log, timeout=WAIT)
    missing: list[str] = []
    try:

        def writer(n: int) -> None:
            handle = system.session(key(f"w{n}"))
            for i in range(20):
                text = f"w{n}-{i}"
                handle.add_turn(turn(text))
                if text not in users(system.cell(key(f"w{n}")).state):
                    missing.append(text)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 4)
        assert missing == []
        for n in range(8):
            assert [e.seq for e in log.read(key(f"w{n}"))] == list(range(1, 22))
    finally:
        system.close()
        log.close()


def test_an_append_on_a_dropped_client_is_a_log_error(log: JetStreamEventLog) -> None:
    """nats-py's own errors never reach the actor raw: they arrive as `LogUnavailable`."""
    log.append(KEY, [cleared(1, "d-1")], expected_seq=0)
    conn = log._conn

    async def drop() -> None:
        await conn.nc.close()

    conn.call(drop, what="dropping the client")
    with pytest.raises(LogUnavailable, match="append to"):
        log.append(KEY, [cleared(2, "d-2")], expected_seq=1)


# The client's shortcuts: prepared headers out, direct handlers in ----------------------------------


def test_a_prepared_header_publish_arrives_as_nats_py_would_send_it(log: JetStreamEventLog) -> None:
    """Same subject, reply, headers and data at a plain subscriber; no responders reach a direct handler."""
    conn = log._conn
    got: list[tuple[bytes, bytes, bytes]] = []
    seen = threading.Event()

    def handler(subject: bytes, data: bytes, header: bytes) -> None:
        got.append((subject, data, header))
        seen.set()

    async def exchange() -> tuple[str, str, dict[str, str] | None, bytes]:
        nc = conn.nc
        plain = await nc.subscribe("probe.prepared")
        direct = await nc.subscribe_direct("probe.direct.*", handler)
        header = b"NATS/1.0\r\nNats-Msg-Id: m-1\r\nConvmem-Seq: 7\r\n\r\n"
        await nc.publish_prepared("probe.prepared", "probe.reply", header, b"payload")
        msg = await plain.next_msg(timeout=WAIT)
        # Nobody listens on this subject: the server answers the reply subject with status 503.
        await nc.publish_prepared("probe.nobody", "probe.direct.1", header, b"x")
        await plain.unsubscribe()
        subscriptions.append(direct)
        return msg.subject, msg.reply, msg.headers, msg.data

    subscriptions: list[Any] = []
    subject, reply, headers, data = conn.call(exchange, what="probe", timeout=WAIT)
    assert (subject, reply, data) == ("probe.prepared", "probe.reply", b"payload")
    assert headers == {"Nats-Msg-Id": "m-1", "Convmem-Seq": "7"}
    assert seen.wait(WAIT)

    async def stop_direct() -> None:
        await subscriptions[0].unsubscribe()

    conn.call(stop_direct, what="probe", timeout=WAIT)
    assert got[0][0] == b"probe.direct.1"
    assert got[0][2].startswith(b"NATS/1.0 503")


def test_a_prepared_publish_on_a_closed_client_is_a_log_error(log: JetStreamEventLog) -> None:
    conn = log._conn

    async def close_then_publish() -> None:
        await conn.nc.close()
        await conn.nc.publish_prepared("probe.closed", "r", b"NATS/1.0\r\n\r\n", b"x")

    with pytest.raises(LogUnavailable):
        conn.call(close_then_publish, what="a publish on a closed client", timeout=WAIT)
