"""Partitioned service workers: NATS routes a session's requests to the one worker owning its partition.

In process: each `MemoryService(partitioned=True)` has its own `MemorySystem`
on one JetStream stream, as the workers of `convmem serve --workers` do; the
clients are the unchanged `RemoteMemory` / `RemoteSession`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest
from hypothesis import given
from hypothesis import strategies as st

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, MemoryService, RemoteMemory
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.frontends._connect import open_backend_here
from convmem.adapters.frontends.service._partitions import Partitions, members_subject, owners, signed
from convmem.adapters.frontends.service._protocol import (
    SLOTS,
    parse_subject,
    routed_subject,
    session_subject,
    slot_of,
    unrouted,
)
from convmem.errors import InvalidConfig, InvalidKey
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

WAIT = 30.0
CONFIG = ShortTermMemoryConfig(strategy="truncation")
SECRET = b"test-members-secret-0123456789"
"""What the workers of these tests sign their membership with (`serve` draws one per run)."""


def announcement(instance: str, *, leaving: bool = False, at: float | None = None) -> bytes:
    """A member announcement signed as the workers sign theirs, said now (or `at`)."""
    said = {"instance": instance, "queue_group": "convmem", "leaving": leaving}
    return signed(SECRET, {**said, "at": time.time() if at is None else at})


def wait_until(fact: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll `fact` every 20 ms (a pause on an event never set) until it holds or `timeout` passes."""
    deadline, pause = time.monotonic() + timeout, threading.Event()
    while not fact():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        pause.wait(0.02)


def users(context: dict[str, Any]) -> list[str]:
    return [t["user"] for t in context["conversation_memory"]["recent_turns"]]


# The partitions ------------------------------------------------------------------------------


@given(st.sets(st.text(min_size=1, max_size=8), min_size=1, max_size=9), st.randoms())
def test_owners_deal_every_partition_evenly_whatever_order_the_members_are_heard_in(
    members: set[str], rnd: Any
) -> None:
    heard = list(members)
    rnd.shuffle(heard)
    dealt = owners(heard)
    assert dealt == owners(sorted(members))  # every worker that heard the same members agrees
    assert set(dealt) == set(range(SLOTS))
    counts = [list(dealt.values()).count(m) for m in members]
    assert max(counts) - min(counts) <= 1


def test_a_session_has_one_stable_partition_named_in_its_subject() -> None:
    """The hash is crc32 of the key, the same in every process (Python's hash() is not)."""
    assert slot_of("acme", "alice", "s1") == slot_of("acme", "alice", "s1")
    assert slot_of("acme", "alice", "s1") == 47  # pinned: clients and workers must agree across versions
    routed = routed_subject("convmem.api", "acme", "alice", "s1", "add_turn")
    assert routed == "convmem.api.v1.acme.add_turn.p47"
    assert parse_subject("convmem.api", routed) == parse_subject(
        "convmem.api", session_subject("convmem.api", "acme", "add_turn")
    )
    assert unrouted(routed) == session_subject("convmem.api", "acme", "add_turn")
    assert unrouted(session_subject("convmem.api", "acme", "add_turn")) is None
    spread = {slot_of("acme", "u", f"s{i}") for i in range(2000)}
    assert spread == set(range(SLOTS))


# Workers in process --------------------------------------------------------------------------


@pytest.fixture
def stores(nats_server: EmbeddedNatsServer) -> Iterator[Callable[[], MemorySystem]]:
    """Memory systems on one stream of this test's server, each closed in teardown."""
    made: list[MemorySystem] = []

    def open_one() -> MemorySystem:
        made.append(convmem.connect(nats_server.url, config=CONFIG))
        return made[-1]

    try:
        yield open_one
    finally:
        for system in made:
            system.close()


def partitioned(system: MemorySystem, url: str, api_prefix: str, name: str) -> MemoryService:
    return MemoryService(
        system, url, api_prefix=api_prefix, partitioned=True, members_secret=SECRET, instance=name
    ).start()


def shares(*services: MemoryService) -> list[tuple[int, int]]:
    return [(s.worker().get("partitions", 0), s.worker().get("members", 0)) for s in services]


