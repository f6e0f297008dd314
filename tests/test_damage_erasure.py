"""Erasing or repairing a session whose snapshot is damaged on disk removes it, or says it did not.

One byte of `acme:alice:hurt`'s stored snapshot flipped in the snapshot bucket's block file (the
server stopped), as in tests/test_damage_views.py: nats-server counts the message but can neither
read it back nor erase it (``STREAM.MSG.DELETE`` answers "malformed or corrupt message"), and a purge
filtered by its subject passes over it. `convmem erase` used to exit 0 with the message still in the
bucket (on an unencrypted store, the user's text in clear on disk) and `verify` naming it; `convmem
repair` used to exit 0 saying "repaired" while its new snapshot could not be saved and verify stayed
7. Now the snapshot store removes what it cannot read (the bucket purged, every readable snapshot
written back), so the erasure is whole and the repair is one. Encrypted and unencrypted stores, the
session's and the user's erase, the Python erase and repair; real nats-server, real block files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import WAIT
from test_damage_views import _keys

import convmem
from convmem.actors import ManualClock, MemorySystem
from convmem.adapters import JetStreamBackend, MemoryService, RemoteMemory
from convmem.adapters.backends.jetstream import EmbeddedNatsServer
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.frontends.cli._main import main
from convmem.errors import SessionDamaged
from convmem.events import (
    ConversationTurn,
    MemoryKey,
    RetentionPolicies,
    RetentionPolicy,
    ShortTermMemoryConfig,
)

CONFIG = ShortTermMemoryConfig(strategy="truncation")
OK = MemoryKey("acme", "alice", "ok")
HURT = MemoryKey("acme", "alice", "hurt")
BOB = MemoryKey("acme", "bob", "kept")
MARKER = "card-4111-1111-1111-1111"  # the hurt session's personal data, in its turns
KEPT = "bob-kept-marker"
TURNS = 3
SNAPSHOTS = Path("jetstream") / "$G" / "streams" / "KV_CONVMEM_SNAPSHOTS"


def _seed(data: Path, *, encrypt: bool) -> None:
    """OK, HURT and BOB, three turns each with a snapshot after every event; then one byte of HURT's
    snapshot (the last message on its subject) flipped in the bucket's block file."""
    keys = None if encrypt else KeySettings(encrypt=False)
    with convmem.connect(data_dir=data, config=CONFIG, snapshot_every=1, keys=keys) as memory:
        for key in (OK, HURT, BOB):
            text = MARKER if key == HURT else KEPT if key == BOB else "plain"
            for i in range(TURNS):
                turn = ConversationTurn(user_message=f"{text} question {i}", assistant_response="noted")
                memory.session(key).add_turn(turn, timeout=WAIT)
    (block,) = (data / SNAPSHOTS / "msgs").glob("*.blk")
    raw = bytearray(block.read_bytes())
    at = raw.rfind(".".join(HURT.tokens()).encode())
    assert at >= 0
    raw[raw.index(b"\r\n\r\n", at) + 4 + 20] ^= 0x01
    block.write_bytes(bytes(raw))


def _store_keys(data: Path) -> KeySettings:
    """The embedded store's own master key and key store, or none for an unencrypted one."""
    return _keys(data) if (data / "master.key").exists() else KeySettings(encrypt=False)


