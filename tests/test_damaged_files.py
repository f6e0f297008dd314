"""One flipped byte in the files around a store: the export registry, an export file, the master key.

Each case writes real sessions on the embedded nats-server (an encrypted store: the default), damages
one file outside the log by flipping one byte (found by searching, never at a fixed offset), runs
the commands, and checks that they name the file and what is wrong in it, exit as the CLI's
conventions say (5: an input is wrong), and that nothing was lost: with the byte put back, every
session still verifies and a pending erasure finishes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import convmem
from convmem import ConversationTurn, MemoryKey
from convmem.adapters.frontends.cli._main import main
from convmem.errors import EncryptionKeyError

ALICE = MemoryKey("acme", "alice", "chat")
BOB = MemoryKey("acme", "bob", "chat")
TURNS = 3


def marker(key: MemoryKey, i: int) -> str:
    return f"MARK-{key.user_id}-{i}-"


def seed(data: Path) -> None:
    with convmem.connect(data_dir=data, snapshot_every=2) as memory:
        for key in (ALICE, BOB):
            for i in range(TURNS):
                turn = ConversationTurn(user_message=f"{marker(key, i)} question", assistant_response="ok")
                memory.session(key).add_turn(turn, timeout=10)


def flip(path: Path, text: bytes, *, bit: int = 0x20) -> None:
    """Flip one bit of one byte of `text` where `path` holds it (exactly once)."""
    data = bytearray(path.read_bytes())
    at = data.find(text)
    assert at >= 0, f"{text!r} is not in {path}"
    assert data.find(text, at + 1) < 0, f"{text!r} is held twice in {path}"
    data[at + len(text) // 2] ^= bit
    path.write_bytes(bytes(data))


def cli(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, str]:
    code = main(["--data-dir", str(data), *argv])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "exports.json"
    monkeypatch.setenv("CONVMEM_EXPORTS", str(path))
    return path


def test_a_flipped_letter_in_the_export_registry_fails_the_erasure_naming_it_and_leaves_it_pending(
    tmp_path: Path, registry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flipped byte leaves the registry valid JSON: without its entries' checksums the erasure
    took alice's export for a file that is gone, forgot it and reported done with her lines in it."""
    data = tmp_path / "data"
    seed(data)
    exported = tmp_path / "alice-export.jsonl"
    assert cli(capsys, data, "export", "--key", ALICE.composite(), "-o", str(exported))[0] == 0
    assert cli(capsys, data, "export", "--key", BOB.composite(), "-o", str(tmp_path / "bob.jsonl"))[0] == 0
    flip(registry, b"alice-export")  # the path's letter changes case: still valid JSON

    code, out = cli(capsys, data, "erase", "--tenant", "acme", "--user", "alice", "--yes")
    assert code == 5, out
    assert str(registry) in out
    assert "entry 1" in out
    assert "fails its checksum" in out
    assert marker(ALICE, 0) in exported.read_text()  # not reported done: her export is still listed

    refused = tmp_path / "refused.jsonl"
    code, out = cli(capsys, data, "export", "--key", BOB.composite(), "-o", str(refused))
    assert code == 5, out
    assert str(registry) in out
    assert not refused.exists()  # never written unrecorded, out of a later erasure's reach

    flip(registry, b"alice-Export")  # the byte put back: the pending erasure finishes
    code, out = cli(capsys, data, "erase", "--resume", "--yes")
    assert code == 0, out
    assert "finished 1 pending erasure(s)" in out
    assert not exported.exists()  # alice's only session: the file is removed
    assert marker(BOB, 0) in (tmp_path / "bob.jsonl").read_text()
    code, out = cli(capsys, data, "verify", "--all")
    assert code == 0, out
    assert "1/1 sessions verified" in out


