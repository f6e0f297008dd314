"""A hostile tenant at the edges of the service, round five: what the earlier rounds did not try.

Each probe uses one tenant's own subjects and inbox only (the embedded server
without auth: the service's own rules are what stands), against a real
nats-server. The counts come from the server (the JetStream account's API
requests, the streams' message counts), never from timings.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from runtime_helpers import WAIT, PlannedSummarizer, summarizing_config, turn
from test_erasure_journal_damage import RawWrite, journal  # noqa: F401 (the fixture: both journals)

import convmem
from convmem.actors import ErasureJournal, ErasureReceipt, ErasureRequest, MemorySystem
from convmem.actors._dispatch import claim
from convmem.actors._journal import ErasureJournalDamaged, MarksReceipts, erasure_after
from convmem.actors._session import Wake
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    MemoryService,
    RemoteMemory,
)
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.backends import FileExportRegistry
from convmem.adapters.frontends._connect import open_backend_here
from convmem.adapters.frontends.service._quotas import Quotas, TenantLimits
from convmem.errors import QuotaExceeded
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
JOURNAL_STREAM = "KV_CONVMEM_EVENTS_ERASURES"


def _turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


def _sent(system: MemorySystem) -> int:
    """How many messages the system's store connection has sent (each a request of the store: a
    get, an append, an API call), as nats-py counts them."""
    sent: int = system.log._conn.nc.stats["out_msgs"]  # type: ignore[attr-defined]
    return sent


def _received(system: MemorySystem) -> int:
    """How many messages the system's store connection has received (replies, read events)."""
    received: int = system.log._conn.nc.stats["in_msgs"]  # type: ignore[attr-defined]
    return received


