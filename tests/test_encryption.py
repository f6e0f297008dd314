"""Encryption at rest on a real nats-server: no turn text on disk, crypto-shredding, rotation, bad keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest
from runtime_helpers import wait_until

from convmem import ConversationTurn, connect
from convmem.actors import MemorySystem, export_jsonl, replay_session, timeline, verify
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.backends._checksum import seal as crc
from convmem.adapters.backends.jetstream._read import fetch_subject
from convmem.adapters.backends.jetstream._sealing import SHREDDED
from convmem.adapters.backends.keys import (
    DirKeyStore,
    KeySettings,
    WrappedKey,
    generate_key_text,
    master_key_from_file,
    rotate_master_file,
    subject_of,
)
from convmem.adapters.frontends.cli import main
from convmem.errors import EncryptionKeyError, SealBroken, SessionDamaged
from convmem.events import (
    MemoryBudget,
    MemoryKey,
    SessionErased,
    ShortTermMemoryConfig,
    TurnAdded,
    decode_event,
)

SUMMARIZING = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=2))
ALICE = MemoryKey("acme", "alice", "chat-1")
BOB = MemoryKey("acme", "bob", "chat-1")
SECRET = "zebraquokka"


def _turn(n: int, who: str = "alice") -> ConversationTurn:
    return ConversationTurn(
        user_message=f"{SECRET} {who} message {n}", assistant_response=f"{SECRET} reply {n}"
    )


def _write(system: MemorySystem, key: MemoryKey, turns: int, first: int = 0) -> None:
    session = system.session(key)
    for n in range(first, first + turns):
        session.add_turn(_turn(n, key.user_id), timeout=10)


def _files_with(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _turn_texts(backend: JetStreamBackend, key: MemoryKey) -> list[str]:
    events = [decode_event(r.data) for r in backend.log.read(key)]
    return [e.turn.user_message for e in events if isinstance(e, TurnAdded)]


def test_store_files_hold_no_turn_text(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data, snapshot_every=2) as system:
        _write(system, ALICE, 5)
        assert [t.turn.user_message for t in system.load(ALICE)[0].turns][-1] == f"{SECRET} alice message 4"
        summarized = system.session(BOB, config=SUMMARIZING)  # summaries and agent items too
        for n in range(4):
            summarized.add_turn(_turn(n, "bob"), timeout=10)
        summarized.flush(timeout=30)
        assert SECRET in summarized.refresh(timeout=10).summary
        items = system.session(MemoryKey("acme", "carol", "agent"))
        items.add_items([{"role": "user", "content": f"{SECRET} carol item"}], timeout=10)
    assert (data / "master.key").is_file()
    assert (data / "keys").is_dir()
    assert _files_with(data / "jetstream", SECRET.encode()) == []
    assert _files_with(data / "keys", b"alice") == []  # the key store names no user (subjects still do)
    with connect(data_dir=data) as system:
        state, report = system.load(ALICE)
        assert report.snapshot_seq is not None
        assert not report.poison
        assert [t.turn.user_message for t in state.turns] == [f"{SECRET} alice message {n}" for n in range(5)]

    # The scan can fail: with encryption off the same text is on disk.
    plain = tmp_path / "plain"
    with connect(data_dir=plain, keys=KeySettings(encrypt=False)) as system:
        _write(system, ALICE, 1)
    assert _files_with(plain / "jetstream", SECRET.encode())


def test_a_copy_taken_before_an_erase_reads_as_erased_after_it(tmp_path: Path) -> None:
    data, copy = tmp_path / "data", tmp_path / "copy"
    with connect(data_dir=data, snapshot_every=2) as system:
        _write(system, ALICE, 4)
        _write(system, BOB, 2)
    shutil.copytree(data / "jetstream", copy / "jetstream")  # a backup of the event store, keys not in it

    with connect(data_dir=data) as system:
        system.erase_user("acme", "alice")

    # The old copy, opened with today's keys: alice's events are erased placeholders, bob's are intact.
    keys = KeySettings(master_key_file=str(data / "master.key"), key_store=str(data / "keys"))
    with JetStreamBackend.embedded(copy, keys=keys) as backend:
        records = backend.log.read(ALICE)
        assert len(records) == 5  # SessionStarted and four turns, still in the copy
        events = [decode_event(r.data) for r in records]
        assert all(isinstance(e, SessionErased) and e.reason == SHREDDED for e in events)
        state, report = replay_session(records, ALICE)
        assert state.turns == ()
        assert not report.poison
        assert backend.snapshots is not None
        assert backend.snapshots.load(ALICE) is None
        with MemorySystem(log=backend.log, snapshots=backend.snapshots) as system:
            assert system.load(ALICE)[0].turns == ()
        rows = timeline(backend.log.read_all(tenant_id="acme", user_id="alice"))
        assert {row.type for row in rows} == {"session.erased"}
        lines = [json.loads(line) for line in export_jsonl(backend.log.read(ALICE))]
        assert {line["event"]["type"] for line in lines} == {"session.erased"}
        assert all(check.ok for check in verify(backend.log, backend.snapshots, tenant_id="acme"))
        assert _turn_texts(backend, BOB) == [f"{SECRET} bob message {n}" for n in range(2)]
        assert SECRET not in "".join(export_jsonl(backend.log.read(ALICE)))


def test_rotations_keep_old_events_readable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2)
    before = master_key_from_file(data / "master.key").master_id

    master_id, rewrapped = rotate_master_file(data / "master.key", DirKeyStore(data / "keys"))
    assert master_id != before
    assert rewrapped == 1
    assert not (data / "master.key.new").exists()
    with connect(data_dir=data) as system:
        _write(system, ALICE, 1, first=2)
        new_id = system.log.keyring.new_data_key("acme", "alice")  # type: ignore[attr-defined]
        _write(system, ALICE, 1, first=3)
    with JetStreamBackend.embedded(data) as backend:
        assert _turn_texts(backend, ALICE) == [f"{SECRET} alice message {n}" for n in range(4)]
        last = backend.log.read(ALICE)[-1]
    stored = _raw_messages(data, ALICE)
    assert stored[-1][2:10].hex() == new_id  # the newest turn is sealed with the new data key
    assert stored[0][2:10].hex() != new_id  # the first ones still with the old one, and they open
    assert last.seq == 5


def _raw_messages(data: Path, key: MemoryKey) -> list[bytes]:
    """The stored (sealed) payloads of `key`, read without a keyring."""
    with JetStreamBackend.embedded(data, keys=KeySettings(encrypt=False)) as backend:
        subject = backend.log.subject(key)  # type: ignore[attr-defined]
        conn = backend.log._conn  # type: ignore[attr-defined]
        messages = conn.call(lambda: fetch_subject(conn, backend.log.stream, subject), what="read raw")  # type: ignore[attr-defined]
        return [m.data for m in messages]


def test_wrong_or_missing_master_key_is_a_typed_error_naming_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 1)

    wrong = tmp_path / "wrong.key"
    wrong.write_text(generate_key_text())
    with pytest.raises(EncryptionKeyError, match="is not the master key") as caught:
        JetStreamBackend.embedded(data, keys=KeySettings(master_key_file=str(wrong)))
    assert caught.value.source == f"master key file {wrong}"

    (data / "master.key").rename(tmp_path / "moved.key")
    with pytest.raises(EncryptionKeyError, match="does not exist") as caught:
        JetStreamBackend.embedded(data)  # never a new key over a store that has keys
    assert str(data / "master.key") in caught.value.source

    monkeypatch.setenv("CONVMEM_TEST_KEY", "not a key")
    with pytest.raises(EncryptionKeyError, match="not a master key") as caught:
        JetStreamBackend.embedded(data, keys=KeySettings(master_key_env="CONVMEM_TEST_KEY"))
    assert caught.value.source == "environment variable CONVMEM_TEST_KEY"

    with (
        JetStreamBackend.embedded(data, keys=KeySettings(encrypt=False)) as backend,
        pytest.raises(EncryptionKeyError, match="encrypted"),
    ):
        backend.log.read(ALICE)


def test_a_flipped_byte_is_damage_named_by_its_position(tmp_path: Path) -> None:
    """Sealed bytes that do not authenticate are damage even when their checksum was recomputed."""
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2)
    with JetStreamBackend.embedded(data) as backend:
        log = backend.log
        event = decode_event(log.read(ALICE)[-1].data)
        fourth = msgspec.structs.replace(event, seq=4, event_id="tampered-4")
        broken = bytearray(log._sealing.payloads(ALICE, [fourth])[0])  # type: ignore[attr-defined]
        broken[-5] ^= 0x01
        checksum = crc(4, "tampered-4", bytes(broken))  # a writer that recomputes the checksum
        position = log.append_raw(  # type: ignore[attr-defined]
            ALICE, bytes(broken), seq=4, checksum=checksum, event_id="tampered-4"
        )
        last = log.read(ALICE)[-1]
        assert last.position == position
        assert last.damage is not None
        assert "fail authentication" in last.damage
        with pytest.raises(SealBroken) as caught:
            decode_event(last.data, seq=last.position)
        assert caught.value.seq == position
        (check,) = verify(log, None, key=ALICE)
        assert [d.position for d in check.damage] == [position]
        with MemorySystem(log=log, snapshots=None) as system, pytest.raises(SessionDamaged) as damaged:
            system.load(ALICE)
        assert f"log position {position}" in str(damaged.value)


def test_a_log_written_plain_then_encrypted_reads_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data, keys=KeySettings(encrypt=False)) as system:
        _write(system, ALICE, 2)
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2, first=2)
        assert [t.turn.user_message for t in system.load(ALICE)[0].turns] == [
            f"{SECRET} alice message {n}" for n in range(4)
        ]
    stored = _raw_messages(data, ALICE)
    assert [m[:1] == b"\xc1" for m in stored] == [False] * 3 + [True] * 2


def test_keys_command_shows_rotates_and_erase_shreds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2)
    where = ["--data-dir", str(data)]

    def run(*argv: str) -> dict[str, object]:
        capsys.readouterr()
        assert main([*where, *argv, "--json"]) == 0
        found: dict[str, object] = json.loads(capsys.readouterr().out)
        return found

    status = run("keys", "status")
    assert status["data_keys"] == 1
    assert status["key_store"] == f"key store {data / 'keys'}"
    rotated = run("keys", "rotate")
    assert rotated["rewrapped"] == 1
    assert rotated["master_id"] != status["master_id"]
    assert run("keys", "rotate", "--data-keys")["data_keys_made"] == 1
    after = run("keys", "status")
    assert after["data_keys"] == 2
    assert after["data_keys_of_other_master_keys"] == 0
    with JetStreamBackend.embedded(data) as backend:
        assert _turn_texts(backend, ALICE) == [f"{SECRET} alice message {n}" for n in range(2)]

    assert run("erase", "--tenant", "acme", "--user", "alice", "--yes")["sessions"] == 1
    assert run("keys", "status")["data_keys"] == 0


def test_a_shared_server_keeps_keys_in_a_bucket_of_their_own(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVMEM_MASTER_KEY", generate_key_text())
    with connect(nats_server.url) as system:
        _write(system, ALICE, 1)
        _write(system, BOB, 1)
        keyring = system.log.keyring  # type: ignore[attr-defined]
        assert keyring is not None
        assert keyring.store.source == "key store NATS bucket CONVMEM_KEYS"
        assert len(list(keyring.store.all())) == 2
        system.erase_user("acme", "alice")
        assert len(list(keyring.store.all())) == 1
    assert _files_with(nats_server.store_dir / "jetstream", SECRET.encode()) == []
    monkeypatch.delenv("CONVMEM_MASTER_KEY")
    with JetStreamBackend.connect(nats_server.url) as backend:
        assert backend.keyring is None  # no key given: nothing sealed is opened, nothing is guessed
        with pytest.raises(EncryptionKeyError, match="without a master key"):
            backend.log.read(BOB)


def test_reads_make_no_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain, sealed = tmp_path / "plain", tmp_path / "sealed"
    with connect(data_dir=plain, keys=KeySettings(encrypt=False)) as system:
        _write(system, ALICE, 1)
    with connect(data_dir=sealed) as system:
        _write(system, ALICE, 1)
    for data in (plain, sealed):
        before = sorted(p.name for p in data.iterdir())
        assert main(["--data-dir", str(data), "verify", "--all"]) == 0
        assert main(["--data-dir", str(data), "export", "--key", "acme:alice:chat-1"]) == 0
        assert f"{SECRET} alice message 0" in capsys.readouterr().out
        assert sorted(p.name for p in data.iterdir()) == before  # no master.key or keys/ made by a read
    assert not (plain / "master.key").exists()


def test_another_process_drops_an_erased_users_key_and_makes_a_new_one(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVMEM_MASTER_KEY", generate_key_text())
    with connect(nats_server.url) as eraser, connect(nats_server.url) as holder:
        _write(holder, ALICE, 1)
        old = holder.log.keyring._sealers[("acme", "alice")][0]  # type: ignore[attr-defined]
        eraser.erase_user("acme", "alice")
        wait_until(lambda: not holder.is_live(ALICE), message="the holder hears of the erasure")
        _write(holder, ALICE, 1, first=5)  # a new session of the erased user, in the other process
        new = holder.log.keyring._sealers[("acme", "alice")][0]  # type: ignore[attr-defined]
        assert new != old  # sealed with a new key, not the shredded one
        texts = [t.turn.user_message for t in eraser.load(ALICE)[0].turns]
        assert texts == [f"{SECRET} alice message 5"]


class _Stop(Exception):
    """Stands for a crash right after an erasure step (the process runs on)."""


def test_from_the_key_deletion_on_the_events_left_read_as_erased(tmp_path: Path) -> None:
    """The erasure's second step deletes the key: stopped right there, the stored events read as erased."""
    data = tmp_path / "data"

    def stop(done: str) -> None:
        if done == "shred_key":
            raise _Stop(done)

    with connect(data_dir=data, snapshot_every=2, erasure_hook=stop) as system:
        _write(system, ALICE, 3)
        _write(system, BOB, 1)
        with pytest.raises(_Stop):
            system.erase_user("acme", "alice")
    with JetStreamBackend.embedded(data) as backend:  # read without finishing the erasure
        records = backend.log.read(ALICE)
        assert len(records) == 4  # the events are still there (their erasure is pending) ...
        events = [decode_event(r.data) for r in records]
        assert all(isinstance(e, SessionErased) and e.reason == SHREDDED for e in events)  # ... unreadable
        assert _turn_texts(backend, BOB) == [f"{SECRET} bob message 0"]
    with connect(data_dir=data) as system:  # a start finishes it
        assert system.pending_erasures() == []
        assert system.log.keys(tenant_id="acme", user_id="alice") == []


