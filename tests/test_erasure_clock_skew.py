"""A copy of old data (a fork, a restore, an export) asks the journal by position, not by clock.

A fork, a lost session's restore and an export to a file ask the erasure journal again once they
wrote: an erasure that ran while they read and wrote may have listed the sessions (or the export
files) before the copy existed, so the copy is erased data too.
"While" used to be a time: receipts that say they finished at or after the moment the copy began,
this machine's clock against the eraser's. With the eraser's clock hours behind, an erasure that ran
in the middle looked older than the copy and the erased turns stayed in the copy; with it hours
ahead, an erasure over before the copy began looked newer and a fork of data written since was
erased. Now the copy takes the journal's position (`receipts_mark`) before it reads and asks only
about the receipts kept after it: the clocks do not matter.

A lost session's kept snapshot (a restore's first question, and a load's) is weighed against a
receipt by log position too: the receipt records where the log stood after its events step
(`ErasureReceipt.log_position`), the snapshot its last event's position (`Snapshot.position`). A
session begun again after the erasure numbers its seqs from 1 again (the erasure leaves no fence),
so its seqs say nothing; its positions are above the receipt's. Receipts and snapshots written
before positions were recorded are weighed by time, as before.

Each case runs on a real nats-server; the eraser is a second system on the same store whose clock
(injected, `ManualClock`) is 3 hours behind or ahead; the erasure runs in the copy's middle through
the copier's log read, as `tests/test_erasure_races.py` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from runtime_helpers import wait_until

import convmem
from convmem.actors import ErasureReceipt, ErasureRequest, MemorySystem, Snapshot
from convmem.actors._clock import ManualClock
from convmem.actors._journal import erasure_after
from convmem.actors._ports import position_of
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends import (
    FileExportRegistry,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
)
from convmem.adapters.frontends.cli import main
from convmem.errors import InvalidInput, SessionLost
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
TENANT, USER = "acme", "gail"
KEY = MemoryKey(TENANT, USER, "chat-1")
FORK = MemoryKey(TENANT, USER, "chat-fork")
SECRET = "gail's card 5500-SKEW"
KEPT = MemoryKey(TENANT, "hank", "chat-kept")
KEPT_TEXT = "hank's note SKEW-KEPT"
HOURS = 3 * 3600.0


def write(memory: MemorySystem, key: MemoryKey, turns: int = 3) -> None:
    for n in range(turns):
        memory.session(key).add_turn(
            ConversationTurn(user_message=f"{SECRET} #{n}", assistant_response="noted"), timeout=10
        )


@contextmanager
def eraser(url: str, skew: float) -> Iterator[MemorySystem]:
    """A system whose clock is `skew` seconds off this machine's (its receipts say so)."""
    with convmem.connect(url, config=CONFIG, clock=ManualClock(time.time() + skew)) as memory:
        yield memory


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_fork_during_an_erasure_is_erased_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
    with convmem.connect(nats_server.url, config=CONFIG) as forker, eraser(nats_server.url, skew) as other:
        read = forker.log.read

        def read_then_erase(key: MemoryKey) -> object:
            records = read(key)
            if key == KEY:  # the fork has read the source: the whole erasure runs now
                other.erase_user(TENANT, USER, by="ops")
            return records

        forker.log.read = read_then_erase  # type: ignore[method-assign]
        with pytest.raises(InvalidInput, match="erased while it was forked"):
            forker.fork(KEY, to=FORK)
        forker.log.read = read  # type: ignore[method-assign]
        assert forker.log.read(FORK) == []
        (receipt,) = [r for r in other.journal.receipts() if r.covers(KEY)]
        assert (receipt.completed_at - time.time()) * skew > 0  # the receipt carries the skewed time


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_fork_after_an_erasure_is_kept_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """The user was erased, then wrote again: a fork of what they wrote since is no erased data."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
    with eraser(nats_server.url, skew) as other:
        other.erase_user(TENANT, USER, by="ops")
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY, turns=2)
        forked = memory.fork(KEY, to=FORK)
        assert forked.events == 3
        assert len(memory.log.read(FORK)) == 3


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_a_restore_during_an_erasure_is_erased_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """The log lost the session (its snapshot stays); the restore has the snapshot and asked the
    journal (nothing then); the whole erasure of the user runs before it writes. What it writes is
    erased too, also when the eraser's receipt says it finished hours before the restore began."""
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
    with JetStreamBackend.connect(nats_server.url) as backend:
        backend.log.erase(KEY, at=1.0)  # lost (no erasure recorded): the snapshot stays
        assert backend.snapshots is not None
        assert backend.snapshots.load(KEY) is not None
    with convmem.connect(nats_server.url, config=CONFIG) as restorer, eraser(nats_server.url, skew) as other:
        read = restorer.log.read

        def erase_then_read(key: MemoryKey) -> object:
            if key == KEY:  # the restore has its snapshot and is about to read the log
                other.erase_user(TENANT, USER, by="ops")
            return read(key)

        restorer.log.read = erase_then_read  # type: ignore[method-assign]
        with pytest.raises(InvalidInput, match="erased while it was restored"):
            restorer.restore_lost(KEY)
        restorer.log.read = read  # type: ignore[method-assign]
        assert restorer.log.read(KEY) == []
        assert restorer.snapshots is not None
        assert restorer.snapshots.load(KEY) is None


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_an_export_written_during_an_erasure_loses_its_lines_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    skew: float,
) -> None:
    """`convmem export -o FILE` has read the user's events and written the file; the whole erasure of
    the user runs before the export records the file (so the erasure cannot rewrite it): the export
    rewrites it without the user, also when the eraser's receipt says it finished hours before."""
    monkeypatch.setenv("CONVMEM_EXPORTS", str(tmp_path / "exports.json"))
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY)
        memory.session(KEPT).add_turn(ConversationTurn(user_message=KEPT_TEXT, assistant_response="ok"))
    out = tmp_path / "acme.jsonl"
    record = FileExportRegistry.record

    def erase_then_record(self: FileExportRegistry, path: Path, keys: Iterable[MemoryKey]) -> None:
        with eraser(nats_server.url, skew) as other:
            other.erase_user(TENANT, USER, by="ops")
        record(self, path, keys)

    monkeypatch.setattr(FileExportRegistry, "record", erase_then_record)
    assert main(["-s", nats_server.url, "export", "--tenant", TENANT, "-o", str(out)]) == 0
    capsys.readouterr()
    assert KEPT_TEXT.encode() in out.read_bytes()
    assert SECRET.encode() not in out.read_bytes()