async def _messages(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


def _answered(service: MemoryService, op: str) -> int:
    """How many requests of `op` the service has answered (or refused), by its own count."""
    by_op: dict[str, int] = service.metrics()["service"]["by_op"]
    return by_op.get(op, 0)


@pytest.fixture
def served(nats_server: EmbeddedNatsServer) -> Iterator[tuple[str, MemorySystem]]:
    system = convmem.connect(nats_server.url, config=CONFIG)
    try:
        with MemoryService(system, nats_server.url):
            yield nats_server.url, system
    finally:
        system.close()


def test_another_tenants_erasures_do_not_make_a_fork_read_every_receipt(
    served: tuple[str, MemorySystem],
) -> None:
    """acme's erasures (each of a session it wrote a turn to, each leaving a receipt for good in the
    journal every tenant shares) cost globex's forks nothing: a fork sends the store as many requests
    after 40 receipts as before. It read every receipt four times, one request each (300 receipts: a
    fork took 1.25 s instead of 16 ms; 60 receipts: 240 more requests)."""
    url, system = served
    with RemoteMemory(url, timeout=WAIT) as memory:
        source = memory.session(MemoryKey("globex", "bob", "chat"))
        source.add_turn(_turn("globex's own"))
        source.fork("warm-up")  # the fork's first-time costs (the tally's bucket, the source's load)

        def fork_cost(to: str) -> int:
            before = _sent(system)
            source.fork(to)
            return _sent(system) - before

        quiet = fork_cost("branch-1")
        receipts = asyncio.run(_messages(url, JOURNAL_STREAM))
        for n in range(40):
            written = memory.session(MemoryKey("acme", "mallory", f"brief-{n}"))
            written.add_turn(_turn("soon gone"))
            assert written.erase() == 2
        assert asyncio.run(_messages(url, JOURNAL_STREAM)) == receipts + 40
        loud = fork_cost("branch-2")
        assert loud <= quiet + 4


def test_a_journal_reads_the_receipts_kept_after_a_mark_only(
    journal: tuple[ErasureJournal, RawWrite],  # noqa: F811 (the fixture imported above)
) -> None:
    """What `erasure_after(..., mark=)` reads: the receipts kept after the mark (whatever time they
    carry), none before; a damaged one among them is named, as `receipts` names it."""
    store, write = journal
    assert isinstance(store, MarksReceipts)
    key = MemoryKey("acme", "alice", "chat")

    def erase(at: float) -> ErasureRequest:
        request = ErasureRequest.of("acme", "alice", None, by="ops", at=at)
        store.record(request)
        store.complete(request.receipt(completed_at=at, sessions=1, events_purged=1))
        return request

    erase(5e9)  # before the mark, however late it says it finished: not read
    mark = store.receipts_mark()
    assert store.receipts_after(mark) == []
    assert erasure_after(store, key, 0.0, mark=mark) is None
    later = erase(1.0)  # after the mark, however early it says it finished
    assert [r.id for r in store.receipts_after(mark)] == [later.id]
    assert erasure_after(store, key, 4e9, mark=mark) is not None
    assert erasure_after(store, MemoryKey("acme", "bob", "chat"), 0.0, mark=mark) is None
    write("done", "ab12", b"\xc1 no msgpack", True)
    with pytest.raises(ErasureJournalDamaged) as caught:
        store.receipts_after(mark)
    assert [d.id for d in caught.value.damaged] == ["ab12"]
    assert [r.id for r in caught.value.readable if isinstance(r, ErasureReceipt)] == [later.id]


def test_erasing_sessions_never_written_keeps_nothing_in_the_shared_journal(
    served: tuple[str, MemorySystem],
) -> None:
    """A tenant's erasures of sessions (and users) it never wrote are answered as before and leave no
    receipt: each left one for good (347 bytes) in the journal every tenant shares, counted in no
    quota, at one request each (113 a second on this machine: 3.4 GB a day). An erasure of what a
    session holds still keeps its receipt, and a user's erasure too when a snapshot is all it has."""
    url, system = served
    with RemoteMemory(url, timeout=WAIT) as memory:
        kept = asyncio.run(_messages(url, JOURNAL_STREAM))
        for n in range(20):
            assert memory.session(MemoryKey("acme", "mallory", f"never-{n}")).erase() == 0
            assert memory.erase_user("acme", f"nobody-{n}") == {"events_purged": 0, "sessions": 0}
        assert asyncio.run(_messages(url, JOURNAL_STREAM)) == kept
        held = memory.session(MemoryKey("acme", "alice", "chat"))
        held.add_turn(_turn("acme's own"))
        assert held.erase() == 2  # its opening and its turn
        assert asyncio.run(_messages(url, JOURNAL_STREAM)) == kept + 1
    assert system.erasure_record(MemoryKey("acme", "alice", "chat")) is not None


def test_an_erasure_of_nothing_held_records_nothing_but_one_of_a_snapshot_or_an_export_does(
    tmp_path: Path,
) -> None:
    """`erase(..., if_held=True)` (the service's): a session with no event, snapshot, export file or
    live copy is answered without a record; a snapshot left without its events, or an export file
    recorded as holding the session, is still erased through the journal (and so leaves a receipt)."""
    log, snapshots, kept = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()
    exports = FileExportRegistry(tmp_path / "exports.json")
    alone, exported = MemoryKey("acme", "alice", "snapshot-only"), MemoryKey("acme", "alice", "exported")
    with MemorySystem(
        CONFIG, log=log, snapshots=snapshots, journal=kept, snapshot_every=1, exports=exports
    ) as memory:
        memory.session(alone).add_turn(_turn("kept in a snapshot"))
        memory.passivate(alone)
    log.erase(alone, at=1.0)  # its events gone outside an erasure, its snapshot left
    (tmp_path / "out.jsonl").write_text("", encoding="utf-8")
    exports.record(tmp_path / "out.jsonl", [exported])
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=kept, exports=exports) as memory:
        assert memory.erase(MemoryKey("acme", "alice", "never"), if_held=True).events_purged == 0
        assert memory.erase_user("acme", "nobody", if_held=True).sessions == 0
        assert kept.receipts() == []
        memory.erase(alone, if_held=True)
        assert snapshots.load(alone) is None
        memory.erase(exported, if_held=True)
        assert len(kept.receipts()) == 2