def _key_id_of(data: Path, user: str) -> str:
    """The id of `user`'s (only) data key, read from the key files (what they name is the truth)."""
    found = [k.key_id for k in DirKeyStore(data / "keys").all() if k.subject == subject_of("acme", user)]
    assert len(found) == 1
    return found[0]


def test_an_erase_shreds_a_key_whose_index_marker_was_lost(tmp_path: Path) -> None:
    """Losing the one-line marker of bob's key must not leave the key (and a backup readable)."""
    data, copy = tmp_path / "data", tmp_path / "copy"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2)
        _write(system, BOB, 2)
    shutil.copytree(data / "jetstream", copy / "jetstream")
    bob = _key_id_of(data, "bob")
    (data / "keys" / "subjects" / subject_of("acme", "bob") / bob).unlink()

    assert main(["--data-dir", str(data), "erase", "--tenant", "acme", "--user", "bob", "--yes"]) == 0
    assert not (data / "keys" / "keys" / bob).exists()
    assert (data / "keys" / "shredded" / bob).exists()
    keys = KeySettings(master_key_file=str(data / "master.key"), key_store=str(data / "keys"))
    with JetStreamBackend.embedded(copy, keys=keys) as backend:
        events = [decode_event(r.data) for r in backend.log.read(BOB)]
        assert events
        assert all(isinstance(e, SessionErased) and e.reason == SHREDDED for e in events)
        assert _turn_texts(backend, ALICE) == [f"{SECRET} alice message {n}" for n in range(2)]