def lose(url: str, key: MemoryKey) -> None:
    """The log loses the session (no erasure recorded): its snapshot stays, as a crash leaves it."""
    with JetStreamBackend.connect(url) as backend:
        backend.log.erase(key, at=1.0)
        assert backend.snapshots is not None
        assert backend.snapshots.load(key) is not None


@pytest.mark.parametrize(
    "skew", [-HOURS, 0.0, HOURS], ids=["eraser 3h behind", "same clock", "eraser 3h ahead"]
)
def test_a_lost_session_begun_after_an_erasure_is_restored_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """The user was erased, then wrote again; the log lost the new session, its snapshot stays. It is
    no erased data: a load says it is lost (the snapshot kept, not deleted) and a restore writes it
    back, also when the eraser's receipt says it finished hours after the new turns were written."""
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        write(memory, KEY, turns=4)  # more events than the new session has: its seqs are below theirs
    with eraser(nats_server.url, skew) as other:
        other.erase_user(TENANT, USER, by="ops")
        (receipt,) = [r for r in other.journal.receipts() if r.covers(KEY)]
        assert receipt.log_position is not None
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
        assert memory.snapshots is not None
        snapshot = memory.snapshots.load(KEY)
        assert snapshot is not None
        assert snapshot.position > receipt.log_position
    lose(nats_server.url, KEY)
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        with pytest.raises(SessionLost):
            memory.session(KEY).get_llm_context()
        assert memory.snapshots is not None
        assert memory.snapshots.load(KEY) is not None
        assert memory.restore_lost(KEY).turns == 2  # the snapshot's (seq 3: the start and two turns)
        turns = memory.session(KEY).get_llm_context()["conversation_memory"]["recent_turns"]
        assert [t["user"] for t in turns] == [f"{SECRET} #{n}" for n in range(2)]