def test_a_tenant_that_never_reads_its_replies_is_cut_off_alone(tmp_path: Path) -> None:
    """acme asks for 128 exports of a 170 KB session (32 at a time, its max_in_flight) on a raw
    connection that never reads: the server closes acme's connection as a slow consumer; the
    service's connections never reconnect, every request was answered, and globex is served."""
    body = json.dumps({"user_id": "alice", "session_id": "big"}).encode()
    with EmbeddedNatsServer(tmp_path / "nats", extra_config="max_pending: 1MB\n") as server:
        system = convmem.connect(server.url, config=CONFIG)
        try:
            with (
                MemoryService(system, server.url) as service,
                RemoteMemory(server.url, timeout=WAIT) as memory,
            ):
                big = memory.session(MemoryKey("acme", "alice", "big"))
                for _ in range(20):
                    big.add_turn(ConversationTurn(user_message="x" * 4000, assistant_response="y" * 4000))
                calm = memory.session(MemoryKey("globex", "bob", "calm"))
                host, port = server.url.removeprefix("nats://").split(":")
                with socket.socket() as slow:
                    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    slow.connect((host, int(port)))
                    slow.sendall(b'CONNECT {"verbose":false,"protocol":1}\r\nSUB _INBOX_acme.slow.* 1\r\n')
                    sent = 0
                    for _ in range(4):
                        slow.sendall(
                            b"".join(
                                b"PUB convmem.api.v1.acme.export_state _INBOX_acme.slow.%d %d\r\n%s\r\n"
                                % (sent + n, len(body), body)
                                for n in range(32)
                            )
                        )
                        sent += 32
                        assert service.wait_for(lambda n=sent: _answered(service, "export_state") >= n, WAIT)
                    slow.settimeout(WAIT)
                    received = 0
                    while chunk := slow.recv(1 << 20):  # what the server sent before it closed it
                        received += len(chunk)
                assert received < sent * 100_000  # most of 128 replies of 170 KB never reached it
                assert service.metrics()["service"]["errors_by_type"] == {}
                assert system.log._conn.nc.stats["reconnects"] == 0  # type: ignore[attr-defined]
                assert service._nc is not None
                assert service._nc.stats["reconnects"] == 0
                assert calm.add_turn(_turn("globex's own")) == 1
        finally:
            system.close()


async def _timeout_flood(url: str, key: MemoryKey, requests: int) -> dict[str, int]:
    """acme's add_turns of `key`, each allowed a tenth of a second (`timeout`), sent 32 at a time as
    the replies come: the replies by kind."""
    nc = await nats.connect(url)
    kinds: dict[str, int] = {}
    try:
        sub = await nc.subscribe("_INBOX_acme.flood.*")
        for start in range(0, requests, 32):
            for n in range(start, start + 32):
                body = {
                    "user_id": key.user_id,
                    "session_id": key.session_id,
                    "timeout": 0.1,
                    "turn": {"user_message": "x" * 2000, "assistant_response": "y"},
                }
                await nc.publish(
                    "convmem.api.v1.acme.add_turn", json.dumps(body).encode(), reply=f"_INBOX_acme.flood.{n}"
                )
            for _ in range(32):
                reply = json.loads((await sub.next_msg(WAIT)).data)
                kind = "ok" if reply["ok"] else reply["error"]["type"]
                kinds[kind] = kinds.get(kind, 0) + 1
    finally:
        await nc.close()
    return kinds


@pytest.mark.parametrize("lane", ["pool", "loop"])
def test_writes_a_tenant_stopped_waiting_for_do_not_pile_up(
    nats_server: EmbeddedNatsServer, lane: str
) -> None:
    """acme's add_turns of a busy session (its actor held), each answered OperationTimeout: each
    timeout freed acme's place at once while its write stayed queued and ran later (a microsecond
    each, before timeouts were rounded: 467 timeouts, then 471 events and 1.10 MB stored against a
    200,000-byte quota, all of it after the replies: past max_in_flight and the quota). A write whose
    caller gave up before it started never starts now; the lane on the log's own loop (`convmem
    serve`'s workers) already withdrew them."""
    if lane == "loop":
        loop = EventLoopThread(name="test-flood-loop")
        backend = loop.call(lambda: open_backend_here(nats_server.url), timeout=WAIT, what="the log")
        system = MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots, journal=backend.journal)
    else:
        system = convmem.connect(nats_server.url, config=CONFIG)
    key = MemoryKey("acme", "mallory", "busy")
    try:
        with (
            MemoryService(system, nats_server.url, loop=loop if lane == "loop" else None),
            RemoteMemory(nats_server.url, timeout=WAIT) as memory,
        ):
            memory.session(key).add_turn(_turn("before"))
            actor = claim(system._sessions._live[key].ref)
            assert actor is not None
            try:
                kinds = asyncio.run(_timeout_flood(nats_server.url, key, requests=32))
            finally:
                actor.run_claimed(Wake())  # frees the actor: what is still queued runs now
            system.session(key).refresh(timeout=WAIT)  # a message behind whatever was queued
        assert kinds == {"OperationTimeout": 32}
        assert len(system.log.read(key)) == 2  # its opening and "before": none of the 32 ran
    finally:
        system.close()
        if lane == "loop":
            backend.close()
            loop.stop()


