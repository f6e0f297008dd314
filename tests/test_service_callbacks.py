"""A service on the log's own loop answers ``add_turn`` from callbacks (issue 28 item 2): no task, no
future, no thread per request; the same replies, timeouts and order as the awaited way.

The session's actor is held from the test (`claim`) to make a write wait behind it, as a write
waits behind a busy session: that write's timeout, and its start once the actor is free, take the
paths a quiet bench never meets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import nats
import pytest

from convmem.actors import Deadlines, MemorySystem
from convmem.actors._dispatch import PooledActor, claim
from convmem.actors._session import Wake
from convmem.adapters import EmbeddedNatsServer, MemoryService, RemoteMemory
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.backends.jetstream._client import NatsClient
from convmem.adapters.frontends._connect import open_backend_here
from convmem.adapters.frontends.service._errors import ServiceUnavailable
from convmem.adapters.frontends.service._inboxes import tenant_inbox
from convmem.adapters.frontends.service._protocol import decode_reply, routed_subject
from convmem.errors import OperationTimeout
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig, encode_token

WAIT = 30.0
CONFIG = ShortTermMemoryConfig(strategy="truncation")


class _OnLoop:
    """A service whose log runs on the service's own loop, as `convmem serve`'s workers run."""

    def __init__(self, url: str) -> None:
        self.prefix = f"t{uuid.uuid4().hex[:8]}.api"
        self.loop = EventLoopThread(name="test-callbacks-loop")
        self.backend = self.loop.call(lambda: open_backend_here(url), timeout=WAIT, what="the log")
        self.system = MemorySystem(CONFIG, log=self.backend.log, snapshots=self.backend.snapshots)
        self.service = MemoryService(self.system, url, api_prefix=self.prefix, loop=self.loop).start()

    def close(self) -> None:
        self.service.stop()
        self.system.close()
        self.backend.close()
        self.loop.stop()

    def hold(self, key: MemoryKey) -> PooledActor:
        """`key`'s live actor, held from this thread: its writes queue until `free`."""
        entry = self.system._sessions._live[key]
        actor = claim(entry.ref)
        assert actor is not None, "the session is busy: nothing to hold"
        return actor


@pytest.fixture
def on_loop(nats_server: EmbeddedNatsServer) -> Iterator[_OnLoop]:
    served = _OnLoop(nats_server.url)
    try:
        yield served
    finally:
        served.close()


def _turn(n: int) -> ConversationTurn:
    return ConversationTurn(user_message=f"u{n}", assistant_response=f"a{n}")


def test_concurrent_add_turns_are_answered_in_each_sessions_order_from_callbacks(
    on_loop: _OnLoop, nats_server: EmbeddedNatsServer
) -> None:
    """32 callers over 8 sessions: every reply is its turn's number in that session's order, every
    turn is stored once, and no request went to a task or a thread (the awaited way)."""
    keys = [MemoryKey("acme", "u", f"s{n}") for n in range(8)]
    served: list[Any] = []
    original = on_loop.service._serve

    async def counted(msg: Any) -> None:
        served.append(msg)
        await original(msg)

    on_loop.service._serve = counted  # type: ignore[method-assign]
    encode = msgspec.msgpack.Encoder().encode

    async def run() -> dict[MemoryKey, list[int]]:
        nc = await nats.connect(nats_server.url, inbox_prefix=tenant_inbox(encode_token("acme")))
        numbers: dict[MemoryKey, list[int]] = {key: [] for key in keys}
        locks = {key: asyncio.Lock() for key in keys}

        async def caller(index: int) -> None:
            for n in range(12):
                key = keys[(index + n) % len(keys)]
                subject = routed_subject(on_loop.prefix, "acme", key.user_id, key.session_id, "add_turn")
                turn = _turn(n)
                body = {"user_id": key.user_id, "session_id": key.session_id, "timeout": WAIT}
                body["turn"] = {
                    "user_message": turn.user_message,
                    "assistant_response": turn.assistant_response,
                }
                async with locks[key]:  # one caller at a time per session: its numbers are its order
                    reply = decode_reply((await nc.request(subject, encode(body), timeout=WAIT)).data)
                    assert reply.ok, reply.error
                    numbers[key].append(reply.result)

        try:
            await asyncio.gather(*(caller(i) for i in range(32)))
        finally:
            await nc.close()
        return numbers

    numbers = asyncio.run(run())
    for key in keys:
        assert numbers[key] == list(range(1, len(numbers[key]) + 1))
        assert len(on_loop.system.session(key).snapshot_state().turns) == len(numbers[key])
    assert sum(len(n) for n in numbers.values()) == 32 * 12
    assert len(served) <= len(keys)  # only a session's first write (its activation) took a task
    assert not on_loop.service._pool._threads  # type: ignore[attr-defined]
    assert on_loop.service.wait_for(lambda: on_loop.service.in_flight == 0, WAIT)


