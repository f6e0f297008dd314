"""Journaled erasure: recorded before anything is deleted, finished after any crash, and never guessed.

A kill -9 after any step of an erase, then a restart or ``convmem erase
--resume``, leaves no byte of the erased text or ids in any file of the
store; a session whose events the log lost without an erasure record keeps
its snapshot and is reported lost, then restored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_scan import markers, scan

import convmem
from convmem.actors import (
    ERASURE_STEPS,
    ErasureJournal,
    ErasureReceipt,
    ErasureRequest,
    MemorySystem,
    Snapshot,
    find_erasure,
)
from convmem.adapters import (
    EmbeddedNatsServer,
    InMemoryErasureJournal,
    InMemoryEventLog,
    InMemorySnapshotStore,
    JetStreamBackend,
    JetStreamSnapshotStore,
)
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.frontends.cli import main
from convmem.errors import InvalidConfig, InvalidInput, LogUnavailable, SessionLost
from convmem.events import (
    ConversationTurn,
    MemoryBudget,
    MemoryKey,
    SessionRestored,
    ShortTermMemoryConfig,
    decode_event,
)
from convmem.projections import encode_state, state_hash

WORKER = Path(__file__).with_name("erase_worker.py")
CONFIG = ShortTermMemoryConfig(strategy="truncation", budget=MemoryBudget(full_zone_turns=3))
TENANT, USER = "acme", "erin.ZQXJ8@example.com"
SECRET = "erin's passport ZQXJ8-PASS"
KEPT = MemoryKey(TENANT, "frank.ZQXJ8-kept", "chat-kept")
KEPT_TEXT = "frank's note ZQXJ8-KEPT"
STEPS = [step.name for step in ERASURE_STEPS]


def user_key(n: int) -> MemoryKey:
    return MemoryKey(TENANT, USER, f"chat-ZQXJ8-{n}")


def write(memory: MemorySystem, key: MemoryKey, text: str, turns: int = 3) -> None:
    session = memory.session(key)
    for n in range(turns):
        session.add_turn(ConversationTurn(user_message=f"{text} #{n}", assistant_response="noted"))


# -- the journal's contract, on both backends --------------------------------------------------


@pytest.fixture(params=["memory", "jetstream"])
def journal(request: pytest.FixtureRequest) -> Iterator[ErasureJournal]:
    if request.param == "memory":
        yield InMemoryErasureJournal()
        return
    server: EmbeddedNatsServer = request.getfixturevalue("nats_server")
    with JetStreamBackend.connect(server.url) as backend:
        assert backend.journal is not None
        yield backend.journal


def test_a_recorded_erasure_is_pending_once_then_a_receipt_without_ids(journal: ErasureJournal) -> None:
    """record is idempotent; complete keeps one receipt that matches the erased sessions and no other."""
    request = ErasureRequest.of(TENANT, USER, None, by="ops-ann", at=100.0)
    journal.record(request)
    journal.record(request)
    assert journal.pending() == [request]
    assert find_erasure(journal, user_key(1)) == request
    assert find_erasure(journal, KEPT) is None
    receipt = request.receipt(completed_at=105.0, sessions=3, events_purged=12)
    journal.complete(receipt)
    journal.complete(request.receipt(completed_at=106.0, sessions=3, events_purged=12))
    assert journal.pending() == []
    assert journal.receipts() == [receipt]
    assert isinstance(find_erasure(journal, user_key(7)), ErasureReceipt)
    assert find_erasure(journal, KEPT) is None
    encoded = repr(receipt).encode()
    assert USER.encode() not in encoded
    assert b"ZQXJ8" not in encoded
    assert (receipt.by, receipt.requested_at, receipt.completed_at) == ("ops-ann", 100.0, 105.0)


def test_a_session_erasure_covers_that_session_only(journal: ErasureJournal) -> None:
    """A one-session erasure's receipt matches that key, not the user's other sessions."""
    request = ErasureRequest.of(TENANT, USER, "chat-ZQXJ8-1", by="", at=1.0)
    journal.record(request)
    journal.complete(request.receipt(completed_at=2.0, sessions=1, events_purged=3))
    assert find_erasure(journal, user_key(1)) is not None
    assert find_erasure(journal, user_key(2)) is None


def test_the_erased_user_cannot_be_the_one_named_as_asking() -> None:
    """`by` stays in clear in the receipt, so it may not be the erased user's id."""
    with pytest.raises(InvalidInput, match="by"):
        ErasureRequest.of(TENANT, USER, None, by=USER, at=1.0)