async def _flush_flood(url: str, requests: int) -> None:
    """acme's flushes of one session, each allowed a microsecond (a 1/16 s once rounded up), 32 at a
    time as the replies come."""
    nc = await nats.connect(url)
    got = asyncio.Event()
    count = [0, 0]  # replies, the count `got` is set at

    async def on_reply(_msg: Msg) -> None:
        count[0] += 1
        if count[0] >= count[1]:
            got.set()

    await nc.subscribe("_INBOX_acme.flush.*", cb=on_reply)
    body = json.dumps({"user_id": "alice", "session_id": "chat", "timeout": 1e-6}).encode()
    try:
        for start in range(0, requests, 32):
            for n in range(start, start + 32):
                await nc.publish("convmem.api.v1.acme.flush", body, reply=f"_INBOX_acme.flush.{n}")
            got.clear()
            count[1] = start + 32
            if count[0] < count[1]:
                await asyncio.wait_for(got.wait(), WAIT)
    finally:
        await nc.close()


def test_flushes_a_tenant_stopped_waiting_for_are_not_kept_by_the_session(
    nats_server: EmbeddedNatsServer,
) -> None:
    """acme's 160 flushes of a session whose summary is being made, each allowed a microsecond: each
    was answered OperationTimeout and its place freed, and each stayed among the session's waiters
    until the summary ended (5,000 flushes: 5,024 waiters, each added by copying all the others). A
    flush whose caller gave up is forgotten: the waiters are the callers still waiting."""
    summarizer = PlannedSummarizer(default="hang")
    system = convmem.connect(nats_server.url, config=summarizing_config(), summarizer=summarizer)
    key = MemoryKey("acme", "alice", "chat")
    try:
        with MemoryService(system, nats_server.url), RemoteMemory(nats_server.url, timeout=WAIT) as memory:
            session = memory.session(key)
            for n in range(4):
                session.add_turn(turn(f"turn {n}"))
            summarizer.wait_calls(1)
            asyncio.run(_flush_flood(nats_server.url, 160))  # each waits 1/16 s: the timeout rounded up
            system.session(key).refresh(timeout=WAIT)  # behind every flush the session was sent
            activity = system.activity(key)
            assert activity is not None
            assert activity.summarizing
            assert activity.flushes_waiting <= 32  # at most the flushes acme's places hold
            summarizer.release()
            session.flush()
    finally:
        summarizer.release()
        system.close()


def test_headers_keys_and_ids_a_tenant_picks_reach_only_its_own_sessions(
    served: tuple[str, MemorySystem],
) -> None:
    """Held: a request's NATS headers are never read (a Nats-Msg-Id of globex's event, Nats-Rollup,
    Nats-Expected-* change nothing of globex's: acme's turn is stored as any other); an idempotency
    key globex used is acme's own key too; ids made of subject separators and wildcards are sessions
    of their own, each listed back exactly."""
    url, system = served
    victim = MemoryKey("globex", "bob", "chat")
    with RemoteMemory(url, timeout=WAIT) as memory:
        assert memory.session(victim).add_turn(_turn("globex's own"), idempotency_key="k-1") == 1
        their_id = system.log.read(victim)[-1].event_id
        assert (
            memory.session(MemoryKey("acme", "alice", "chat")).add_turn(_turn("mine"), idempotency_key="k-1")
            == 1
        )

        async def with_headers() -> dict[str, Any]:
            nc = await nats.connect(url)
            try:
                body = {
                    "user_id": "alice",
                    "session_id": "chat",
                    "turn": {"user_message": "h", "assistant_response": "ok"},
                }
                headers = {
                    "Nats-Msg-Id": their_id,
                    "Nats-Rollup": "all",
                    "Nats-Expected-Stream": "ELSEWHERE",
                    "Nats-Expected-Last-Subject-Sequence": "999",
                }
                inbox = "_INBOX_acme.hdr"
                sub = await nc.subscribe(inbox + ".*")
                await nc.publish(
                    "convmem.api.v1.acme.add_turn",
                    json.dumps(body).encode(),
                    reply=inbox + ".1",
                    headers=headers,
                )
                reply: dict[str, Any] = json.loads((await sub.next_msg(WAIT)).data)
                return reply
            finally:
                await nc.close()

        assert asyncio.run(with_headers()) == {"v": 1, "ok": True, "result": 2}
        assert [r.event_id for r in system.log.read(victim)][-1] == their_id
        odd = [("a.b", "c"), ("a", "b.c"), ("*", ">"), ("..", "."), ("a b", "=2E"), ("\u212a", "K")]
        for user_id, session_id in odd:
            assert memory.session(MemoryKey("acme", user_id, session_id)).add_turn(_turn(user_id)) == 1
        listed = {(row["user_id"], row["session_id"]) for row in memory.sessions("acme", limit=100)}
    assert set(odd) <= listed
    assert len(system.log.read(victim)) == 2  # its opening and its turn: nothing of acme's reached it


