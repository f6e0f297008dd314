"""A hostile tenant at the edges of the service, round five: what the earlier rounds did not try.

Each probe uses one tenant's own subjects and inbox only (the embedded server
without auth: the service's own rules are what stands), against a real
nats-server. The counts come from the server (the JetStream account's API
requests, the streams' message counts), never from timings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from runtime_helpers import WAIT
from test_erasure_journal_damage import RawWrite, journal  # noqa: F401 (the fixture: both journals)

import convmem
from convmem.actors import ErasureJournal, ErasureReceipt, ErasureRequest, MemorySystem
from convmem.actors._journal import ErasureJournalDamaged, MarksReceipts, erasure_after
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    MemoryService,
    RemoteMemory,
)
from convmem.adapters.backends import FileExportRegistry
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


async def _messages(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


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