# -- the steps, in memory: a stop after each one, then a restart ---------------------------------


class Stop(Exception):
    """Stands for a crash in the in-memory runs (the process runs on)."""


class _UnreachableFor(InMemoryEventLog):
    """The in-memory log, whose erase of one user's sessions fails as an unreachable store would."""

    def __init__(self, user_id: str) -> None:
        super().__init__()
        self.user_id = user_id
        self.down = True

    def erase(self, key: MemoryKey, *, at: float) -> int:
        if self.down and key.user_id == self.user_id:
            raise LogUnavailable(f"the store of {key.user_id} did not answer")
        return super().erase(key, at=at)


def test_a_pending_erasure_that_cannot_finish_does_not_hold_back_the_ones_after_it() -> None:
    """Given two pending erasures, the older one's store unreachable, when a system finishes them,
    then the younger one is finished anyway, the older one's error is raised and it stays pending,
    and it is finished once its store answers."""
    log, journal = _UnreachableFor("erin-older"), InMemoryErasureJournal()
    older, younger = MemoryKey(TENANT, "erin-older", "c"), MemoryKey(TENANT, "erin-younger", "c")
    with MemorySystem(CONFIG, log=log, journal=journal) as memory:
        write(memory, older, SECRET)
        write(memory, younger, SECRET)
    journal.record(ErasureRequest.of(TENANT, "erin-older", None, by="ops", at=1.0))
    journal.record(ErasureRequest.of(TENANT, "erin-younger", None, by="ops", at=2.0))
    with MemorySystem(CONFIG, log=log, journal=journal) as memory:  # its start tries both
        assert log.read(younger) == []
        assert [r.user_id for r in memory.pending_erasures()] == ["erin-older"]
        with pytest.raises(LogUnavailable, match="erin-older"):
            memory.finish_erasures()
        log.down = False
        memory.finish_erasures()
        assert log.read(older) == []
        assert memory.pending_erasures() == []


@pytest.mark.parametrize("step", STEPS)
def test_a_restart_finishes_an_erasure_stopped_after_any_step(step: str) -> None:
    """Stopped right after `step`, the erasure is finished by the next system to start on the journal."""
    log, snapshots, journal = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()

    def stop(done: str) -> None:
        if done == step:
            raise Stop(done)

    setup = {"log": log, "snapshots": snapshots, "journal": journal, "snapshot_every": 2}
    with MemorySystem(CONFIG, erasure_hook=stop, **setup) as first:
        for n in range(3):
            write(first, user_key(n), SECRET)
        write(first, KEPT, KEPT_TEXT)
        with pytest.raises(Stop):
            first.erase_user(TENANT, USER, by="ops")
        if step != "complete":
            assert len(first.pending_erasures()) == 1
    with MemorySystem(CONFIG, **setup) as second:
        assert second.pending_erasures() == []
        assert log.keys(tenant_id=TENANT, user_id=USER) == []
        assert snapshots.keys(tenant_id=TENANT, user_id=USER) == []
        assert [r.by for r in journal.receipts()] == ["ops"]  # one receipt: what the last run found
        assert second.session(user_key(0)).get_llm_context()["conversation_memory"]["recent_turns"] == []
        assert KEPT_TEXT in str(second.session(KEPT).get_llm_context())


def test_sessions_left_with_a_snapshot_only_are_still_erased() -> None:
    """What the old erase missed: events purged, snapshots kept; erase_user finds them by their snapshots."""
    log, snapshots, journal = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal, snapshot_every=2) as memory:
        for n in range(3):
            write(memory, user_key(n), SECRET)
            memory.passivate(user_key(n))
        log.erase_user(TENANT, USER, at=1.0)  # the log alone, as a crash between the two left it
        assert len(snapshots.keys(tenant_id=TENANT, user_id=USER)) == 3
        erased = memory.erase_user(TENANT, USER)
    assert erased.sessions == 3
    assert snapshots.keys() == []


class LogWithoutJournal(InMemoryEventLog):
    """A log that keeps no erasure journal (as a log of another maker might)."""

    def erasure_journal(self) -> None:
        return None


def test_a_system_on_a_log_alone_records_its_erasures_in_the_logs_journal() -> None:
    """MemorySystem(log=...) without journal= uses the log's own: two systems on it share it."""
    log = InMemoryEventLog()
    with MemorySystem(CONFIG, log=log) as one, MemorySystem(CONFIG, log=log) as other:
        write(one, user_key(0), SECRET)
        one.erase(user_key(0), by="ops")
        assert other.erasure_record(user_key(0)) is not None
        assert one.journal is log.erasure_journal()