@pytest.mark.parametrize(
    "skew", [-HOURS, 0.0, HOURS], ids=["eraser 3h behind", "same clock", "eraser 3h ahead"]
)
def test_a_snapshot_of_erased_turns_saved_after_the_erasure_is_deleted_whatever_the_erasers_clock_says(
    nats_server: EmbeddedNatsServer, skew: float
) -> None:
    """A stale process saves the session's snapshot once the erasure is done (its snapshot step found
    nothing then). It holds erased turns: a restore refuses it and deletes it, also when the eraser's
    receipt says it finished hours before those turns were written; a load deletes it too."""
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
        assert memory.snapshots is not None
        stale = memory.snapshots.load(KEY)
        assert stale is not None
        assert stale.position > 0
    with eraser(nats_server.url, skew) as other:
        other.erase_user(TENANT, USER, by="ops")
    for ask in ("restore", "load"):
        with JetStreamBackend.connect(nats_server.url) as backend:
            assert backend.snapshots is not None
            assert backend.snapshots.load(KEY) is None  # the erasure deleted it
            backend.snapshots.save(stale)  # the stale process's save, after the erasure
        with convmem.connect(nats_server.url, config=CONFIG) as memory:
            if ask == "restore":
                with pytest.raises(InvalidInput, match="was erased"):
                    memory.restore_lost(KEY)
            else:
                assert memory.session(KEY).get_llm_context()["conversation_memory"]["recent_turns"] == []
            assert memory.snapshots is not None
            assert memory.snapshots.load(KEY) is None
            assert memory.log.read(KEY) == []


def old_receipts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Erasures from here on keep receipts as a version before positions did: no `log_position`."""
    monkeypatch.setattr("convmem.actors._eraser.log_position", lambda log: None)


def test_a_receipt_written_before_positions_were_recorded_still_reads_and_is_weighed_by_time(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receipt without `log_position` (an older version's) and a snapshot without `position` (saved
    before it was recorded) read as before and are weighed by time (clocks in step here): a session
    begun after the erasure is restored; a stale snapshot of erased turns is deleted."""
    receipt = receipt_of(KEY)
    old = msgspec.msgpack.encode(
        {k: v for k, v in msgspec.structs.asdict(receipt).items() if k != "log_position"}
    )
    assert msgspec.msgpack.decode(old, type=ErasureReceipt).log_position is None  # older bytes read
    assert msgspec.msgpack.encode(msgspec.structs.replace(receipt, log_position=None)) == old
    old_snapshot = {"key": KEY, "seq": 1, "state_hash": "h", "data": b"", "event_id": "e"}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old_snapshot), type=Snapshot).position == 0
    old_receipts(monkeypatch)
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2) as memory:
        write(memory, KEY)
        assert memory.snapshots is not None
        stale = memory.snapshots.load(KEY)
        assert stale is not None
    with eraser(nats_server.url, 0.0) as other:
        other.erase_user(TENANT, USER, by="ops")
        assert [r.log_position for r in other.journal.receipts() if r.covers(KEY)] == [None]
    with JetStreamBackend.connect(nats_server.url) as backend:
        assert backend.snapshots is not None
        backend.snapshots.save(stale)  # a stale process's save, after the erasure: erased turns
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        with pytest.raises(InvalidInput, match="was erased"):
            memory.restore_lost(KEY)
        assert memory.snapshots is not None
        assert memory.snapshots.load(KEY) is None
    later = ManualClock(time.time() + 1.0)  # the new turns are written after the receipt's end, by this clock
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=2, clock=later) as memory:
        write(memory, KEY)
    lose(nats_server.url, KEY)
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        assert memory.restore_lost(KEY).turns == 2


def receipt_of(key: MemoryKey) -> ErasureReceipt:
    request = ErasureRequest.of(key.tenant_id, key.user_id, None, by="ops", at=1.0)
    return request.receipt(completed_at=2.0, sessions=1, events_purged=3, log_position=7)


@pytest.mark.parametrize("skew", [-HOURS, HOURS], ids=["eraser 3h behind", "eraser 3h ahead"])
def test_the_in_memory_backend_weighs_a_lost_sessions_snapshot_by_position_too(skew: float) -> None:
    """The same contract on the in-memory log: a session begun after an erasure is restored, a stale
    snapshot of erased turns is refused and deleted, whatever the eraser's clock says."""
    log, snapshots = InMemoryEventLog(), InMemorySnapshotStore()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, snapshot_every=2) as memory:
        write(memory, KEY)
        stale = snapshots.load(KEY)
        assert stale is not None
        assert stale.position > 0
        clock = ManualClock(time.time() + skew)
        with MemorySystem(CONFIG, log=log, snapshots=snapshots, clock=clock) as other:
            other.erase_user(TENANT, USER, by="ops")
        snapshots.save(stale)  # a stale process's save, after the erasure
        with pytest.raises(InvalidInput, match="was erased"):
            memory.restore_lost(KEY)
        assert snapshots.load(KEY) is None
        write(memory, KEY)  # begun again after the erasure
        assert snapshots.load(KEY) is not None
    log.erase(KEY, at=1.0)  # lost (no erasure recorded; no system watching drops the snapshot)
    with MemorySystem(CONFIG, log=log, snapshots=snapshots) as memory:
        with pytest.raises(SessionLost):
            memory.session(KEY).get_llm_context()
        assert memory.restore_lost(KEY).turns == 2