@pytest.mark.parametrize("damage", ["truncated", "not json", "salt"])
def test_a_registry_that_does_not_read_fails_the_erasure_and_a_removed_one_lets_it_finish(
    tmp_path: Path, registry: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    data = tmp_path / "data"
    seed(data)
    exported = tmp_path / "alice.jsonl"
    assert cli(capsys, data, "export", "--key", ALICE.composite(), "-o", str(exported))[0] == 0
    raw = registry.read_bytes()
    if damage == "truncated":
        registry.write_bytes(raw[: len(raw) // 2])
    elif damage == "not json":
        registry.write_text("hello")
    else:
        salt = json.loads(raw)[0]["salt"]
        letter = next(c for c in salt if c in "abcdef")  # a case flip fromhex reads as the same salt
        registry.write_bytes(raw.replace(salt.encode(), salt.replace(letter, letter.upper(), 1).encode()))

    code, out = cli(capsys, data, "erase", "--tenant", "acme", "--user", "alice", "--yes")
    assert code == 5, out
    assert str(registry) in out
    assert "erase --resume" in out

    os.unlink(registry)
    code, out = cli(capsys, data, "erase", "--resume", "--yes")
    assert code == 0, out
    assert "finished 1 pending erasure(s)" in out
    code, out = cli(capsys, data, "sessions")
    assert ALICE.composite() not in out
    assert BOB.composite() in out


def test_a_flipped_byte_in_an_export_file_is_named_by_its_line_not_read_back_as_written(
    tmp_path: Path, registry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    seed(data)
    exported = tmp_path / "alice.jsonl"
    assert cli(capsys, data, "export", "--key", ALICE.composite(), "-o", str(exported))[0] == 0
    assert cli(capsys, data, "verify", "--all", "--from-file", str(exported))[0] == 0
    lines = exported.read_text().splitlines()
    hurt = next(n for n, line in enumerate(lines, start=1) if marker(ALICE, 1) in line)
    flip(exported, marker(ALICE, 1).encode())  # a letter of the turn's text: still a valid event

    for argv in (
        ("verify", "--all", "--from-file", str(exported)),
        ("replay", ALICE.composite(), "--from-file", str(exported)),
        ("inspect", ALICE.composite(), "--from-file", str(exported)),
    ):
        code, out = cli(capsys, data, *argv)
        assert code == 5, (argv, out)
        assert f"{exported}:{hurt}: damaged: the line fails its checksum" in out

    unsummed = tmp_path / "earlier.jsonl"  # an export of an earlier version: no sum, read as it is
    rows = [json.loads(line) for line in lines]
    unsummed.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "sum"}) + "\n" for r in rows))
    assert cli(capsys, data, "verify", "--all", "--from-file", str(unsummed))[0] == 0
    renamed = tmp_path / "renamed.jsonl"  # the sum's own name flipped: not taken for a line without one
    renamed.write_text(exported.read_text().replace('"sum"', '"suM"'))
    code, out = cli(capsys, data, "verify", "--all", "--from-file", str(renamed))
    assert code == 5, out
    assert "unknown field 'suM'" in out


def test_a_flipped_byte_in_the_master_key_file_is_refused_naming_it_and_loses_nothing(
    tmp_path: Path, registry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    seed(data)
    master = data / "master.key"
    kept = master.read_bytes()
    keys_before = {p: p.read_bytes() for p in (data / "keys").rglob("*") if p.is_file()}
    damaged = bytearray(kept)
    damaged[len(kept) // 2] ^= 0x01
    master.write_bytes(bytes(damaged))
    for argv in (("verify", "--all"), ("keys", "status"), ("sessions",), ("replay", ALICE.composite())):
        code, out = cli(capsys, data, *argv)
        assert code == 5, (argv, out)
        assert f"master key file {master}" in out
        assert "Traceback" not in out
    with pytest.raises(EncryptionKeyError) as caught:
        convmem.connect(data_dir=data).close()
    assert str(master) in str(caught.value.source)
    # nothing was rewrapped, replaced or made under the damaged key
    assert master.read_bytes() == bytes(damaged)
    assert {p: p.read_bytes() for p in (data / "keys").rglob("*") if p.is_file()} == keys_before

    master.write_bytes(kept)
    code, out = cli(capsys, data, "verify", "--all")
    assert code == 0, out
    assert "2/2 sessions verified" in out


class _Stop(Exception):
    pass


def test_a_lost_erasure_journal_bucket_is_named_not_taken_for_no_pending_erasure(
    tmp_path: Path, registry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal's folder deleted while bob's erasure was pending (recorded, nothing erased yet):
    nothing else records that it was asked for, so verify passed and `erase --resume` said there was
    none, with bob's data still there. Each now names the lost bucket (exit 7), and no writer makes it
    again, empty, until an operator accepts the loss (`repair --accept-loss`); then bob is erased again."""
    data = tmp_path / "data"
    seed(data)

    def stop(done: str) -> None:
        if done == "record":
            raise _Stop(done)

    with convmem.connect(data_dir=data, erasure_hook=stop) as memory, pytest.raises(_Stop):
        memory.erase_user("acme", "bob")
    bucket = data / "jetstream" / "$G" / "streams" / "KV_CONVMEM_EVENTS_ERASURES"
    assert bucket.is_dir()
    for path in sorted(bucket.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    bucket.rmdir()

    said = "erasure journal: DAMAGED: the NATS server has no erasure-journal bucket 'CONVMEM_EVENTS_ERASURES'"
    for argv in (("verify", "--all"), ("sessions",)):
        code, out = cli(capsys, data, *argv)
        assert code == 7, (argv, out)
        assert said in out
        assert "every erasure it held pending" in out
    code, out = cli(capsys, data, "verify", "--all", "--json")
    assert code == 7
    assert "was lost" in json.loads(out[out.index("{") :])["journal_lost"]
    code, out = cli(capsys, data, "erase", "--resume", "--yes")
    assert code == 7, out
    assert said in out

    code, out = cli(capsys, data, "erase", "--tenant", "acme", "--user", "bob", "--yes")  # a writer
    assert code == 7, out
    assert said in out
    assert "`convmem repair --accept-loss`" in out
    assert not bucket.exists()  # refused before anything was made
    code, out = cli(capsys, data, "repair", "--accept-loss", "--yes")
    assert code == 0, out
    assert said in out
    assert "accepted the loss of 1 part(s) of the store" in out
    code, out = cli(capsys, data, "erase", "--tenant", "acme", "--user", "bob", "--yes")  # asked again
    assert code == 0, out
    code, out = cli(capsys, data, "verify", "--all")
    assert code == 0, out
    assert "1/1 sessions verified" in out