def test_erasing_without_a_journal_is_refused_before_anything_is_deleted() -> None:
    """A system on a log that keeps no journal cannot record an erasure, so it erases nothing."""
    log = LogWithoutJournal()
    with MemorySystem(CONFIG, log=log) as memory:
        write(memory, user_key(0), SECRET)
        with pytest.raises(InvalidConfig, match="journal"):
            memory.erase(user_key(0))
    assert log.keys() == [user_key(0)]


# -- lost sessions: kept, reported, restored -------------------------------------------------------


def lost_session() -> tuple[InMemoryEventLog, InMemorySnapshotStore, InMemoryErasureJournal]:
    """A session with a snapshot at seq 4 whose events the log lost (no erasure recorded)."""
    log, snapshots, journal = InMemoryEventLog(), InMemorySnapshotStore(), InMemoryErasureJournal()
    # snapshot_every=1: a snapshot at every seq, whatever the key's offset on the cadence
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal, snapshot_every=1) as memory:
        write(memory, user_key(0), SECRET, turns=3)
    assert snapshots.load(user_key(0)) is not None
    log.erase(user_key(0), at=1.0)  # what a crash that took a storage block does: no record
    return log, snapshots, journal


def test_a_session_lost_from_the_log_keeps_its_snapshot_and_is_reported() -> None:
    """Snapshot ahead of the log and no erasure record: SessionLost naming the key and the seq."""
    log, snapshots, journal = lost_session()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        with pytest.raises(SessionLost) as caught:
            memory.session(user_key(0)).get_llm_context()
        assert caught.value.key == user_key(0).composite()
        assert caught.value.snapshot_seq == 4
        assert caught.value.log_seq == 0
        assert "convmem restore" in str(caught.value)
    assert snapshots.load(user_key(0)) is not None


def test_a_lost_session_is_restored_from_its_snapshot_as_a_recorded_event() -> None:
    """restore_lost writes the snapshot back (SessionStarted + SessionRestored); the turns read again."""
    log, snapshots, journal = lost_session()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        restored = memory.restore_lost(user_key(0))
        assert (restored.snapshot_seq, restored.log_seq, restored.seq, restored.turns) == (4, 0, 2, 3)
        context = memory.session(user_key(0)).get_llm_context()
        shown = [t["user"] for t in context["conversation_memory"]["recent_turns"]]
        assert shown == [f"{SECRET} #{n}" for n in range(3)]
        events = [decode_event(r.data) for r in log.read(user_key(0))]
        assert isinstance(events[-1], SessionRestored)
        assert events[-1].origin == "lost-snapshot:seq 4"
        write(memory, user_key(0), "after the restore", turns=1)


def test_a_stale_snapshot_of_an_erased_session_is_deleted_only_with_a_record() -> None:
    """The same snapshot ahead of the log: deleted once an erasure of the session is recorded."""
    log, snapshots, journal = lost_session()
    later = 4e9  # the erasure finished after the snapshot's last event (written on the system clock)
    request = ErasureRequest.of(TENANT, USER, None, by="", at=later)
    journal.record(request)
    journal.complete(request.receipt(completed_at=later, sessions=1, events_purged=4))
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory:
        assert memory.session(user_key(0)).get_llm_context()["conversation_memory"]["recent_turns"] == []
    assert snapshots.load(user_key(0)) is None


def test_a_session_begun_after_an_erasure_is_lost_not_erased() -> None:
    """A receipt covers what was written before it finished: a later session's snapshot is kept."""
    log, snapshots, journal = lost_session()
    request = ErasureRequest.of(TENANT, USER, None, by="", at=1.0)
    journal.record(request)
    journal.complete(request.receipt(completed_at=2.0, sessions=1, events_purged=4))
    with (
        MemorySystem(CONFIG, log=log, snapshots=snapshots, journal=journal) as memory,
        pytest.raises(SessionLost),
    ):
        memory.session(user_key(0)).get_llm_context()
    assert snapshots.load(user_key(0)) is not None


# -- on a real nats-server: kill -9 at a step, resume, byte scan ---------------------------------