def test_positions_of_a_stream_made_again_are_not_weighed_against_the_stream_before() -> None:
    """A receipt says the log stood at 5,000 after its events step. A copy whose last event is at or
    below that is erased data, whatever the clocks say; one above is not. A log lost and made again
    (`convmem repair --accept-loss`) numbers from 1 again: with the log now at 40, a copy at 30 is of
    the new stream, the receipt of the one before, so they are weighed by time; a copy above where
    the log stands is of the stream before, as the receipt is, and weighed by position. A receipt
    without a position (an older version's) is weighed by time."""
    journal = InMemoryErasureJournal()
    request = ErasureRequest.of(TENANT, USER, None, by="ops", at=1.0)
    journal.record(request)
    journal.complete(request.receipt(completed_at=2.0, sessions=1, events_purged=3, log_position=5000))
    old = ErasureRequest.of(TENANT, "ivy", None, by="ops", at=1.0)
    journal.record(old)
    journal.complete(old.receipt(completed_at=2.0, sessions=1, events_purged=3))
    ivy = MemoryKey(TENANT, "ivy", "chat-1")
    late, early = 3.0, 1.5  # the copy's last event's time, after or before the receipt's end

    def erased(key: MemoryKey, since: float, position: int, log_now: int | None) -> bool:
        return erasure_after(journal, key, since, position=position, log_now=log_now) is not None

    assert erased(KEY, late, 4999, 6000)  # below it: erased, though its clock says later
    assert erased(KEY, late, 5000, None)
    assert not erased(KEY, early, 5001, 6000)  # above it: written after, though its clock says before
    assert not erased(KEY, late, 30, 40)  # the new stream's copy, the old stream's receipt: by time
    assert erased(KEY, early, 30, 40)
    assert erased(KEY, late, 4000, 40)  # both of the stream before: by position
    assert not erased(KEY, early, 5001, 40)
    assert not erased(KEY, late, 0, 6000)  # a snapshot saved before positions: by time
    assert erased(KEY, early, 0, 6000)
    assert not erased(ivy, late, 10, 6000)  # a receipt without a position: by time
    assert erased(ivy, early, 10**9, 6000)


def test_a_snapshot_after_a_write_takes_its_position_from_the_writer_without_reading_the_session(
    nats_server: EmbeddedNatsServer,
) -> None:
    """A snapshot follows the write it covers: the writer kept that event's stream position from its
    acknowledgement, so a save finds it with no read of the session's tail (each save paid one); the
    position is the event's own, the one a read gives. When the session's last message is another
    event, the save reads it as before."""
    key = MemoryKey(TENANT, "ivy", "chat-positions")
    with convmem.connect(nats_server.url, config=CONFIG, snapshot_every=1) as memory:
        log = memory.log
        write(memory, key, turns=3)
        stored = [r for r in log.read(key) if r.seq is not None]
        last, before = stored[-1], stored[-2]
        snapshots = memory.snapshots
        assert snapshots is not None
        wait_until(lambda: getattr(snapshots.load(key), "seq", 0) == last.seq, message="the last save")
        snapshot = snapshots.load(key)
        assert snapshot is not None
        assert snapshot.position == last.position > 0

        read = log.read
        reads: list[MemoryKey] = []

        def counted(read_key: MemoryKey, **kwargs: object) -> object:
            reads.append(read_key)
            return read(read_key, **kwargs)  # type: ignore[arg-type]

        log.read = counted  # type: ignore[method-assign]
        assert last.event_id is not None
        assert last.seq is not None
        assert position_of(log, key, last.seq, last.event_id) == last.position
        assert reads == []  # known from the writer: no request
        assert before.seq is not None
        assert position_of(log, key, before.seq, before.event_id) == before.position
        assert reads == [key]  # not the session's last message: read
