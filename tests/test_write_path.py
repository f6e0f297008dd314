"""The hot write path: posted batches on the loop, the JetStream fast path, writes settled by the log."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from nats_fixtures import frozen
from runtime_helpers import WAIT, Harness, key, live_state, replay_log, turn, users, wait_until

from convmem.actors import LoopEventLog, MemorySystem, Settle
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, JetStreamEventLog
from convmem.adapters._loop_thread import EventLoopThread, wait
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


# JetStreamEventLog.start_append ------------------------------------------------------------------


@pytest.fixture
def log(nats_server: EmbeddedNatsServer) -> Iterator[JetStreamEventLog]:
    handle = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    yield handle
    handle.close()


class Told:
    """A `Settle` that records its outcome and the thread that settled it."""

    def __init__(self) -> None:
        self.outcome: int | BaseException | None = None
        self.thread = ""
        self.settled = threading.Event()

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def done(self) -> bool:
        return self.settled.is_set()

    def cancel(self) -> bool:
        self.set_exception(SessionClosed("cancelled"))
        return True

    def set_result(self, result: int, /) -> None:
        self._settle(result)

    def set_exception(self, exception: BaseException, /) -> None:
        self._settle(exception)

    def _settle(self, outcome: int | BaseException) -> None:
        assert not self.settled.is_set(), "settled twice"
        self.outcome, self.thread = outcome, threading.current_thread().name
        self.settled.set()

    def wait(self) -> int | BaseException | None:
        assert self.settled.wait(WAIT), "never settled"
        return self.outcome


def test_a_started_append_returns_at_once_and_is_settled_on_the_loop_with_the_last_seq(
    log: JetStreamEventLog,
) -> None:
    """start_append only starts it; the ack settles it on the connection's loop thread."""
    assert isinstance(log, LoopEventLog)
    for seq in range(1, 6):  # the first append reads the session's last message; the rest use the cache
        told = Told()
        log.start_append(KEY, [cleared(seq, f"n-{seq}")], expected_seq=seq - 1, settle=told)
        assert told.wait() == seq
        assert told.thread.endswith("nats-loop")
    assert [e.seq for e in log.read(KEY)] == [1, 2, 3, 4, 5]


def test_a_refused_fast_append_is_a_conflict_and_nothing_is_stored_twice(
    log: JetStreamEventLog, nats_server: EmbeddedNatsServer
) -> None:
    """A writer whose cached last message went stale is refused by the server, never stored twice."""
    log.append(KEY, [cleared(1, "a-1")], expected_seq=0)  # caches the session's last message
    other = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    try:
        other.append(KEY, [cleared(2, "b-2")], expected_seq=1)
    finally:
        other.close()
    refused = Told()
    log.start_append(KEY, [cleared(2, "a-2")], expected_seq=1, settle=refused)
    conflict = refused.wait()
    assert isinstance(conflict, ConcurrencyConflict)
    assert conflict.actual_seq == 2
    stored = Told()
    log.start_append(KEY, [cleared(3, "a-3")], expected_seq=2, settle=stored)
    assert stored.wait() == 3
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


def drop_acks(log: JetStreamEventLog) -> None:
    """Unsubscribe the log's ack subscription: the server stores appends, their acks get lost."""
    subscription = log._writer._fast.ack_subscription
    assert subscription is not None

    async def lose_acks() -> None:
        await subscription.unsubscribe()

    log._conn.call(lose_acks, what="dropping the ack subscription", timeout=WAIT)


def test_a_lost_ack_expires_and_the_next_append_finds_the_event_stored(
    nats_server: EmbeddedNatsServer,
) -> None:
    """The server stored the event but its ack never came: the append fails, the retry succeeds once."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=1.0)
    k = MemoryKey("acme", "alice", "lost-ack")
    try:
        log.append(k, [cleared(1, "l-1")], expected_seq=0)
        log.append(k, [cleared(2, "l-2")], expected_seq=1)  # the fast path: its ack subscription exists
        drop_acks(log)
        with pytest.raises(LogUnavailable):
            log.append(k, [cleared(3, "l-3")], expected_seq=2)
        # Its publish stays in flight until it expires; then the full append finds l-3 stored, as ours.
        assert log.append(k, [cleared(3, "l-3")], expected_seq=2) == 3
        assert [e.event_id for e in log.read(k)] == ["l-1", "l-2", "l-3"]
    finally:
        log.close()


def test_an_append_in_flight_when_the_connection_closes_is_settled_as_closed(
    nats_server: EmbeddedNatsServer,
) -> None:
    """No append is left unsettled: a session's write waiting on it would hold the session for good."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=WAIT * 4)
    k = MemoryKey("acme", "alice", "closing")
    log.append(k, [cleared(1, "c-1")], expected_seq=0)
    log.append(k, [cleared(2, "c-2")], expected_seq=1)  # the fast path from here on
    drop_acks(log)
    told = Told()
    log.start_append(k, [cleared(3, "c-3")], expected_seq=2, settle=told)
    log.close()  # long before the append's own expiry
    assert isinstance(told.wait(), SessionClosed)