def seed(url: str, sessions: int) -> None:
    """`sessions` sessions of the user (each with a snapshot; one split into parts) and a kept one."""
    with convmem.connect(url, config=CONFIG, snapshot_every=2) as memory:
        for n in range(sessions):
            write(memory, user_key(n), f"{SECRET} s{n}")
        write(memory, KEPT, KEPT_TEXT)
        state = memory.session(user_key(0)).snapshot_state()
    connection = NatsConnection.connect(url)
    try:
        split = JetStreamSnapshotStore(connection, part_bytes=64)
    finally:
        connection.release()
    try:
        data = encode_state(state)
        split.save(Snapshot(key=user_key(0), seq=state.version + 1, state_hash=state_hash(state), data=data))
        assert len(data) > 64 * 3
        assert split.keys(tenant_id=TENANT, user_id=USER)
    finally:
        split.close()


def kill_after(url: str, step: str) -> None:
    """Run the eraser process; it kills itself (SIGKILL) right after `step`."""
    done = subprocess.run(
        [sys.executable, str(WORKER), url, TENANT, USER, step],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    assert done.stdout.strip() == f"KILLED-AFTER {step}"


def secrets(sessions: int) -> list[bytes]:
    needles: list[bytes] = [SECRET.encode()]
    for n in range(sessions):
        needles += markers(user_key(n), f"{SECRET} s{n}")
    return sorted(set(needles))


def check_erased_on_disk(server: EmbeddedNatsServer, store: Path, sessions: int) -> None:
    server.stop()
    assert scan(store, secrets(sessions)) == {}
    assert set(scan(store, markers(KEPT, KEPT_TEXT))) == set(markers(KEPT, KEPT_TEXT)), "the scan sees"


@pytest.mark.parametrize(
    ("step", "resume"),
    [("record", "restart"), ("events", "cli"), ("snapshots", "restart"), ("announce", "cli")],
)
def test_kill_9_after_a_step_then_resume_leaves_no_byte_on_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step: str, resume: str
) -> None:
    """kill -9 after `step` of erase_user; a restart (or erase --resume) finishes it; the store is clean."""
    store = tmp_path / "nats"
    sessions = 4
    with EmbeddedNatsServer(store) as server:
        seed(server.url, sessions)
        kill_after(server.url, step)
        with JetStreamBackend.connect(server.url, read_only=True) as reader:
            assert reader.journal is not None
            assert len(reader.journal.pending()) == 1
        if resume == "restart":
            with convmem.connect(server.url, config=CONFIG) as memory:
                assert memory.pending_erasures() == []
        else:
            assert main(["-s", server.url, "erase", "--resume", "--json"]) == 0
            assert json.loads(capsys.readouterr().out)["resumed"] == 1
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.log.keys(tenant_id=TENANT, user_id=USER) == []
            assert backend.snapshots.keys(tenant_id=TENANT, user_id=USER) == []
            assert backend.journal is not None
            assert [r.by for r in backend.journal.receipts()] == ["erase-worker"]
        check_erased_on_disk(server, store, sessions)


CHAOS_SCALE = max(1, int(os.environ.get("CONVMEM_CHAOS_SCALE", "1")))
MATRIX = (
    [(step, resume) for step in STEPS[:-1] for resume in ("restart", "cli")]
    if CHAOS_SCALE > 1
    else [("drop_live", "cli"), ("exports", "restart")]  # the steps the fast test leaves out
)


@pytest.mark.chaos
@pytest.mark.parametrize(("step", "resume"), MATRIX)
def test_kill_9_after_every_step_with_more_sessions(tmp_path: Path, step: str, resume: str) -> None:
    """At CONVMEM_CHAOS_SCALE above 1 the whole matrix (every step, both ways to resume) with 8 sessions
    per scale unit; at 1, the steps the fast test leaves out."""
    store = tmp_path / "nats"
    sessions = 8 * CHAOS_SCALE
    with EmbeddedNatsServer(store) as server:
        seed(server.url, sessions)
        kill_after(server.url, step)
        if resume == "restart":
            with convmem.connect(server.url, config=CONFIG) as memory:
                assert memory.pending_erasures() == []
        else:
            assert main(["-s", server.url, "erase", "--resume"]) == 0
        check_erased_on_disk(server, store, sessions)