def _stored(session: Any) -> bool:
    """Whether a 1,000-character turn was stored (False: refused, the tenant at its quota)."""
    try:
        session.add_turn(_turn("x" * 1000))
    except QuotaExceeded:
        return False
    return True


def test_an_erasure_of_nothing_does_not_make_a_tenant_at_its_quota_counted_again(
    nats_server: EmbeddedNatsServer,
) -> None:
    """acme at its quota alternates an erasure of a session it never wrote with a write (refused):
    each erasure marked its bytes unknown, so each refusal counted every event of acme again (50
    pairs read 11,450 messages: a full count a pair, 10 s of the store's time a pair for a tenant of
    1 GiB; here 20 pairs over 148 events read about 3,100). An erasure that removed no event leaves
    the count as it was (here about 190 messages for the 20 pairs' own requests)."""
    system = convmem.connect(nats_server.url, config=CONFIG)
    quotas = Quotas(default=TenantLimits(max_bytes=200_000))
    big = MemoryKey("acme", "alice", "big")
    try:
        with (
            MemoryService(system, nats_server.url, quotas=quotas),
            RemoteMemory(nats_server.url, timeout=WAIT) as memory,
        ):
            session = memory.session(big)
            while _stored(session):
                pass
            with pytest.raises(QuotaExceeded):
                session.add_turn(_turn("x"))  # the count a refusal rests on is fresh now
            before = _received(system)
            for n in range(20):
                assert memory.session(MemoryKey("acme", "alice", f"never-{n}")).erase() == 0
                with pytest.raises(QuotaExceeded):
                    session.add_turn(_turn("x"))
            events = len(system.log.read(big))
            assert _received(system) - before < 2 * events  # not two full counts, let alone twenty
    finally:
        system.close()


def test_timeouts_a_tenant_picks_do_not_each_keep_a_line_of_deadlines(
    nats_server: EmbeddedNatsServer,
) -> None:
    """The add_turn lane on the log's loop keeps one line of deadlines (and a loop timer) per timeout
    value, each for as long as that timeout: acme's 1,024 add_turns, each with its own timeout
    (50 s plus n microseconds), left 1,024 lines behind them once answered. The service rounds a
    request's timeout up to a sixteenth of a second, so at most 16 a second of max_timeout."""
    loop = EventLoopThread(name="test-lines-loop")
    backend = loop.call(lambda: open_backend_here(nats_server.url), timeout=WAIT, what="the log")
    system = MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots, journal=backend.journal)
    key = MemoryKey("acme", "alice", "chat")

    async def distinct_timeouts() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            sub = await nc.subscribe("_INBOX_acme.lines.*")
            for start in range(0, 1_000, 32):
                for n in range(start, start + 32):
                    body = {
                        "user_id": key.user_id,
                        "session_id": key.session_id,
                        "timeout": 50 + n * 1e-6,
                        "turn": {"user_message": f"m{n}", "assistant_response": "ok"},
                    }
                    await nc.publish(
                        "convmem.api.v1.acme.add_turn",
                        json.dumps(body).encode(),
                        reply=f"_INBOX_acme.lines.{n}",
                    )
                for _ in range(32):
                    assert json.loads((await sub.next_msg(WAIT)).data)["ok"]
        finally:
            await nc.close()

    try:
        with (
            MemoryService(system, nats_server.url, loop=loop) as service,
            RemoteMemory(nats_server.url, timeout=WAIT) as memory,
        ):
            memory.session(key).add_turn(_turn("live now"))  # the lane takes a live session's turns
            asyncio.run(distinct_timeouts())

            async def lines() -> int:
                return len(service._lane.deadlines._lines)

            assert loop.call(lines, timeout=WAIT, what="counting the lines") <= 2
    finally:
        system.close()
        backend.close()
        loop.stop()