def test_a_write_behind_a_busy_session_times_out_with_the_services_answer_and_is_never_stored(
    on_loop: _OnLoop,
) -> None:
    """The write queues behind the held actor; its timeout runs out first: the caller gets the
    service's `OperationTimeout` (not the client's own), its place is freed, and once the actor is
    free the cancelled write never runs."""
    key = MemoryKey("acme", "u", "held")
    with RemoteMemory(on_loop.service.url, api_prefix=on_loop.prefix, timeout=WAIT) as remote:
        session = remote.session(key)
        assert session.add_turn(_turn(0)) == 1
        actor = on_loop.hold(key)
        try:
            with pytest.raises(OperationTimeout) as late:
                session.add_turn(_turn(1), timeout=1.0)
            assert not isinstance(late.value, ServiceUnavailable)
            assert "write did not finish within" in str(late.value)
            assert on_loop.service.wait_for(lambda: on_loop.service.in_flight == 0, WAIT)
        finally:
            actor.run_claimed(Wake())  # frees the actor: the queued write finds itself cancelled
        assert session.add_turn(_turn(2)) == 2  # the timed-out turn was never stored
    state = on_loop.system.session(key).snapshot_state()
    assert [t.turn.user_message for t in state.turns] == ["u0", "u2"]


def test_a_write_that_waited_behind_a_busy_session_is_answered_once_it_runs(on_loop: _OnLoop) -> None:
    """Queued behind the held actor, the write runs on an actor thread once the actor is free and
    its reply comes from the log's acknowledgement, with its number."""
    key = MemoryKey("acme", "u", "queued")
    with (
        RemoteMemory(on_loop.service.url, api_prefix=on_loop.prefix, timeout=WAIT) as remote,
        concurrent.futures.ThreadPoolExecutor(1) as caller,
    ):
        session = remote.session(key)
        assert session.add_turn(_turn(0)) == 1
        actor = on_loop.hold(key)
        try:
            pending = caller.submit(session.add_turn, _turn(1))
            assert on_loop.service.wait_for(lambda: on_loop.service.in_flight == 1, WAIT)
            assert not pending.done()
        finally:
            actor.run_claimed(Wake())
        assert pending.result(WAIT) == 2
    assert len(on_loop.system.session(key).snapshot_state().turns) == 2


def test_send_now_publishes_without_awaiting_or_says_it_cannot(nats_server: EmbeddedNatsServer) -> None:
    """`NatsClient.send_now` sends a message with headers and a plain one as nats-py's flusher sends
    its own (the subscriber gets both, headers and reply subject intact); a closed client, or a
    payload over ``max_payload``, is refused with nothing sent, for the awaited way to report."""

    async def run() -> tuple[list[tuple[str, str, bytes, dict[str, str] | None]], bool, bool]:
        got: list[tuple[str, str, bytes, dict[str, str] | None]] = []
        done = asyncio.Event()
        sub_nc = await nats.connect(nats_server.url)

        async def on(msg: Any) -> None:
            got.append((msg.subject, msg.reply, msg.data, msg.headers))
            if len(got) == 2:
                done.set()

        await sub_nc.subscribe("now.>", cb=on)
        await sub_nc.flush()
        nc = NatsClient()
        await nc.connect(servers=[nats_server.url])
        try:
            header = b"NATS/1.0\r\nConvmem-Seq: 7\r\n\r\n"
            assert nc.send_now("now.a", "back.1", header, b"first")
            assert nc.send_now("now.b", "", b"", b"second")
            too_large = nc.send_now("now.c", "", b"", b"x" * (nc.max_payload + 1))
            await asyncio.wait_for(done.wait(), WAIT)
        finally:
            await nc.close()
            await sub_nc.close()
        return got, too_large, nc.send_now("now.d", "", b"", b"late")

    got, too_large, after_close = asyncio.run(run())
    assert got == [("now.a", "back.1", b"first", {"Convmem-Seq": "7"}), ("now.b", "", b"second", None)]
    assert not too_large
    assert not after_close


def test_a_reads_direct_subscription_leaves_no_handler_behind(on_loop: _OnLoop) -> None:
    """Every read of the log subscribes for its own replies, directly: once it unsubscribes, its
    handler is gone from the client too (reads would otherwise pile handlers up without end)."""
    key = MemoryKey("acme", "u", "reads")
    with RemoteMemory(on_loop.service.url, api_prefix=on_loop.prefix, timeout=WAIT) as remote:
        remote.session(key).add_turn(_turn(0))
    log = on_loop.backend.log
    nc = log._conn.nc  # type: ignore[attr-defined]
    before = len(nc._direct)
    for _ in range(5):
        assert len(log.read(key)) == 2  # SessionStarted, TurnAdded
    assert len(nc._direct) == before


def test_answers_behind_a_slow_request_do_not_pile_up_in_the_timeouts_line() -> None:
    """One request kept waiting at the head of its timeout's line, 10,000 answered behind it: the
    line is compacted as they pile up (about twice the unanswered ones at most, at least 1,024),
    and the slow one still expires, by the line's one timer."""

    class Reply:
        def __init__(self, expired: asyncio.Future[float] | None = None) -> None:
            self.sent = False
            self.wait: float | None = None
            self.expired = expired

        def expire(self, wait: float) -> None:
            self.sent = True
            if self.expired is not None:
                self.expired.set_result(wait)

    async def run() -> tuple[int, float, int]:
        deadlines = Deadlines()
        expired: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        deadlines.add(Reply(expired), 0.0)  # type: ignore[arg-type]  # what a TurnReply offers it
        most = 0
        for _ in range(10_000):
            fast = Reply()
            deadlines.add(fast, 0.0)  # type: ignore[arg-type]
            fast.sent = True
            deadlines.answered(0.0)
            most = max(most, deadlines.waiting(0.0))
        wait = await asyncio.wait_for(expired, WAIT)
        return most, wait, deadlines.waiting(0.0)

    most, wait, left = asyncio.run(run())
    assert most <= 1025
    assert wait == 0.0
    assert left == 0
