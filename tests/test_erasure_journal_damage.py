"""A damaged record of the erasure journal is damage, named, never skipped (both journals, and the CLI).

A record the journal holds but cannot read back as it was written (bytes
that do not decode, the record of another id, a checksum that fails, a
record the store counts but cannot serve) makes `pending` / `receipts` raise
`ErasureJournalDamaged`, naming it and carrying what still reads; a pending
erasure that reads is still finished; `find_erasure` never answers "not
erased" past a damaged record; a receipt kept for its id, or `settle`, ends
the report. Records are sealed with a ``Convmem-Sum`` checksum; records
written before it are still read. The byte flip in a real server's block
file is in `tests/test_damage.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import msgspec
import pytest

from convmem.actors import ErasureJournal, ErasureReceipt, ErasureRequest, MemorySystem, find_erasure
from convmem.actors._journal import ErasureJournalDamaged
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    JetStreamBackend,
)
from convmem.adapters.backends._checksum import SUM_HEADER, seal
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.frontends.cli import main
from convmem.events import (
    ConversationTurn,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    encode_event,
)

TENANT, USER = "acme", "erin.ZQXJ8@example.com"
KEPT = MemoryKey(TENANT, "frank", "chat-kept")
CONFIG = ShortTermMemoryConfig(strategy="truncation")

RawWrite = Callable[[str, str, "bytes | None", bool], None]
"""(kind, erasure id, bytes, sealed): a record put in the journal as a damaged store might hold it."""


def user_key(n: int) -> MemoryKey:
    return MemoryKey(TENANT, USER, f"chat-{n}")


def request(at: float = 1.0, session_id: str | None = None) -> ErasureRequest:
    return ErasureRequest.of(TENANT, USER, session_id, by="ops-ann", at=at)


def _publish(url: str, subject: str, data: bytes, headers: dict[str, str]) -> None:
    connection = NatsConnection.connect(url)
    try:
        connection.call(lambda: connection.js.publish(subject, data, headers=headers), what="publish")
    finally:
        connection.release()


@pytest.fixture(params=["memory", "jetstream"])
def journal(request: pytest.FixtureRequest) -> Iterator[tuple[ErasureJournal, RawWrite]]:
    """The journal, and a way to put raw bytes in it (None: a record held that cannot be served)."""
    if request.param == "memory":
        memory = InMemoryErasureJournal()

        def store(kind: str, erasure_id: str, data: bytes | None, sealed: bool) -> None:
            assert kind in ("pending", "done")
            memory.store_raw(kind, erasure_id, data)  # type: ignore[arg-type]

        yield memory, store
        return
    server: EmbeddedNatsServer = request.getfixturevalue("nats_server")
    with JetStreamBackend.connect(server.url) as backend:
        assert backend.journal is not None
        bucket = backend.journal.bucket

        def publish(kind: str, erasure_id: str, data: bytes | None, sealed: bool) -> None:
            assert data is not None, "a message the server cannot serve is made in tests/test_damage.py"
            subject = f"$KV.{bucket}.{kind}.{erasure_id}"
            _publish(server.url, subject, data, {SUM_HEADER: seal("", subject, data)} if sealed else {})

        yield backend.journal, publish


def test_a_pending_record_that_does_not_decode_is_named_with_the_ones_that_read(
    journal: tuple[ErasureJournal, RawWrite],
) -> None:
    """Bytes that are no request: `pending` raises, naming the record's key; the readable one comes along."""
    store, write = journal
    readable = request()
    store.record(readable)
    write("pending", "ab12", b"\xc1 no msgpack", True)
    with pytest.raises(ErasureJournalDamaged) as caught:
        store.pending()
    damage = caught.value
    assert [(d.kind, d.id) for d in damage.damaged] == [("pending", "ab12")]
    assert "pending.ab12" in damage.damaged[0].where
    assert "does not decode" in damage.damaged[0].problem
    assert damage.readable == (readable,)
    assert "pending.ab12" in str(damage)
    assert "--settle" in str(damage)  # what the operator does
    assert USER not in str(damage)


def test_a_record_holding_another_erasure_is_damage(journal: tuple[ErasureJournal, RawWrite]) -> None:
    """A request stored under a key that is not its id is not read as either."""
    store, write = journal
    write("pending", "cd34", msgspec.msgpack.encode(request()), True)
    with pytest.raises(ErasureJournalDamaged, match="another erasure id"):
        store.pending()