# The session's write, settled by the log -----------------------------------------------------------


class SettledByTest(InMemoryEventLog):
    """A `LoopEventLog` that stores each started append at once and keeps its settle for the test."""

    def __init__(self) -> None:
        super().__init__()
        self.started: queue.Queue[tuple[Settle[int], int | Exception]] = queue.Queue()
        self.last_override: int | None = None

    def start_append(
        self, key: MemoryKey, events: Sequence[Event], *, expected_seq: int, settle: Settle[int]
    ) -> None:
        outcome: int | Exception
        try:
            outcome = self.append(key, events, expected_seq=expected_seq)
        except Exception as exc:
            outcome = exc
        self.started.put((settle, outcome))

    def on_loop_thread(self) -> bool:
        return False

    def settle_next(self, *, error: Exception | None = None, last: int | None = None) -> None:
        """Settle the oldest started append: with its outcome, or with `error`, or with `last`."""
        settle, outcome = self.started.get(timeout=WAIT)
        outcome = error or (last if last is not None else outcome)
        if isinstance(outcome, Exception):
            settle.set_exception(outcome)
        else:
            settle.set_result(outcome)

    def settle_all(self) -> None:
        while not self.started.empty():
            self.settle_next()


def in_thread(call: Callable[[], int]) -> concurrent.futures.Future[int]:
    """Run `call` on a thread of its own; its answer (or error) in a future."""
    answer: concurrent.futures.Future[int] = concurrent.futures.Future()

    def run() -> None:
        try:
            answer.set_result(call())
        except BaseException as exc:
            answer.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return answer


def wait_started(log: SettledByTest, n: int) -> None:
    wait_until(lambda: log.started.qsize() >= n, message=f"{n} appends started")


APART = WAIT / 2
"""A blocking call's timeout below the system's: the write runs on an actor thread, not the caller's."""


def test_a_write_awaiting_its_append_holds_its_session_not_a_thread(harness: Harness) -> None:
    """One actor thread, two sessions: the second's write begins while the first's append is unsettled."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log, actor_threads=1)
    first, second = system.session(key("first")), system.session(key("second"))
    for handle in (first, second):  # open both (settled as they start)
        opening = in_thread(lambda h=handle: h.add_turn(turn("open"), timeout=APART))  # type: ignore[misc]
        wait_started(log, 1)
        log.settle_next()
        wait_started(log, 1)
        log.settle_next()
        assert opening.result(WAIT) == 1
    held = in_thread(lambda: first.add_turn(turn("held"), timeout=APART))
    wait_started(log, 1)
    other = in_thread(lambda: second.add_turn(turn("other"), timeout=APART))
    wait_started(log, 2)  # the only actor thread started it: the first write holds none
    assert not held.done()
    log.settle_next()
    log.settle_next()
    assert held.result(WAIT) == 2
    assert other.result(WAIT) == 2


def test_the_thread_that_settles_a_write_publishes_its_state_and_answers_its_caller(harness: Harness) -> None:
    """The log's thread only settles: the write itself (evolve, publish, answer) goes on from there."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    answer = in_thread(lambda: handle.add_turn(turn("first")))
    wait_started(log, 1)
    log.settle_next()  # the opening
    wait_started(log, 1)
    assert users(live_state(system, key())) == []
    log.settle_next()  # returns once the write has published its state, here, on this thread
    assert users(live_state(system, key())) == ["first"]
    assert answer.result(WAIT) == 1