def test_the_old_gap_erase_of_a_user_with_snapshots_only_is_not_nothing(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Events purged but snapshots left (the old crash): `convmem erase --user` finds and erases them."""
    seed(nats_server.url, 2)
    with JetStreamBackend.connect(nats_server.url) as backend:
        backend.log.erase_user(TENANT, USER, at=1.0)
    code = main(["-s", nats_server.url, "erase", "--tenant", TENANT, "--user", USER, "--yes", "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["sessions"] == 2
    with JetStreamBackend.connect(nats_server.url) as backend:
        assert backend.snapshots.keys(tenant_id=TENANT) == [KEPT]


def test_status_shows_pending_erasures_by_count_and_age_only(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pending erasure shows in `convmem status` as a count and an age, no id; status finishes nothing."""
    seed(nats_server.url, 1)
    kill_after(nats_server.url, "record")
    main(["-s", nats_server.url, "status", "--json", "--discover", "0.1"])
    out = capsys.readouterr().out
    erasures = json.loads(out)["erasures"]
    assert erasures["pending"] == 1
    assert erasures["oldest_age_s"] >= 0
    assert USER not in out
    assert "ZQXJ8" not in out
    with JetStreamBackend.connect(nats_server.url, read_only=True) as reader:
        assert reader.journal is not None
        assert len(reader.journal.pending()) == 1


# -- exports convmem wrote ---------------------------------------------------------------------


def test_an_erasure_rewrites_the_export_files_convmem_recorded(
    nats_server: EmbeddedNatsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`export -o` records its file; erasing a user drops their lines from it (a file of theirs alone
    goes); the registry holds no id in clear."""
    registry = tmp_path / "exports.json"
    monkeypatch.setenv("CONVMEM_EXPORTS", str(registry))
    seed(nats_server.url, 2)
    mixed, alone = tmp_path / "tenant.jsonl", tmp_path / "one-user.jsonl"
    # seed's split snapshot claims a seq past the log's last event: events the store lost, as verify
    # says, so each export names them and exits 7 (the files are written all the same)
    assert main(["-s", nats_server.url, "export", "--tenant", TENANT, "-o", str(mixed)]) == 7
    assert main(["-s", nats_server.url, "export", "--tenant", TENANT, "--user", USER, "-o", str(alone)]) == 7
    assert SECRET.encode() in mixed.read_bytes()
    assert USER.encode() not in registry.read_bytes()
    assert main(["-s", nats_server.url, "erase", "--tenant", TENANT, "--user", USER, "--yes"]) == 0
    capsys.readouterr()
    assert not alone.exists()
    left = mixed.read_bytes()
    assert SECRET.encode() not in left
    assert USER.encode() not in left
    assert KEPT_TEXT.encode() in left
    assert json.loads(registry.read_text())[0]["path"] == str(mixed.resolve())


def test_two_processes_finishing_one_erasure_at_once_agree(tmp_path: Path) -> None:
    """Two systems start together on a store with a pending erasure: both finish it, one receipt stays."""
    store = tmp_path / "nats"
    with EmbeddedNatsServer(store) as server:
        seed(server.url, 3)
        kill_after(server.url, "drop_live")
        failures: list[BaseException] = []

        def start() -> None:
            try:
                with convmem.connect(server.url, config=CONFIG) as memory:
                    assert memory.pending_erasures() == []
            except BaseException as exc:  # reported below, in the test's thread
                failures.append(exc)

        threads = [threading.Thread(target=start) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert failures == []
        with JetStreamBackend.connect(server.url) as backend:
            assert backend.journal is not None
            assert len(backend.journal.receipts()) == 1
            assert backend.log.keys(tenant_id=TENANT, user_id=USER) == []
        check_erased_on_disk(server, store, 3)


def test_convmem_restore_brings_a_lost_session_back(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The log loses a session (no erasure record): loading it is SessionLost; `convmem restore` writes
    the kept snapshot back, and the session reads its turns again."""
    seed(nats_server.url, 2)
    lost = user_key(1)
    with JetStreamBackend.connect(nats_server.url) as backend:
        backend.log.erase(lost, at=1.0)  # the log alone: what a crash that took a block does
    with convmem.connect(nats_server.url, config=CONFIG) as memory, pytest.raises(SessionLost):
        memory.session(lost).get_llm_context()
    assert main(["-s", nats_server.url, "restore", lost.composite(), "--yes", "--json"]) == 0
    restored = json.loads(capsys.readouterr().out)
    assert (restored["key"], restored["log_seq"], restored["turns"]) == (lost.composite(), 0, 3)
    with convmem.connect(nats_server.url, config=CONFIG) as memory:
        turns = memory.session(lost).get_llm_context()["conversation_memory"]["recent_turns"]
        assert [t["user"] for t in turns] == [f"{SECRET} s1 #{n}" for n in range(3)]
