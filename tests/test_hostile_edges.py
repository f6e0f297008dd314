"""A hostile tenant at the edges of the service, round five: what the earlier rounds did not try.

Each probe uses one tenant's own subjects and inbox only (the embedded server
without auth: the service's own rules are what stands), against a real
nats-server. The counts come from the server (the JetStream account's API
requests, the streams' message counts), never from timings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from runtime_helpers import WAIT
from test_erasure_journal_damage import RawWrite, journal  # noqa: F401 (the fixture: both journals)

import convmem
from convmem.actors import ErasureJournal, ErasureReceipt, ErasureRequest, MemorySystem
from convmem.actors._journal import ErasureJournalDamaged, MarksReceipts, erasure_after
from convmem.adapters import EmbeddedNatsServer, MemoryService, RemoteMemory
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
    """acme's erasures (of sessions it never wrote: each is answered and leaves a receipt in the shared
    journal) cost globex's forks nothing: a fork sends the store as many requests after 60 receipts
    as before. It read every receipt four times, one request each (300 receipts: a fork took 1.25 s
    instead of 16 ms; 60 receipts: more than 240 more requests)."""
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
        for n in range(60):
            assert memory.session(MemoryKey("acme", "mallory", f"never-{n}")).erase() == 0
        assert asyncio.run(_messages(url, JOURNAL_STREAM)) == receipts + 60
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