def test_find_erasure_never_says_not_erased_past_a_damaged_record(
    journal: tuple[ErasureJournal, RawWrite],
) -> None:
    """A readable record that covers the key answers; otherwise the damaged one might: it raises."""
    store, write = journal
    covering = request()
    store.record(covering)
    write("pending", "ab12", b"\xc1", True)
    assert find_erasure(store, user_key(1)) == covering
    with pytest.raises(ErasureJournalDamaged, match=r"pending\.ab12"):
        find_erasure(store, KEPT)


def test_a_damaged_pending_record_ends_with_its_receipt_or_a_settlement(
    journal: tuple[ErasureJournal, RawWrite],
) -> None:
    """A receipt kept for its id (the erasure finished) or `settle` (an operator dealt with it) ends it."""
    store, write = journal
    finished = request(at=1.0)
    write("pending", finished.id, b"\xc1", True)
    write("pending", "ef56", b"\xc1", True)
    with pytest.raises(ErasureJournalDamaged) as caught:
        store.pending()
    assert sorted(d.id for d in caught.value.damaged) == sorted([finished.id, "ef56"])
    store.complete(finished.receipt(completed_at=2.0, sessions=1, events_purged=2))
    with pytest.raises(ErasureJournalDamaged) as caught:
        store.pending()
    assert [d.id for d in caught.value.damaged] == ["ef56"]
    store.settle("ef56", by="ops-ann", at=3.0)
    store.settle("ef56", by="ops-ann", at=4.0)  # idempotent
    assert store.pending() == []
    assert [r.id for r in store.receipts()] == [finished.id]


def test_a_damaged_receipt_is_reported_until_settled(journal: tuple[ErasureJournal, RawWrite]) -> None:
    """A receipt that does not read: `receipts` raises (the pending side is clean); `settle` ends it."""
    store, write = journal
    kept = request()
    store.record(kept)
    store.complete(kept.receipt(completed_at=2.0, sessions=1, events_purged=2))
    write("done", "ab12", b"junk", True)
    assert store.pending() == []
    with pytest.raises(ErasureJournalDamaged) as caught:
        store.receipts()
    assert [(d.kind, d.id) for d in caught.value.damaged] == [("done", "ab12")]
    assert [r.id for r in caught.value.readable if isinstance(r, ErasureReceipt)] == [kept.id]
    assert "receipt" in str(caught.value)
    store.settle("ab12", by="ops-ann", at=3.0)
    assert [r.id for r in store.receipts()] == [kept.id]


def test_a_system_finishes_the_readable_erasures_and_reports_the_damaged_one() -> None:
    """A start finishes the pending erasure that reads; `pending_erasures` then names the damaged one."""
    log, snapshots, journal = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        for key in (user_key(1), KEPT):
            memory.session(key).add_turn(ConversationTurn(user_message="hello", assistant_response="hi"))
    journal.record(request())
    journal.store_raw("pending", "ab12", None)  # counted by the store, not served
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        assert log.keys(tenant_id=TENANT, user_id=USER) == []
        assert log.keys() == [KEPT]
        with pytest.raises(ErasureJournalDamaged) as caught:
            memory.pending_erasures()
        assert [d.id for d in caught.value.damaged] == ["ab12"]
        assert caught.value.readable == ()
        assert "cannot read it back" in str(caught.value)


# -- JetStream: the checksum, and the CLI -------------------------------------------------------