def test_an_erase_unsure_every_key_is_gone_fails_naming_the_file_and_stays_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key file that does not read may be the erased user's: the erase says so, and is resumed later."""
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 2)
        _write(system, BOB, 2)
    bob = _key_id_of(data, "bob")
    damaged = data / "keys" / "keys" / _key_id_of(data, "alice")
    intact = damaged.read_bytes()
    damaged.write_bytes(intact[:10])
    where = ["--data-dir", str(data)]

    capsys.readouterr()
    assert main([*where, "erase", "--tenant", "acme", "--user", "bob", "--yes"]) == 5
    err = capsys.readouterr().err
    assert f"data key file {damaged}" in err
    assert "stays pending" in err
    assert not (data / "keys" / "keys" / bob).exists()  # the keys it could tell are gone already
    assert main([*where, "erase", "--resume"]) == 4  # still unsure: still pending

    damaged.write_bytes(intact)  # restored from a backup of the key store
    capsys.readouterr()
    assert main([*where, "erase", "--resume"]) == 0
    assert "finished 1 pending erasure(s)" in capsys.readouterr().out
    with JetStreamBackend.embedded(data) as backend:
        assert backend.log.keys(tenant_id="acme", user_id="bob") == []
        assert _turn_texts(backend, ALICE) == [f"{SECRET} alice message {n}" for n in range(2)]