def test_another_tenants_erasures_do_not_make_a_tenant_at_its_quota_counted_again(
    nats_server: EmbeddedNatsServer,
) -> None:
    """globex writes and erases a session, again and again, while acme, at its quota, writes (refused):
    each of globex's erasures reached every service instance as a notice naming no tenant, so each
    of acme's refusals counted every event of acme again (50 rounds over 221 events: 13,015 messages
    read; here 20 rounds over 148 events about 3,900). A notice names its tenants as digests now:
    acme's count stays as it was."""
    system = convmem.connect(nats_server.url, config=CONFIG)
    quotas = Quotas(default=TenantLimits(max_bytes=200_000), tenants={"globex": TenantLimits()})
    big = MemoryKey("acme", "alice", "big")
    try:
        with (
            MemoryService(system, nats_server.url, quotas=quotas),
            RemoteMemory(nats_server.url, timeout=WAIT) as memory,
        ):
            session = memory.session(big)
            while _stored(session):
                pass
            with pytest.raises(QuotaExceeded):
                session.add_turn(_turn("x"))  # the count a refusal rests on is fresh now
            before = _received(system)
            for n in range(20):
                other = memory.session(MemoryKey("globex", "bob", f"brief-{n}"))
                other.add_turn(_turn("soon gone"))
                assert other.erase() == 2
                with pytest.raises(QuotaExceeded):
                    session.add_turn(_turn("x"))
            events = len(system.log.read(big))
            # globex's own writes and erasures read about 770 messages; a full count of acme a round
            # made it about 3,900
            assert _received(system) - before < 10 * events
    finally:
        system.close()


def _counting_full_counts(service: MemoryService) -> list[str]:
    """The tenants of each full count the service's byte tallies make from now on (the count itself
    runs as before, on the real log: only its calls are listed)."""
    usage = service._usage
    counted: list[str] = []
    count = usage._counter

    async def listed(tenant_id: str, after: int) -> tuple[int, int]:
        counted.append(tenant_id)
        return await count(tenant_id, after)

    usage._counter = listed
    return counted


def test_a_tenant_erasing_and_writing_again_at_its_quota_is_not_counted_again(
    nats_server: EmbeddedNatsServer,
) -> None:
    """acme at its quota erases one of its sessions, writes a new one as large (admitted) and then a
    write that is over (refused), 20 rounds: each erasure marked acme's bytes unknown, so each round
    counted every event of acme again (20 full counts; here 20 rounds over about 310 events read
    6,940 messages; about 10 s of the store's time a round for a tenant of 1 GiB). The erasure takes
    the bytes it deleted off acme's tally instead (the sizes of the messages it read to erase them):
    no count (about 750 messages read, the rounds' own), and the tally is still what the stream
    holds for acme, byte for byte."""
    system = convmem.connect(nats_server.url, config=CONFIG)
    quotas = Quotas(default=TenantLimits(max_bytes=200_000))
    try:
        with (
            MemoryService(system, nats_server.url, quotas=quotas) as service,
            RemoteMemory(nats_server.url, timeout=WAIT) as memory,
        ):
            for n in range(20):
                assert _stored(memory.session(MemoryKey("acme", "alice", f"old-{n:02}")))
            big = memory.session(MemoryKey("acme", "alice", "big"))
            while True:  # up to a refusal: the count it rests on is fresh then
                try:
                    big.add_turn(_turn("x" * 200))
                except QuotaExceeded:
                    break
            counts = _counting_full_counts(service)
            before, admitted = _received(system), 0
            for n in range(20):
                assert memory.session(MemoryKey("acme", "alice", f"old-{n:02}")).erase() == 2
                admitted += _stored(memory.session(MemoryKey("acme", "alice", f"new-{n:02}")))
                admitted += _stored(big)
            read = _received(system) - before
            assert 20 <= admitted <= 21  # the new sessions, and none past the quota but by a turn
            assert counts == []
            events = sum(1 for _ in system.log.read_all(tenant_id="acme"))
            # the rounds' own requests (erasures, journal, writes) read about 750; a full count reads
            # every event of acme (about 310): twenty of them made it about 6,900
            assert events > 250
            assert read < 1_000, read
            assert service._usage.usage("acme") == system.log.stored_bytes("acme")[0]
    finally:
        system.close()