def test_records_are_sealed_and_a_failed_checksum_is_damage_named_by_position(
    nats_server: EmbeddedNatsServer,
) -> None:
    """`record` and `complete` write ``Convmem-Sum``; bytes that do not match it are damage, with the seq;
    records without the header (an older convmem wrote them) are read unchecked, as before."""
    with JetStreamBackend.connect(nats_server.url) as backend:
        journal = backend.journal
        assert journal is not None
        stream = f"KV_{journal.bucket}"
        first = request()
        journal.record(first)
        journal.complete(first.receipt(completed_at=2.0, sessions=1, events_purged=1))
        second = request(at=3.0)
        journal.record(second)
        connection = NatsConnection.connect(nats_server.url)
        try:
            for kind, erasure_id in (("done", first.id), ("pending", second.id)):
                subject = f"$KV.{journal.bucket}.{kind}.{erasure_id}"
                message = connection.call(
                    lambda s=subject: connection.get_message(stream, {"last_by_subj": s}), what="get"
                )
                assert message is not None
                assert message.headers[SUM_HEADER] == seal("", subject, message.data)
        finally:
            connection.release()
        old = request(at=0.5)
        old_receipt = old.receipt(completed_at=0.7, sessions=1, events_purged=1)
        for kind, data in (
            ("pending", msgspec.msgpack.encode(old)),
            ("done", msgspec.msgpack.encode(old_receipt)),
        ):
            _publish(nats_server.url, f"$KV.{journal.bucket}.{kind}.{old.id}", data, {})
        assert journal.pending() == [old, second]
        assert [r.id for r in journal.receipts()] == [old.id, first.id]
        assert journal.receipts()[0] == old_receipt
        forged = request(at=4.0)
        subject = f"$KV.{journal.bucket}.pending.{forged.id}"
        _publish(nats_server.url, subject, msgspec.msgpack.encode(forged), {SUM_HEADER: "00000000"})
        with pytest.raises(ErasureJournalDamaged) as caught:
            journal.pending()
        (damaged,) = caught.value.damaged
        assert damaged.id == forged.id
        assert "fails its checksum" in damaged.problem
        assert f"stream {stream} seq " in damaged.where
        assert caught.value.readable == (old, second)


def test_the_cli_names_a_damaged_receipt_and_settles_it(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify --all and erase --resume exit 7 naming the record; erase --settle ID ends it (exit 0)."""
    url = nats_server.url
    with JetStreamBackend.connect(url) as backend:
        assert backend.journal is not None
        with MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots) as memory:
            memory.session(KEPT).add_turn(ConversationTurn(user_message="hello", assistant_response="hi"))
        subject = f"$KV.{backend.journal.bucket}.done.ab12"
    _publish(url, subject, b"junk", {SUM_HEADER: seal("", subject, b"junk")})

    assert main(["-s", url, "verify", "--all"]) == 7
    out, err = capsys.readouterr()
    assert "erasure journal: DAMAGED receipt of erasure ab12 (key done.ab12" in out
    assert main(["-s", url, "erase", "--resume", "--json"]) == 7
    out, err = capsys.readouterr()
    assert [d["id"] for d in json.loads(out)["damaged"]] == ["ab12"]
    assert "done.ab12" in err

    assert main(["-s", url, "erase", "--settle", "zz99", "--yes"]) == 3  # not a damaged record
    assert "zz99" in capsys.readouterr().err
    assert main(["-s", url, "erase", "--settle", "ab12", "--tenant", TENANT]) == 2
    capsys.readouterr()
    assert main(["-s", url, "erase", "--settle", "ab12", "--yes"]) == 0
    assert "settled the damaged journal record of erasure ab12" in capsys.readouterr().out
    assert main(["-s", url, "verify", "--all"]) == 0
    assert main(["-s", url, "erase", "--resume"]) == 0
    assert "no pending erasure" in capsys.readouterr().out


def test_a_command_that_needs_a_damaged_record_exits_7_with_its_advice(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`repair` asks the journal whether the damaged session was erased; a damaged record might say so:
    the CLI's error mapping reports it as damage (exit 7), naming the record and what to do."""
    url = nats_server.url
    hurt = user_key(1)
    with JetStreamBackend.connect(url) as backend:
        assert backend.journal is not None
        started = SessionStarted(seq=1, event_id="s/1", at=1.0, key=hurt, config=CONFIG)
        backend.log.append(hurt, [started], expected_seq=0)
        added = TurnAdded(
            seq=2,
            event_id="s/2",
            at=2.0,
            index=1,
            turn=ConversationTurn(user_message="hello", assistant_response="hi"),
        )
        data = encode_event(added)
        backend.log.append_raw(  # bytes that no longer match their checksum: the session is damaged
            hurt, data.replace(b"hello", b"HELLO"), seq=2, checksum=seal(2, "s/2", data), event_id="s/2"
        )
        subject = f"$KV.{backend.journal.bucket}.done.ab12"
    _publish(url, subject, b"junk", {SUM_HEADER: seal("", subject, b"junk")})

    for argv in (["repair", hurt.composite(), "--dry-run"], ["repair", hurt.composite(), "--yes"]):
        assert main(["-s", url, *argv]) == 7
        out, err = capsys.readouterr()
        assert out == ""
        (line,) = err.splitlines()
        assert "the erasure journal holds 1 damaged record(s): receipt of erasure ab12 (key done.ab12" in line
        assert "`convmem erase --settle ID`" in line  # its advice
