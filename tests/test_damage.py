"""Damage is detected, reported and contained: byte flips inside a real nats-server's store files.

Each case writes a few sessions whose turns carry marker strings, stops the
server (cleanly, or with kill -9: a crash), flips one byte of a marker inside
the store's block files (found by searching for the marker, never at a fixed
offset), restarts it on the same folder, and checks that

* `convmem verify --all` exits 7 and names the damaged or missing seq;
* the damaged session raises `SessionDamaged` (never `ConcurrencyConflict`);
* every other session still reads and writes;
* `convmem repair` restores the session, recorded as a `SessionRepaired`,
  and verify passes again.

nats-server checks its own per-message hash when it loads a block: after a
clean stop it skips the damaged message (convmem sees a gap between intact
events, or messages the server counts but cannot serve); after a crash its
recovery drops the rest of the block (convmem sees a snapshot beyond the log,
or a session with a snapshot and no events). convmem's own checksum
(``Convmem-Sum``) is checked directly by publishing bytes whose checksum does
not match.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import convmem
from convmem.actors import ErasureRequest, MemorySystem, plan_repair, sweep_retention, verify
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, InMemorySnapshotStore, JetStreamBackend
from convmem.adapters.backends._checksum import seal
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._log import JetStreamEventLog
from convmem.adapters.backends.jetstream._snapshots import JetStreamSnapshotStore
from convmem.adapters.backends.keys._keyring import subject_of
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.service._errors import error_info, exception_of
from convmem.errors import ConcurrencyConflict, ConvmemError, SessionDamaged
from convmem.events import (
    ConversationTurn,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    SessionStarted,
    ShortTermMemoryConfig,
    TurnAdded,
    encode_event,
)

CONFIG = ShortTermMemoryConfig(strategy="truncation")
FIRST = MemoryKey("acme", "alice", "first")  # written before the damaged one: same block, earlier
HURT = MemoryKey("acme", "alice", "hurt")
LATER = MemoryKey("acme", "bob", "later")  # written after it: a crash's recovery drops it
TURNS = 3


def marker(key: MemoryKey, turn: int) -> str:
    return f"MARK-{key.session_id}-{turn}-"


def turn(key: MemoryKey, i: int) -> ConversationTurn:
    return ConversationTurn(user_message=f"{marker(key, i)} question", assistant_response=f"answer {i}")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "nats"


def seed(server: EmbeddedNatsServer, *, snapshot_every: int = 1000) -> None:
    """Three sessions of three turns (seqs 1-4 each), one after the other."""
    with convmem.connect(server.url, config=CONFIG, snapshot_every=snapshot_every) as memory:
        for key in (FIRST, HURT, LATER):
            session = memory.session(key)
            for i in range(TURNS):
                session.add_turn(turn(key, i), timeout=10)


def flip(store: Path, text: str, *, stream: str = "CONVMEM_EVENTS") -> None:
    """Flip one byte of `text` where it is stored in `stream`'s block files (exactly one place)."""
    found = []
    for block in sorted((store / "jetstream" / "$G" / "streams" / stream / "msgs").glob("*.blk")):
        data = bytearray(block.read_bytes())
        at = data.find(text.encode())
        if at >= 0:
            found.append((block, data, at))
    assert len(found) == 1, f"{text!r} is stored in {len(found)} blocks of {stream}"
    block, data, at = found[0]
    assert data.find(text.encode(), at + 1) < 0, f"{text!r} is stored twice in {block}"
    data[at + len(text) // 2] ^= 0x20
    block.write_bytes(bytes(data))


def cli(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str]:
    code = main(["--nats", url, *argv])
    out, err = capsys.readouterr()
    return code, out + err


def assert_usable(memory: MemorySystem, key: MemoryKey, turns: int) -> None:
    """The session reads its turns and takes a new one."""
    session = memory.session(key)
    assert len(session.get_llm_context()["conversation_memory"]["recent_turns"]) == min(turns, 5)
    session.add_turn(ConversationTurn(user_message="after the damage", assistant_response="ok"), timeout=10)


def _seed_then_flip(server: EmbeddedNatsServer, store: Path, turn: int, *, crash: bool) -> None:
    """`seed` with a snapshot after every event, stop the server (kill -9 when `crash`), flip a byte
    of HURT's turn `turn` in the block file, and start the server again on the damaged store."""
    seed(server, snapshot_every=1)
    if crash:
        server.kill()
    else:
        server.stop()
    flip(store, marker(HURT, turn))
    server.start()


def test_a_flipped_byte_in_a_turn_after_a_clean_stop_is_reported_contained_and_repaired(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = EmbeddedNatsServer(store).start()
    try:
        seed(server)
        server.stop()
        flip(store, marker(HURT, 1))  # HURT's second turn: seq 3
        server.start()
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 7, out
        assert "acme:alice:hurt: DAMAGED seq 3: event seq 3 missing" in out
        assert "missing" in out
        assert out.count("DAMAGED") == 2
        assert "2/3 sessions verified" in out

        with convmem.connect(server.url, config=CONFIG) as memory:
            with pytest.raises(SessionDamaged) as caught:
                memory.session(HURT).add_turn(turn(HURT, 9), timeout=10)
            assert caught.value.seq == 3
            assert caught.value.key == HURT.composite()
            with pytest.raises(SessionDamaged):
                memory.session(HURT).get_llm_context()
            assert_usable(memory, FIRST, TURNS)
            assert_usable(memory, LATER, TURNS)

        code, out = cli(capsys, server.url, "replay", HURT.composite())
        assert code == 7  # the replay is shown, with the damage under it
        assert "acme:alice:hurt: DAMAGED seq 3: event seq 3 missing" in out
        code, listed, _ = json_of(capsys, server.url, "sessions")
        assert code == 7  # every session listed, the damaged one named as such
        assert {r["key"]: r["health"] for r in listed} == {
            FIRST.composite(): "healthy",
            HURT.composite(): "damaged",
            LATER.composite(): "healthy",
        }
        assert "damaged at seq 3" in next(r["problem"] for r in listed if r["health"] == "damaged")
        code, out = cli(capsys, server.url, "repair", "--dry-run", HURT.composite())
        assert code == 0, out
        assert "would repair" in out
        assert "up to seq 2" in out
        code, out = cli(
            capsys, server.url, "repair", "--tenant", "acme", "--user", "alice", "--session", "hurt", "--yes"
        )
        assert code == 0, out
        assert "repaired session acme:alice:hurt" in out
        assert "the events up to seq 2" in out
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 0, out
        code, out = cli(capsys, server.url, "inspect", HURT.composite(), "--json")
        assert "session.repaired" in out
        with convmem.connect(server.url, config=CONFIG) as memory:
            assert_usable(memory, HURT, 1)  # cut at seq 2: the first turn; seq 4 is not trusted
    finally:
        server.stop()


def test_damage_below_the_snapshot_refuses_every_write_not_only_the_first(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session activates from its snapshot (the tail after it is intact), but its log lost seq 2:
    the writer reads the whole subject and refuses each write (the fast path never takes it)."""
    server = EmbeddedNatsServer(store).start()
    try:
        _seed_then_flip(server, store, 0, crash=False)  # seq 2, below the snapshot at seq 4
        with convmem.connect(server.url, config=CONFIG) as memory:
            session = memory.session(HURT)
            assert len(session.get_llm_context()["conversation_memory"]["recent_turns"]) == TURNS
            for attempt in range(3):
                with pytest.raises(SessionDamaged) as caught:
                    session.add_turn(turn(HURT, 10 + attempt), timeout=10)
                assert caught.value.seq == 2
            assert_usable(memory, LATER, TURNS)
        code, out = cli(capsys, server.url, "repair", HURT.composite(), "--yes")
        assert code == 0, out
        assert "the snapshot up to seq 4" in out
        with convmem.connect(server.url, config=CONFIG) as memory:
            assert_usable(memory, HURT, TURNS)
    finally:
        server.stop()


def test_a_session_whose_only_event_is_damaged_is_still_named(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing of the session can be read back, and it has no snapshot: the store's count names it."""
    server = EmbeddedNatsServer(store).start()
    try:
        with convmem.connect(server.url, config=CONFIG) as memory:
            memory.session(FIRST).add_turn(turn(FIRST, 0), timeout=10)
            started = SessionStarted(
                seq=1, event_id="only/1", at=1.0, key=HURT, config=CONFIG, injected_summary="ONLY-MARKER"
            )
            memory.log.append(HURT, [started], expected_seq=0)
        server.stop()
        flip(store, "ONLY-MARKER")
        server.start()
        code, out = cli(capsys, server.url, "verify", "--all", "--json")
        assert code == 7, out
        checks = {c["key"]: c for c in json.loads(out)["checks"]}
        assert [d["seq"] for d in checks[HURT.composite()]["damage"]] == [1]
        assert checks[FIRST.composite()]["ok"]
        with convmem.connect(server.url, config=CONFIG) as memory:
            with pytest.raises(SessionDamaged) as caught:
                memory.session(HURT).get_llm_context()
            assert caught.value.seq == 1
    finally:
        server.stop()


def test_a_damaged_last_event_is_damage_not_a_conflict(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the session's last message cannot be read back, its snapshot covers it.

    Every write used to fail with ConcurrencyConflict; now it is SessionDamaged naming seq 4, and a
    repair restores the snapshot (which holds the damaged turn).
    """
    server = EmbeddedNatsServer(store).start()
    try:
        _seed_then_flip(server, store, 2, crash=False)  # HURT's last turn, seq 4
        with convmem.connect(server.url, config=CONFIG) as memory:
            with pytest.raises(SessionDamaged) as caught:
                memory.session(HURT).add_turn(turn(HURT, 9), timeout=10)
            assert not isinstance(caught.value, ConcurrencyConflict)
            assert caught.value.seq == 4, caught.value
            assert_usable(memory, LATER, TURNS)
        code, out = cli(capsys, server.url, "verify", HURT.composite(), "--json")
        assert code == 7
        (check,) = json.loads(out)["checks"]
        assert [d["seq"] for d in check["damage"]] == [4]
        code, out = cli(capsys, server.url, "repair", HURT.composite(), "--yes", "--json")
        assert code == 0, out
        done = json.loads(out)
        assert done["method"] == "snapshot"
        assert done["restored_seq"] == 4
        assert done["applied"]
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 0, out
        with convmem.connect(server.url, config=CONFIG) as memory:
            recent = memory.session(HURT).get_llm_context()["conversation_memory"]["recent_turns"]
            assert marker(HURT, 2) in json.dumps(recent)  # the snapshot kept the damaged turn
            assert_usable(memory, HURT, TURNS)
    finally:
        server.stop()


def test_a_flip_before_a_crash_loses_the_block_tail_and_verify_names_what_is_missing(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = EmbeddedNatsServer(store).start()
    try:
        _seed_then_flip(server, store, 1, crash=True)  # recovery drops the block from it on
        code, out = cli(capsys, server.url, "verify", "--all", "--json")
        assert code == 7, out
        checks = {c["key"]: c for c in json.loads(out)["checks"]}
        assert checks[FIRST.composite()]["ok"]
        assert [d["seq"] for d in checks[HURT.composite()]["damage"]] == [3]
        assert "seqs 3-4 missing" in checks[HURT.composite()]["damage"][0]["problem"]
        assert [d["seq"] for d in checks[LATER.composite()]["damage"]] == [1]  # every event gone
        for key in (HURT, LATER):
            code, out = cli(capsys, server.url, "repair", key.composite(), "--yes")
            assert code == 0, out
            assert "the snapshot" in out
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 0, out
        with convmem.connect(server.url, config=CONFIG) as memory:
            assert_usable(memory, FIRST, TURNS)
            assert_usable(memory, HURT, TURNS)  # restored from its snapshot: every turn
            assert_usable(memory, LATER, TURNS)
    finally:
        server.stop()


def json_of(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, object, str]:
    """A command's exit code, its JSON on stdout, and its stderr."""
    code = main(["--nats", url, *argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def assert_listed_as_lost(capsys: pytest.CaptureFixture[str], url: str) -> None:
    """`sessions` lists HURT (its tail lost) and LATER (known only by its snapshot) as lost, and why."""
    code, listed, _ = json_of(capsys, url, "sessions")
    assert code == 7
    rows_by_key = {r["key"]: r for r in listed}
    assert list(rows_by_key) == [FIRST.composite(), HURT.composite(), LATER.composite()]
    assert rows_by_key[FIRST.composite()]["health"] == "healthy"
    assert rows_by_key[FIRST.composite()]["problem"] is None
    for key, log_seq in ((HURT, 2), (LATER, 0)):
        row = rows_by_key[key.composite()]
        assert row["health"] == "lost"
        assert f"its snapshot covers seq 4, the log has seq {log_seq}" in row["problem"]
    code, out = cli(capsys, url, "sessions", "--tenant", "acme", "--user", "bob")
    assert code == 7, out
    assert "acme:bob:later: LOST: session acme:bob:later is lost from the log" in out


def test_a_session_the_log_lost_is_named_by_replay_inspect_timeline_and_sessions(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash's recovery drops HURT's tail (seqs 3-4, which its snapshot covers) and every event of
    LATER (its snapshot remains): the auditor's views name that loss as verify does and exit 7; a
    session known only by its snapshot is listed; after the repairs each exits 0 again."""
    server = EmbeddedNatsServer(store).start()
    try:
        _seed_then_flip(server, store, 1, crash=True)  # recovery drops the block from it on
        code, replayed, _ = json_of(capsys, server.url, "replay", HURT.composite())
        assert code == 7
        assert (replayed["seq"], replayed["health"]) == (2, "damaged")
        (lost,) = replayed["damage"]
        assert lost["seq"] == 3
        assert "seqs 3-4 missing: the snapshot at seq 4 covers them" in lost["problem"]
        code, out = cli(capsys, server.url, "replay", LATER.composite())
        assert code == 7, out  # not "no events" (exit 3): its events are lost, not absent
        assert "acme:bob:later: DAMAGED seq 1: event seqs 1-4 missing" in out

        code, out = cli(capsys, server.url, "inspect", HURT.composite())
        assert code == 7, out
        assert "acme:alice:hurt: DAMAGED seq 3: event seqs 3-4 missing" in out
        code, rows, err = json_of(capsys, server.url, "inspect", LATER.composite())
        assert (code, rows) == (7, [])
        assert "acme:bob:later: DAMAGED seq 1" in err
        page = tmp_path / "hurt.html"
        code, out = cli(capsys, server.url, "timeline", HURT.composite(), "-o", str(page))
        assert code == 7, out
        assert page.is_file()
        assert "acme:alice:hurt: DAMAGED seq 3" in out
        code, out = cli(capsys, server.url, "timeline", LATER.composite(), "-o", str(tmp_path / "later.html"))
        assert code == 7, out
        assert "acme:bob:later: DAMAGED seq 1" in out
        assert not (tmp_path / "later.html").exists()

        assert_listed_as_lost(capsys, server.url)
        for key in (HURT, LATER):
            code, out = cli(capsys, server.url, "repair", key.composite(), "--yes")
            assert code == 0, out
        for argv in (
            ["replay", HURT.composite()],
            ["replay", LATER.composite()],
            ["inspect", LATER.composite()],
            ["timeline", LATER.composite(), "-o", str(tmp_path / "later.html")],
            ["sessions"],
        ):
            code, out = cli(capsys, server.url, *argv)
            assert code == 0, (argv, out)
            assert "DAMAGED" not in out
    finally:
        server.stop()


def test_a_damaged_data_key_file_is_named_with_its_sessions_and_the_others_are_still_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Encryption on: alice's data key file is cut to 10 bytes. verify, sessions, replay and inspect
    name her sessions and the key's file, and exit 7; bob's session is still verified and listed.
    Without the master key (no session's fault) a read is still exit 5, not damage."""
    data = tmp_path / "data"
    alice = (MemoryKey("acme", "alice", "one"), MemoryKey("acme", "alice", "two"))
    bob = MemoryKey("acme", "bob", "three")
    with convmem.connect(data_dir=data, config=CONFIG, snapshot_every=2) as memory:
        for key in (*alice, bob):
            for i in range(TURNS):
                memory.session(key).add_turn(turn(key, i), timeout=10)
    (key_id,) = [p.name for p in (data / "keys" / "subjects" / subject_of("acme", "alice")).iterdir()]
    key_file = data / "keys" / "keys" / key_id
    key_file.write_bytes(key_file.read_bytes()[:10])
    where = ["--data-dir", str(data)]

    code = main([*where, "verify", "--all", "--json"])
    out, err = capsys.readouterr()
    assert code == 7, err
    checks = {c["key"]: c for c in json.loads(out)["checks"]}
    assert list(checks) == [alice[0].composite(), alice[1].composite(), bob.composite()]
    assert checks[bob.composite()]["ok"]
    assert checks[bob.composite()]["events"] == TURNS + 1
    for key in alice:
        (damage,) = checks[key.composite()]["damage"]
        assert key_id in damage["problem"]
        assert str(data / "keys") in damage["problem"]
    code = main([*where, "sessions", "--json"])
    out, err = capsys.readouterr()
    assert code == 7, err
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows[bob.composite()]["health"] == "healthy"
    assert rows[bob.composite()]["turns"] == TURNS
    for key in alice:
        assert rows[key.composite()]["health"] == "damaged"
        assert key_id in rows[key.composite()]["problem"]
    for command in ("replay", "inspect"):
        code = main([*where, command, alice[0].composite()])
        err = capsys.readouterr().err
        assert code == 7, err
        assert f"acme:alice:one: DAMAGED: data key: key store {data / 'keys'}" in err
        assert key_id in err
        assert main([*where, command, bob.composite()]) == 0
        capsys.readouterr()
    exported = tmp_path / "acme.jsonl"
    code = main([*where, "export", "--tenant", "acme", "-o", str(exported)])
    err = capsys.readouterr().err
    assert code == 7, err  # bob's events are written, alice's sessions named with the key's file
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert {MemoryKey(**line["key"]) for line in lines} == {bob}
    assert len(lines) == TURNS + 1
    for key in alice:
        assert f"{key.composite()}: DAMAGED: data key:" in err
    assert key_id in err

    (data / "master.key").rename(tmp_path / "master.key")  # every sealed event lacks its key now
    for argv in (["verify", "--all"], ["sessions"], ["replay", bob.composite()]):
        code = main([*where, *argv])
        err = capsys.readouterr().err
        assert code == 5, (argv, err)
        assert "master key" in err


@pytest.mark.parametrize(
    ("part_bytes", "reported"),
    [(200, "snapshot: part"), (None, "snapshot: the snapshot is stored")],
    ids=["in-parts", "whole"],
)
def test_a_flipped_snapshot_part_is_reported_and_the_session_still_loads(
    store: Path, capsys: pytest.CaptureFixture[str], part_bytes: int | None, reported: str
) -> None:
    server = EmbeddedNatsServer(store).start()
    try:
        connection = NatsConnection.connect(server.url)
        log = JetStreamEventLog(connection)
        snapshots = JetStreamSnapshotStore(connection, part_bytes=part_bytes)  # 200: several parts
        connection.release()
        with MemorySystem(CONFIG, log=log, snapshots=snapshots, snapshot_every=1) as memory:
            for i in range(TURNS):
                memory.session(HURT).add_turn(turn(HURT, i), timeout=10)
        assert snapshots.load(HURT) is not None
        assert snapshots.check(HURT) is None
        log.close()
        snapshots.close()
        server.stop()
        flip(store, marker(HURT, 1), stream="KV_CONVMEM_SNAPSHOTS")
        server.start()
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 7, out
        assert f"acme:alice:hurt: DAMAGED: {reported}" in out
        assert "cannot read it back" in out
        with convmem.connect(server.url, config=CONFIG) as memory:
            assert_usable(memory, HURT, TURNS)  # a lost snapshot costs a longer replay, nothing else
        code, out = cli(capsys, server.url, "repair", HURT.composite(), "--yes")
        assert code == 0, out
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 0, out
    finally:
        server.stop()


@pytest.fixture(params=["jetstream", "memory"])
def log_and_snapshots(
    request: pytest.FixtureRequest, nats_server: EmbeddedNatsServer
) -> Iterator[tuple[JetStreamEventLog | InMemoryEventLog, object]]:
    if request.param == "memory":
        yield InMemoryEventLog(), InMemorySnapshotStore()
        return
    log = JetStreamEventLog.connect(nats_server.url)
    try:
        yield log, None
    finally:
        log.close()


def test_bytes_that_fail_their_checksum_are_damage_named_by_position(
    log_and_snapshots: tuple[JetStreamEventLog | InMemoryEventLog, object],
) -> None:
    log, _ = log_and_snapshots
    started = SessionStarted(seq=1, event_id="s/1", at=1.0, key=HURT, config=CONFIG)
    first = SessionStarted(seq=1, event_id="f/1", at=1.0, key=FIRST, config=CONFIG)
    log.append(FIRST, [first], expected_seq=0)
    log.append(HURT, [started], expected_seq=0)
    event = TurnAdded(seq=2, event_id="s/2", at=2.0, index=1, turn=turn(HURT, 0))
    data = encode_event(event)
    checksum = seal(2, event.event_id, data)
    bad = bytearray(data)
    bad[data.find(b"MARK") + 2] ^= 0x20
    position = log.append_raw(HURT, bytes(bad), seq=2, checksum=checksum, event_id=event.event_id)
    (record,) = [r for r in log.read(HURT) if r.seq == 2]
    assert record.damage is not None
    assert "checksum does not match" in record.damage
    assert not record.intact
    assert all(r.intact for r in log.read(FIRST))
    with MemorySystem(CONFIG, log=log) as memory:
        with pytest.raises(SessionDamaged) as caught:
            memory.session(HURT).get_llm_context()
        assert caught.value.position == position
        assert caught.value.seq == 2
        memory.session(FIRST).add_turn(turn(FIRST, 0), timeout=10)  # the batch read of others is intact
    checks = {c.key: c for c in verify(log)}
    assert checks[FIRST].ok
    assert [d.position for d in checks[HURT].damage] == [position]
    swept = sweep_retention(log, RetentionPolicies(default=RetentionPolicy(idle=1.0)), now=1e11, dry_run=True)
    assert [p.key for p in swept.problems] == [HURT]  # a damaged session is left for its repair
    assert "damaged: seq 2" in swept.problems[0].problem
    assert FIRST in [o.key for o in swept.outcomes]
    copy = MemoryKey("acme", "alice", "hurt-copy")
    with MemorySystem(CONFIG, log=log) as memory:
        with pytest.raises(SessionDamaged):
            memory.fork(HURT, to=copy)  # a fork must be exact
        plan = memory.repair(HURT)
        assert plan.applied
        assert plan.method == "cut"
        assert plan.restored_seq == 1
        memory.session(HURT).add_turn(turn(HURT, 1), timeout=10)
        memory.fork(HURT, to=copy)  # from the repaired state on
        context = memory.session(HURT).get_llm_context()
        assert memory.session(copy).get_llm_context() == context
        assert marker(HURT, 1) in json.dumps(context)
    assert all(c.ok for c in verify(log))


def test_events_stored_without_a_checksum_are_read_unchecked(
    log_and_snapshots: tuple[JetStreamEventLog | InMemoryEventLog, object],
) -> None:
    """Events written before convmem checksummed them: readable, not damage; a gap among them stays poison."""
    log, _ = log_and_snapshots
    started = SessionStarted(seq=1, event_id="s/1", at=1.0, key=HURT, config=CONFIG)
    log.append_raw(HURT, encode_event(started), seq=1, event_id=started.event_id)
    added = TurnAdded(seq=2, event_id="s/2", at=2.0, index=1, turn=turn(HURT, 0))
    log.append_raw(HURT, encode_event(added), seq=2, event_id=added.event_id)
    assert not any(r.intact or r.damage for r in log.read(HURT))
    with MemorySystem(CONFIG, log=log) as memory:
        assert_usable(memory, HURT, 1)
    assert all(c.ok for c in verify(log))


def test_damage_in_an_encrypted_store_is_found_in_the_ciphertext(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With encryption at rest (the embedded default) the checksum covers the sealed bytes.

    No turn text is on disk to search for: the byte to flip is found after the damaged event's
    subject and its ``Convmem-Seq: 3`` header, inside its sealed payload.
    """
    data = tmp_path / "data"
    with convmem.connect(data_dir=data, config=CONFIG) as memory:
        for key in (FIRST, HURT):
            for i in range(TURNS):
                memory.session(key).add_turn(turn(key, i), timeout=10)
    (block,) = (data / "jetstream" / "$G" / "streams" / "CONVMEM_EVENTS" / "msgs").glob("*.blk")
    raw = bytearray(block.read_bytes())
    assert marker(HURT, 1).encode() not in raw  # sealed: no turn text on disk
    subject = b"convmem.ev.acme.alice.hurt"
    starts = [n for n in range(len(raw)) if raw.startswith(subject, n)]
    (header,) = [n for n in starts if b"Convmem-Seq: 3\r\n" in raw[n : raw.index(b"\r\n\r\n", n)]]
    payload = raw.index(b"\r\n\r\n", header) + 4
    raw[payload + 20] ^= 0x01
    block.write_bytes(bytes(raw))
    code = main(["--data-dir", str(data), "verify", "--all"])
    out = capsys.readouterr().out
    assert code == 7, out
    assert "acme:alice:hurt: DAMAGED seq 3" in out
    with convmem.connect(data_dir=data, config=CONFIG) as memory:
        with pytest.raises(SessionDamaged):
            memory.session(HURT).add_turn(turn(HURT, 9), timeout=10)
        assert_usable(memory, FIRST, TURNS)
        assert memory.repair(HURT).applied
        assert_usable(memory, HURT, 1)
    code = main(["--data-dir", str(data), "verify", "--all"])
    assert code == 0, capsys.readouterr().out


def test_session_damaged_crosses_the_service_with_its_fields() -> None:
    """A remote caller catches the same `SessionDamaged`, naming the same key, seq and position."""
    sent = SessionDamaged(key=HURT.composite(), seq=3, position=7, problem="event seq 3 missing")
    got = exception_of(error_info(sent))
    assert isinstance(got, SessionDamaged)
    assert (got.key, got.seq, got.position, got.problem, str(got)) == (
        sent.key,
        3,
        7,
        "event seq 3 missing",
        str(sent),
    )


def test_a_snapshot_left_by_an_erasure_under_way_is_not_damage() -> None:
    """Events gone, snapshot kept: damage only when no erasure of the session is recorded."""
    log, snapshots = InMemoryEventLog(), InMemorySnapshotStore()
    with MemorySystem(CONFIG, log=log, snapshots=snapshots, snapshot_every=1) as memory:
        for key in (HURT, LATER):
            memory.session(key).add_turn(turn(key, 0), timeout=10)
    for key in (HURT, LATER):  # the log loses both sessions' events; their snapshots stay
        log.erase(key, at=2.0)
    log.erasure_journal().record(ErasureRequest.of("acme", "bob", "later", by="ops", at=2.0))
    checks = {c.key: c for c in verify(log, snapshots)}
    assert [d.seq for d in checks[HURT].damage] == [1]  # lost, and nothing erased it
    assert checks[LATER].ok  # an erasure under way: its status shows it, not verify
    plan, _ = plan_repair(log, snapshots, LATER)
    assert not plan.needed


def test_a_pending_erasure_whose_record_is_damaged_on_disk_is_reported_never_forgotten(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 right after an erasure's `record`; one byte of the record flipped on disk (the server counts
    it, cannot serve it): erase --resume, pending_erasures and verify --all name it (exit 7) instead of
    finding nothing pending; erasing the scope again with --settle ends it."""
    server = EmbeddedNatsServer(store).start()
    try:
        seed(server)
        worker = Path(__file__).with_name("erase_worker.py")
        done = subprocess.run(
            [sys.executable, str(worker), server.url, "acme", "alice", "record"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == -9, done.stderr
        with JetStreamBackend.connect(server.url, read_only=True) as reader:
            assert reader.journal is not None
            (pending,) = reader.journal.pending()
        server.stop()
        flip(store, pending.user_id, stream="KV_CONVMEM_EVENTS_ERASURES")
        server.start()
        record = f"pending.{pending.id}"

        code, out = cli(capsys, server.url, "erase", "--resume")
        assert code == 7, out
        assert record in out
        assert "no pending erasure" not in out
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 7, out
        assert f"erasure journal: DAMAGED pending erasure {pending.id} (key {record}" in out
        with convmem.connect(server.url, config=CONFIG) as memory:
            with pytest.raises(ConvmemError, match=re.escape(record)):
                memory.pending_erasures()
            assert_usable(memory, FIRST, TURNS)  # not erased, and not silently: reported above

        code, out = cli(
            capsys,
            server.url,
            "erase",
            "--tenant",
            "acme",
            "--user",
            "alice",
            "--settle",
            pending.id,
            "--yes",
        )
        assert code == 0, out
        assert f"settled the damaged journal record of erasure {pending.id}" in out
        code, out = cli(capsys, server.url, "erase", "--resume")
        assert (code, out.strip()) == (0, "no pending erasure")
        code, out = cli(capsys, server.url, "verify", "--all")
        assert code == 0, out
        with convmem.connect(server.url, config=CONFIG) as memory:
            assert memory.pending_erasures() == []
            assert memory.log.keys(tenant_id="acme", user_id="alice") == []
            assert memory.log.keys() == [LATER]
    finally:
        server.stop()