def test_two_workers_split_the_partitions_and_each_session_is_served_by_one_of_them(
    stores: Callable[[], MemorySystem], nats_server: EmbeddedNatsServer
) -> None:
    """Every session lives in exactly one worker, no write conflicts; a leaving worker hands over at once."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    first, second = stores(), stores()
    one = partitioned(first, nats_server.url, prefix, "w-a")
    two = partitioned(second, nats_server.url, prefix, "w-b")
    try:
        wait_until(lambda: shares(one, two) == [(SLOTS // 2, 2)] * 2, "both workers owning half")
        keys = [MemoryKey("acme", f"u{i % 3}", f"s{i}") for i in range(40)]
        with RemoteMemory(nats_server.url, api_prefix=prefix, timeout=WAIT) as remote:
            for n in range(3):
                for key in keys:
                    remote.session(key).add_turn(
                        ConversationTurn(user_message=f"{n}", assistant_response="ok")
                    )
            for key in keys:
                assert users(remote.session(key).get_llm_context()) == ["0", "1", "2"]
            live = first.live_sessions(), second.live_sessions()
            assert sum(live) == len(keys), live  # each session live in one process only
            assert min(live) > 0, live
            conflicts = [s.metrics.snapshot()["counts"].get("conflicts", 0) for s in (first, second)]
            assert conflicts == [0, 0]
            one.stop()  # says it leaves: the other owns everything without waiting for it to expire
            wait_until(lambda: shares(two) == [(SLOTS, 1)], "the survivor owning every partition")
            for key in keys:
                remote.session(key).add_turn(ConversationTurn(user_message="after", assistant_response="ok"))
                assert users(remote.session(key).get_llm_context()) == ["0", "1", "2", "after"]
    finally:
        one.stop()
        two.stop()


def test_a_partition_without_an_owner_is_answered_on_the_plain_subject(
    stores: Callable[[], MemorySystem], nats_server: EmbeddedNatsServer
) -> None:
    """A worker that others believe alive but that is gone leaves its partitions unserved; the
    clients fall back to the plain subject, which every worker answers."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    worker = partitioned(stores(), nats_server.url, prefix, "w-a")
    ghost_beats = threading.Event()

    async def ghost() -> None:  # a member that announces itself and never subscribes to anything
        nc = await nats.connect(nats_server.url)
        try:
            while not ghost_beats.is_set():
                await nc.publish(members_subject(prefix), announcement("w-zz"))
                await nc.flush()
                await asyncio.to_thread(ghost_beats.wait, 0.2)
        finally:
            await nc.close()

    beating = threading.Thread(target=asyncio.run, args=(ghost(),))
    beating.start()
    try:
        wait_until(lambda: shares(worker) == [(SLOTS // 2, 2)], "the worker sharing with the ghost")
        orphaned = {s for s, o in owners(["w-a", "w-zz"]).items() if o == "w-zz"}
        keys = [MemoryKey("acme", "u", f"s{i}") for i in range(30)]
        assert {slot_of(k.tenant_id, k.user_id, k.session_id) for k in keys} & orphaned
        with RemoteMemory(nats_server.url, api_prefix=prefix, timeout=WAIT) as remote:
            for key in keys:
                remote.session(key).add_turn(ConversationTurn(user_message="hi", assistant_response="ok"))
                assert users(remote.session(key).get_llm_context()) == ["hi"]
    finally:
        ghost_beats.set()
        beating.join(WAIT)
        with contextlib.suppress(Exception):
            worker.stop()


def test_a_worker_answers_add_turn_on_its_loop_with_the_same_replies(nats_server: EmbeddedNatsServer) -> None:
    """With the log on the service's own loop (as `serve --workers` runs it), add_turn is awaited there:
    no request thread is ever used, and retries and refusals answer as through the thread pool."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    loop = EventLoopThread(name="test-worker-loop")
    backend = loop.call(lambda: open_backend_here(nats_server.url), timeout=WAIT, what="the log")
    system = MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots)
    service = MemoryService(
        system, nats_server.url, api_prefix=prefix, partitioned=True, members_secret=SECRET, loop=loop
    )
    try:
        service.start()
        with RemoteMemory(nats_server.url, api_prefix=prefix, timeout=WAIT) as remote:
            session = remote.session(MemoryKey("acme", "alice", "on-loop"))
            turn = ConversationTurn(user_message="hi", assistant_response="ok")
            assert session.add_turn(turn, idempotency_key="k1") == 1
            assert session.add_turn(turn, idempotency_key="k1") == 0  # the retry: stored once
            assert session.add_turn(turn) == 2
            with pytest.raises(InvalidKey) as refused:
                remote.session(MemoryKey("acme", "alice", "x" * 300)).add_turn(turn)
            assert refused.value.field == "session_id"
            assert not service._pool._threads  # type: ignore[attr-defined]  # no add_turn left the loop
            assert users(session.get_llm_context()) == ["hi", "hi"]
    finally:
        service.stop()
        system.close()
        backend.close()
        loop.stop()


async def ignore(_msg: Any) -> None:
    return None


def worker_a(nc: Any, prefix: str, **options: Any) -> Partitions:
    """The worker "w-a" under `prefix`, signing with SECRET, that ignores what it is sent."""
    return Partitions(
        nc,
        api_prefix=prefix,
        queue_group="convmem",
        instance="w-a",
        subscribe=lambda subject, queue: nc.subscribe(subject, queue=queue, cb=ignore),
        secret=SECRET,
        **options,
    )


async def leave(mine: Partitions) -> None:
    """`mine` leaves, its subscriptions ended."""
    for sub in await mine.leave():
        await sub.unsubscribe()


def test_a_member_silent_past_the_expiry_loses_its_partitions(nats_server: EmbeddedNatsServer) -> None:
    """A worker that dies says nothing: the others take its partitions once it has been silent for
    `expiry` seconds of their clock (injected here), and not before."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    now = [1000.0]

    async def scenario() -> tuple[int, int, int]:
        nc, ghost = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
        mine = worker_a(nc, prefix, beat=0.05, expiry=3.0, clock=lambda: now[0])
        try:
            joining = asyncio.ensure_future(mine.start())
            async with asyncio.timeout(WAIT):
                while len(mine.owned) != SLOTS // 2:  # the ghost beats until it is counted
                    await ghost.publish(members_subject(prefix), announcement("w-zz"))
                    await ghost.flush()
                    await asyncio.wait([joining], timeout=0.02)
            shared = len(mine.owned)
            now[0] += 2.9  # silent, but not for long enough
            beats = mine.beats
            async with asyncio.timeout(WAIT):
                while mine.beats < beats + 3:  # three ticks, each dealing again
                    await nc.flush()
            still = len(mine.owned)
            now[0] += 0.2
            async with asyncio.timeout(WAIT):
                while len(mine.owned) != SLOTS:
                    await nc.flush()
            return shared, still, len(mine.owned)
        finally:
            await leave(mine)
            await ghost.close()
            await nc.close()

    assert asyncio.run(scenario()) == (SLOTS // 2, SLOTS // 2, SLOTS)


async def flushed_until(nc: Any, fact: Callable[[], bool], what: str) -> None:
    """Flush `nc` (each flush a round trip, so what was sent before has been routed) until `fact`."""
    deadline = time.monotonic() + WAIT
    while not fact():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT:g}s"
        await nc.flush()


def test_a_flood_of_unsigned_or_missigned_announcements_changes_no_owner(
    nats_server: EmbeddedNatsServer,
) -> None:
    """Anyone who reaches the control subject (every client of an embedded server without auth) may
    send made-up announcements: joins and leaves, unsigned, signed with another secret, or not JSON.
    Each is dropped and counted; the worker keeps every partition and counts no other member."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    flood = 3000

    async def scenario() -> tuple[list[int], list[str], int, int]:
        nc, hostile = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
        mine = worker_a(nc, prefix)
        try:
            await mine.start()
            before = mine.changes
            forged = [
                lambda n: json_body(f"fake-{n}", leaving=n % 2 == 1),  # no signature at all
                lambda n: signed(
                    b"another-secret-0123456789",
                    {"instance": f"fake-{n}", "queue_group": "convmem", "leaving": False},
                ),
                lambda n: b"0" * 64 + b" " + json_body(f"fake-{n}"),  # a signature of the wrong body
                lambda n: announcement("w-a")[:-3] + b"!!!",  # a real signature, the body changed
                lambda n: bytes([n % 256]) * 40,  # not an announcement at all
            ]
            for n in range(flood):
                await hostile.publish(members_subject(prefix), forged[n % len(forged)](n))
            await hostile.flush()
            await flushed_until(nc, lambda: mine.rejected >= flood, "every one read (and dropped)")
            return mine.owned, mine.members, mine.changes - before, mine.rejected
        finally:
            await leave(mine)
            await hostile.close()
            await nc.close()

    owned, members, changes, rejected = asyncio.run(scenario())
    assert owned == list(range(SLOTS))
    assert members == ["w-a"]
    assert changes == 0
    assert rejected == flood


def json_body(instance: str, *, leaving: bool = False) -> bytes:
    return (
        f'{{"instance": "{instance}", "queue_group": "convmem", "leaving": {str(leaving).lower()}}}'.encode()
    )


def test_a_worker_counts_at_most_max_members_others(nats_server: EmbeddedNatsServer) -> None:
    """Even announcements signed with the secret cannot grow a worker's table past its bound."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"

    async def scenario() -> tuple[int, int]:
        nc = await nats.connect(nats_server.url)
        mine = worker_a(nc, prefix, max_members=4)
        try:
            await mine.start()
            for n in range(20):
                await nc.publish(members_subject(prefix), announcement(f"w-{n:02d}"))
            await flushed_until(nc, lambda: mine.rejected >= 16, "the sixteen dropped")
            return len(mine.members), mine.rejected
        finally:
            await leave(mine)
            await nc.close()

    assert asyncio.run(scenario()) == (5, 16)  # itself and four others; the other sixteen dropped


def test_a_partitioned_service_needs_the_workers_secret(nats_server: EmbeddedNatsServer) -> None:
    with convmem.connect(nats_server.url, config=CONFIG) as system:
        for secret in (None, b"short"):
            with pytest.raises(InvalidConfig) as refused:
                MemoryService(system, nats_server.url, partitioned=True, members_secret=secret)
            assert refused.value.field == "members_secret"


def test_a_replayed_announcement_changes_nothing(nats_server: EmbeddedNatsServer) -> None:
    """Someone who heard a worker's signed announcements (any client of a server without auth) sends
    them again: a join replayed after that worker left, and one older than the replay window, are
    dropped; the worker's own next announcement still counts."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"
    wall = [10_000.0]

    async def scenario() -> list[tuple[list[str], int]]:
        nc = await nats.connect(nats_server.url)
        mine = worker_a(nc, prefix, wall=lambda: wall[0])
        steps: list[tuple[list[str], int]] = []

        async def send(payload: bytes, seen: Callable[[], bool]) -> None:
            await nc.publish(members_subject(prefix), payload)
            await flushed_until(nc, seen, "the announcement heard")
            steps.append((mine.members, mine.rejected))

        try:
            await mine.start()
            joined = announcement("w-b", at=10_000.0)
            await send(joined, lambda: "w-b" in mine.members)
            await send(announcement("w-b", leaving=True, at=10_000.5), lambda: "w-b" not in mine.members)
            await send(joined, lambda: mine.rejected == 1)  # replayed after the leave
            wall[0] += 120.0
            await send(announcement("w-c", at=10_001.0), lambda: mine.rejected == 2)  # too old
            await send(announcement("w-b", at=wall[0]), lambda: "w-b" in mine.members)  # its own, new
            return steps
        finally:
            await leave(mine)
            await nc.close()

    assert asyncio.run(scenario()) == [
        (["w-a", "w-b"], 0),
        (["w-a"], 0),
        (["w-a"], 1),
        (["w-a"], 2),
        (["w-a", "w-b"], 2),
    ]


def test_a_worker_that_left_takes_no_partition_when_another_member_leaves(
    nats_server: EmbeddedNatsServer,
) -> None:
    """Both workers of a `serve` stop at once: one's leaving is heard by the other after that one left
    (its members subscription is drained last). The worker that left must not take the partitions
    again: subscriptions made then would never be drained, and it would keep taking requests."""
    prefix = f"t{uuid.uuid4().hex[:8]}.api"

    async def scenario() -> tuple[int, int, list[int]]:
        nc = await nats.connect(nats_server.url)
        mine = worker_a(nc, prefix)
        try:
            await mine.start()
            await nc.publish(members_subject(prefix), announcement("w-b"))
            await flushed_until(nc, lambda: len(mine.owned) == SLOTS // 2, "w-b counted")
            shared = len(mine.owned)
            subs = await mine.leave()
            await nc.publish(members_subject(prefix), announcement("w-b", leaving=True))
            await nc.publish(members_subject(prefix), b"not signed")  # heard after the leave: a marker
            await flushed_until(nc, lambda: mine.rejected == 1, "the leave heard")
            return shared, len(subs), mine.owned
        finally:
            await leave(mine)
            await nc.close()

    assert asyncio.run(scenario()) == (SLOTS // 2, SLOTS // 2 + 1, [])