def test_keys_status_names_a_damaged_key_file_and_exits_7(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 1)
        _write(system, BOB, 1)
    where = ["--data-dir", str(data), "keys", "status"]
    capsys.readouterr()
    assert main([*where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["damaged_data_keys"] == []

    flipped = data / "keys" / "keys" / _key_id_of(data, "bob")
    stored = bytearray(flipped.read_bytes())
    wrapped = msgspec.msgpack.decode(bytes(stored), type=WrappedKey).wrapped
    stored[bytes(stored).index(wrapped) + 20] ^= 0x01  # inside the wrapped key: the record still decodes
    flipped.write_bytes(bytes(stored))
    assert main(where) == 7
    out, err = capsys.readouterr()
    assert "data_keys: 2" in out
    assert "damaged_data_keys: 1" in out
    assert f"data key file {flipped}: does not unwrap" in err
    assert main([*where, "--json"]) == 7
    status = json.loads(capsys.readouterr().out)
    assert [d["where"] for d in status["damaged_data_keys"]] == [f"data key file {flipped}"]


def test_a_reader_whose_key_store_is_gone_says_so_not_that_no_master_key_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given an encrypted store whose key folder was lost while its master key stayed, when a reader
    meets a sealed event, then the error names the missing key store (a backup of it is the fix),
    not a master key that was never given."""
    data = tmp_path / "data"
    with connect(data_dir=data) as system:
        _write(system, ALICE, 1)
    shutil.rmtree(data / "keys")
    assert (data / "master.key").exists()
    with (
        JetStreamBackend.embedded(data, read_only=True) as backend,
        pytest.raises(EncryptionKeyError, match=r"key store .* does not exist") as caught,
    ):
        backend.log.read(ALICE)
    assert "does not exist" in caught.value.source
    assert "CONVMEM_MASTER_KEY" not in str(caught.value)
    assert main(["--data-dir", str(data), "replay", "acme:alice:chat-1"]) != 0
    assert "key store" in capsys.readouterr().err