@pytest.mark.parametrize("timeout", [None, APART], ids=["begun on the callers thread", "on an actor thread"])
def test_a_sessions_next_message_waits_until_its_write_is_settled(
    harness: Harness, timeout: float | None
) -> None:
    """A write holds its session from decision to answer: the next write decides on the new state."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    opened = in_thread(lambda: handle.add_turn(turn("first")))
    wait_started(log, 1)
    log.settle_next()
    wait_started(log, 1)
    log.settle_next()
    assert opened.result(WAIT) == 1
    one = in_thread(lambda: handle.add_turn(turn("one"), timeout=timeout))
    wait_started(log, 1)
    two = in_thread(lambda: handle.add_turn(turn("two")))
    assert not two.done()
    assert log.started.qsize() == 1  # the second is queued behind the first, not begun beside it
    log.settle_next()
    assert one.result(WAIT) == 2
    wait_started(log, 1)
    log.settle_next()
    assert two.result(WAIT) == 3
    assert live_state(system, key()) == replay_log(log, key())


def test_a_write_settled_with_an_error_fails_and_the_next_write_rereads_the_log(harness: Harness) -> None:
    """The log stored the turn but answered with an error: the caller hears it; nothing is lost."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    opened = in_thread(lambda: handle.add_turn(turn("first")))
    wait_started(log, 1)
    log.settle_next()
    wait_started(log, 1)
    log.settle_next()
    assert opened.result(WAIT) == 1
    failed = in_thread(lambda: handle.add_turn(turn("in doubt")))
    wait_started(log, 1)
    log.settle_next(error=LogUnavailable("the answer was lost"))
    with pytest.raises(LogUnavailable, match="lost"):
        failed.result(WAIT)
    after = in_thread(lambda: handle.add_turn(turn("after")))
    wait_started(log, 1)
    log.settle_next()
    assert after.result(WAIT) == 3
    assert users(live_state(system, key())) == ["first", "in doubt", "after"]
    assert live_state(system, key()) == replay_log(log, key())


def test_a_write_settled_with_another_last_seq_takes_the_logs_state_and_stores_nothing(
    harness: Harness,
) -> None:
    """The log says the session ends elsewhere (it held these ids): the log is the truth."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    opened = in_thread(lambda: handle.add_turn(turn("first")))
    wait_started(log, 1)
    log.settle_next()
    wait_started(log, 1)
    log.settle_next()
    assert opened.result(WAIT) == 1
    odd = in_thread(lambda: handle.add_turn(turn("second")))
    wait_started(log, 1)
    log.settle_next(last=99)
    assert odd.result(WAIT) == 0  # as for a retry the log already held
    assert live_state(system, key()) == replay_log(log, key())


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
                if text not in users(live_state(system, key(f"w{n}"))):
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


def test_an_opening_acknowledged_as_already_held_still_stores_the_command(harness: Harness) -> None:
    """The log says the session's opening was there already (a retry): the turn itself still goes in."""
    log = SettledByTest()
    system = harness.system(TRUNCATION, log=log)
    answer = in_thread(lambda: system.session(key()).add_turn(turn("first")))
    wait_started(log, 1)
    log.settle_next(last=99)  # the opening, answered as another attempt's
    wait_started(log, 1)
    log.settle_next()  # the turn
    assert answer.result(WAIT) == 1
    assert users(live_state(system, key())) == ["first"]
    assert live_state(system, key()) == replay_log(log, key())


def test_an_opening_that_loses_to_another_writer_stores_the_command_after_theirs(harness: Harness) -> None:
    """Another process opened the session first: the conflict is reread, and the turn follows theirs."""
    log = SettledByTest()
    system, other = harness.system(TRUNCATION, log=log), harness.system(TRUNCATION, log=log)
    handle = system.session(key())
    assert not handle.snapshot_state().started  # live, and empty
    theirs = in_thread(lambda: other.session(key()).add_turn(turn("theirs")))
    for _ in range(2):  # their opening and their turn
        wait_started(log, 1)
        log.settle_next()
    assert theirs.result(WAIT) == 1
    mine = in_thread(lambda: handle.add_turn(turn("mine")))
    wait_started(log, 1)
    log.settle_next()  # our opening: a conflict (the log's outcome)
    wait_started(log, 1)
    log.settle_next()  # our turn, decided again on their history
    assert mine.result(WAIT) == 2
    assert users(live_state(system, key())) == ["theirs", "mine"]
    assert live_state(system, key()) == replay_log(log, key())