def _cli(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--data-dir", str(data), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _verify(capsys: pytest.CaptureFixture[str], data: Path) -> tuple[int, dict[str, dict[str, object]]]:
    code, out, _ = _cli(capsys, data, "verify", "--all", "--json")
    return code, {c["key"]: c for c in json.loads(out)["checks"]}


def _bucket_files_with(data: Path, needle: bytes) -> list[str]:
    return sorted(p.name for p in (data / SNAPSHOTS).rglob("*") if p.is_file() and needle in p.read_bytes())


def _store_files_with(data: Path, needle: bytes) -> list[str]:
    return sorted(str(p) for p in (data / "jetstream").rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.fixture(params=["encrypted", "plain"])
def data(request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    folder = tmp_path / "data"
    _seed(folder, encrypt=request.param == "encrypted")
    code, checks = _verify(capsys, folder)
    assert code == 7
    assert not checks[HURT.composite()]["ok"]
    if request.param == "plain":
        assert _store_files_with(folder, MARKER.encode())  # the scan can fail: the text is on disk
    return folder


def _assert_hurt_gone_rest_kept(capsys: pytest.CaptureFixture[str], data: Path, *, ok_kept: bool) -> None:
    subject = ".".join(HURT.tokens()).encode()
    assert _bucket_files_with(data, subject) == []  # no copy of its snapshot in the bucket's files
    assert _store_files_with(data, MARKER.encode()) == []  # nor its text anywhere in the store
    code, checks = _verify(capsys, data)
    assert code == 0, checks
    assert HURT.composite() not in checks
    kept = [BOB, OK] if ok_kept else [BOB]
    assert sorted(checks) == sorted(k.composite() for k in kept)
    for key in kept:  # their snapshots were written back: each still loads from its snapshot
        assert checks[key.composite()]["snapshot_seq"] == TURNS + 1, checks
    code, out, err = _cli(capsys, data, "sessions", "--json")
    assert code == 0, err
    assert HURT.composite() not in {r["key"] for r in json.loads(out)}


def test_erase_of_a_session_removes_its_damaged_snapshot(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, data, "erase", "--key", HURT.composite(), "--yes")
    assert code == 0, err
    assert f"erased session {HURT.composite()}" in out
    _assert_hurt_gone_rest_kept(capsys, data, ok_kept=True)
    code, out, err = _cli(capsys, data, "erase", "--resume")
    assert (code, out.strip()) == (0, "no pending erasure"), err


def test_erase_of_a_user_removes_a_damaged_snapshot_of_theirs(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, data, "erase", "--tenant", "acme", "--user", "alice", "--yes")
    assert code == 0, err
    assert "2 session(s)" in out
    _assert_hurt_gone_rest_kept(capsys, data, ok_kept=False)


def test_a_systems_erase_removes_a_damaged_snapshot(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the service's erase and retention's erase run: `MemorySystem.erase`."""
    with (
        JetStreamBackend.embedded(data, keys=_store_keys(data)) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots) as memory,
    ):
        erased = memory.erase(HURT, by="test")
        assert erased.sessions == 1
        assert memory.pending_erasures() == []
    _assert_hurt_gone_rest_kept(capsys, data, ok_kept=True)


def test_repair_replaces_a_damaged_snapshot_and_verify_passes(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, data, "repair", HURT.composite(), "--yes")
    assert code == 0, err
    assert f"repaired session {HURT.composite()}" in out
    assert "not saved" not in out + err
    code, checks = _verify(capsys, data)
    assert code == 0, checks
    assert checks[HURT.composite()]["ok"]
    assert checks[HURT.composite()]["snapshot_seq"] == TURNS + 2  # the repair's own snapshot
    for key in (OK, BOB):  # the others' snapshots were written back
        assert checks[key.composite()]["snapshot_seq"] == TURNS + 1, checks
    with (
        JetStreamBackend.embedded(data, keys=_store_keys(data)) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots) as memory,
    ):
        state, report = memory.load(HURT)
    assert report.snapshot_seq == TURNS + 2
    assert [t.turn.user_message for t in state.turns] == [f"{MARKER} question {i}" for i in range(TURNS)]


PURGE = "$JS.API.STREAM.PURGE.KV_CONVMEM_SNAPSHOTS"
USERS = f"""authorization {{
  users: [
    {{user: ops, password: ops-secret}}
    {{user: limited, password: limited-secret, permissions: {{publish: {{allow: ">", deny: ["{PURGE}"]}}}}}}
  ]
}}"""


def test_an_erasure_that_cannot_remove_a_damaged_snapshot_stays_pending_and_exits_7(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Credentials that may not purge the snapshot bucket: nothing removes the unreadable message,
    so the erase says so, names it and what to do, and the erasure stays pending until credentials
    that may purge resume it."""
    data = tmp_path / "data"
    _seed(data, encrypt=False)
    with EmbeddedNatsServer(data, extra_config=USERS) as server:
        limited = ["-s", server.url.replace("nats://", "nats://limited:limited-secret@"), "--no-encryption"]
        ops = ["-s", server.url.replace("nats://", "nats://ops:ops-secret@"), "--no-encryption"]
        code, out, err = _served(capsys, *limited, "erase", "--key", HURT.composite(), "--yes")
        assert code == 7, out + err
        assert "erased session" not in out
        assert f"not erased: the snapshot of session {HURT.composite()} was not erased" in err
        assert "the snapshot message of its snapshot stay in stream KV_CONVMEM_SNAPSHOTS" in err
        assert "may not purge the bucket" in err
        assert "convmem erase --resume" in err
        code, out, err = _served(capsys, *ops, "verify", "--all", "--json")
        assert code == 7, out + err  # still named, as it still is on disk
        checks = {c["key"]: c for c in json.loads(out)["checks"]}
        assert not checks[HURT.composite()]["ok"]
        assert checks[HURT.composite()]["events"] == 0  # its events are erased
        code, out, err = _served(capsys, *limited, "erase", "--resume")
        assert code == 7, out + err  # still not done, and why: damage (not "unavailable", 4)
        assert "pending" in err
        with JetStreamBackend.connect(server.url.replace("nats://", "nats://ops:ops-secret@")) as backend:
            log: Any = backend.log
            (pending,) = log.erasure_journal().pending()
            assert pending.key == HURT
        assert _store_files_with(data, MARKER.encode())  # said: the text is still there
        code, out, err = _served(capsys, *ops, "erase", "--resume")
        assert code == 0, out + err
        assert "finished 1 pending erasure(s)" in out
    _assert_hurt_gone_rest_kept(capsys, data, ok_kept=True)


def _served(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_repair_that_cannot_replace_a_damaged_snapshot_exits_7_not_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to exit 0 saying "repaired ... (its new snapshot was not saved: ...)" while verify
    stayed 7; without the purge the damaged snapshot stays, and the repair says it is not one."""
    data = tmp_path / "data"
    _seed(data, encrypt=False)
    with EmbeddedNatsServer(data, extra_config=USERS) as server:
        limited = ["-s", server.url.replace("nats://", "nats://limited:limited-secret@"), "--no-encryption"]
        ops = ["-s", server.url.replace("nats://", "nats://ops:ops-secret@"), "--no-encryption"]
        code, out, err = _served(capsys, *limited, "repair", HURT.composite(), "--yes")
        assert code == 7, out + err
        assert "repaired" not in out
        assert f"session {HURT.composite()} not repaired" in err
        assert "the snapshot message of its snapshot stay in stream KV_CONVMEM_SNAPSHOTS" in err
        code, out, err = _served(capsys, *ops, "verify", HURT.composite())
        assert code == 7, out + err  # as the repair said
        code, out, err = _served(capsys, *ops, "repair", HURT.composite(), "--yes")
        assert code == 0, out + err  # credentials that may purge: repaired (its snapshot replaced)
        assert "not saved" not in out + err
        code, out, err = _served(capsys, *ops, "verify", "--all")
        assert code == 0, out + err


def _limited(server: EmbeddedNatsServer) -> str:
    return server.url.replace("nats://", "nats://limited:limited-secret@")


def test_the_services_erase_that_cannot_remove_a_damaged_snapshot_answers_session_damaged(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _seed(data, encrypt=False)
    with (
        EmbeddedNatsServer(data, extra_config=USERS) as server,
        JetStreamBackend.connect(_limited(server), keys=KeySettings(encrypt=False)) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots) as memory,
        MemoryService(memory, _limited(server)),
        RemoteMemory(_limited(server), timeout=WAIT) as remote,
    ):
        with pytest.raises(SessionDamaged, match="was not erased") as caught:
            remote.erase_user("acme", "alice")
        assert caught.value.key == HURT.composite()
        (pending,) = memory.pending_erasures()
        assert (pending.tenant_id, pending.user_id) == ("acme", "alice")


def test_retentions_erase_that_cannot_remove_a_damaged_snapshot_reports_it_and_leaves_it_pending(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    _seed(data, encrypt=False)
    later = ManualClock(time.time() + 10 * 86_400)
    with (
        EmbeddedNatsServer(data, extra_config=USERS) as server,
        JetStreamBackend.connect(_limited(server), keys=KeySettings(encrypt=False)) as backend,
        MemorySystem(CONFIG, log=backend.log, snapshots=backend.snapshots, clock=later) as memory,
    ):
        report = memory.sweep_retention(policies=RetentionPolicies(default=RetentionPolicy(idle=86_400.0)))
        (problem,) = report.problems
        assert problem.key == HURT
        assert "was not erased" in problem.problem
        assert {o.key for o in report.outcomes if o.action == "erase"} == {OK, BOB}
        assert [p.key for p in memory.pending_erasures()] == [HURT]
