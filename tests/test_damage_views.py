"""Every view of a session's health agrees with verify about its stored parts.

A session whose encrypted snapshot is damaged on disk (one byte of its sealed bytes flipped in the
snapshot bucket's block file, the server stopped) while its events are intact still loads (a longer
replay), but `convmem verify` names the snapshot damaged and exits 7. So do `sessions` (its row
``damaged``, its ``problem`` verify's words), the service's ``sessions`` (both forms),
`list_session_page`, `inspect`, `replay`, `timeline` and `export` (which still writes every event).
The listing checks a snapshot only when it held one and could not use it: a healthy session costs it
no more than before.

A session known only by its damaged snapshot (its events gone) is named by `verify KEY`, `inspect`,
`replay` and `export` of it as by `verify --all`; a tenant's damaged byte tally by `sessions` of the
tenant whole and `verify --tenant` as by `verify --all`. Real nats-server, real block files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import WAIT
from test_quotas import _USAGE_BLOCK, _tallied

import convmem
from convmem.actors import MemorySystem, list_session_page
from convmem.adapters import JetStreamBackend, MemoryService, RemoteMemory
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

CONFIG = ShortTermMemoryConfig(strategy="truncation")
OK = MemoryKey("acme", "alice", "ok")
HURT = MemoryKey("acme", "alice", "hurt")
LONE = MemoryKey("acme", "bob", "lone")  # known only by its snapshot, and that damaged
TURNS = 3


def _seed_then_damage_snapshot(
    data: Path, keys: tuple[MemoryKey, ...] = (OK, HURT), *, damaged: MemoryKey = HURT
) -> None:
    """`keys`, three turns each with a snapshot after every event, on the embedded server with
    encryption at rest (its default); then one byte of `damaged`'s sealed snapshot flipped on disk."""
    with convmem.connect(data_dir=data, config=CONFIG, snapshot_every=1) as memory:
        for key in keys:
            for i in range(TURNS):
                turn = ConversationTurn(user_message=f"question {i}", assistant_response=f"answer {i}")
                memory.session(key).add_turn(turn, timeout=WAIT)
    if LONE in keys:  # its events gone from the stream (a crash's recovery drops them): its snapshot is all
        with JetStreamBackend.embedded(data, keys=_keys(data)) as backend:
            log: Any = backend.log
            purge = f"$JS.API.STREAM.PURGE.{log.stream}"
            log._conn.call(lambda: log._conn.api(purge, {"filter": log.subject(LONE)}), what="purge")
            assert log.read(LONE) == []
    (block,) = (data / "jetstream" / "$G" / "streams" / "KV_CONVMEM_SNAPSHOTS" / "msgs").glob("*.blk")
    raw = bytearray(block.read_bytes())
    subject = ".".join(damaged.tokens()).encode()
    at = raw.rfind(subject)  # the last message stored under its key: its snapshot now
    assert at >= 0
    payload = raw.index(b"\r\n\r\n", at) + 4  # past its headers: the sealed state
    raw[payload + 20] ^= 0x01
    block.write_bytes(bytes(raw))


def _keys(data: Path) -> KeySettings:
    """The embedded store's own master key and key store (as `--data-dir` finds them)."""
    return KeySettings(master_key_file=str(data / "master.key"), key_store=str(data / "keys"))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    _seed_then_damage_snapshot(folder)
    return folder


def _cli(capsys: pytest.CaptureFixture[str], data: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--data-dir", str(data), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _verified_damage(capsys: pytest.CaptureFixture[str], data: Path) -> str:
    """What verify names wrong with HURT (its only damage), after checking it exits 7 and OK is ok."""
    code, out, _ = _cli(capsys, data, "verify", "--all", "--json")
    assert code == 7, out
    checks = {c["key"]: c for c in json.loads(out)["checks"]}
    assert checks[OK.composite()]["ok"]
    (damage,) = checks[HURT.composite()]["damage"]
    assert damage["seq"] is None
    assert damage["problem"].startswith("snapshot: ")
    problem: str = damage["problem"]
    return problem


def test_sessions_names_a_damaged_snapshot_as_verify_does_and_exits_7(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = _verified_damage(capsys, data)
    code, out, err = _cli(capsys, data, "sessions", "--json")
    assert code == 7, err
    rows = {r["key"]: r for r in json.loads(out)}
    assert rows[OK.composite()]["health"] == "healthy"
    assert rows[OK.composite()]["problem"] is None
    hurt = rows[HURT.composite()]
    assert (hurt["health"], hurt["problem"]) == ("damaged", problem)
    assert (hurt["events"], hurt["last_seq"], hurt["turns"]) == (
        TURNS + 1,
        TURNS + 1,
        TURNS,
    )  # from its events
    code, out, err = _cli(capsys, data, "sessions", "--tenant", "acme")
    assert code == 7, out
    assert f"{HURT.composite()}: DAMAGED: {problem}" in err  # verify's line, word for word
    assert out.count("damaged") == 1
    code, out, err = _cli(capsys, data, "sessions", "--tenant", "acme", "--user", "alice", "--json")
    assert code == 7, err  # the same row, whatever the scope
    assert {r["key"]: r["health"] for r in json.loads(out)}[HURT.composite()] == "damaged"


def test_the_session_views_and_export_name_a_damaged_snapshot_and_exit_7(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = _verified_damage(capsys, data)
    line = f"{HURT.composite()}: DAMAGED: {problem}"
    for argv in (
        ["inspect", HURT.composite()],
        ["replay", HURT.composite()],
        ["timeline", HURT.composite(), "-o", str(tmp_path / "hurt.html")],
    ):
        code, out, err = _cli(capsys, data, *argv)
        assert code == 7, (argv, out, err)
        assert line in out + err, argv
    exported = tmp_path / "acme.jsonl"
    code, out, err = _cli(capsys, data, "export", "--tenant", "acme", "-o", str(exported))
    assert code == 7, out + err
    assert line in err
    assert "every one the log holds" in err
    assert len(exported.read_text(encoding="utf-8").splitlines()) == 2 * (TURNS + 1)  # nothing left out
    code, out, err = _cli(capsys, data, "export", "--key", OK.composite())
    assert code == 0, err  # a session beside it is not touched by its damage
    code, out, err = _cli(capsys, data, "export", "--key", HURT.composite())
    assert code == 7, err
    assert line in err


def test_the_service_and_list_session_page_name_a_damaged_snapshot_checking_only_it(
    data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = _verified_damage(capsys, data)
    with JetStreamBackend.embedded(data, keys=_keys(data)) as backend:
        snapshots = backend.snapshots
        assert snapshots is not None
        checked: Counter[MemoryKey] = Counter()
        check = snapshots.check  # type: ignore[attr-defined]

        def counted(key: MemoryKey) -> Any:
            checked[key] += 1
            return check(key)

        monkeypatch.setattr(snapshots, "check", counted)
        page = list_session_page(backend.log, snapshots, tenant_id="acme")
        assert {r.key: (r.health, r.problem) for r in page.rows} == {
            OK: ("healthy", None),
            HURT: ("damaged", problem),
        }
        assert checked == Counter({HURT: 1})  # OK's snapshot loaded: not asked again
        assert backend.server is not None
        url = backend.server.url
        with (
            MemorySystem(CONFIG, log=backend.log, snapshots=snapshots) as memory,
            MemoryService(memory, url),
            RemoteMemory(url, timeout=WAIT) as remote,
        ):
            listed = {r["session_id"]: r for r in remote.sessions("acme")}
            paged = {r["session_id"]: r for r in remote.sessions_page("acme")["sessions"]}
    for rows in (listed, paged):
        assert (rows["ok"]["health"], rows["ok"]["problem"]) == ("healthy", None)
        assert (rows["hurt"]["health"], rows["hurt"]["problem"]) == ("damaged", problem)


def test_a_session_known_only_by_its_damaged_snapshot_is_named_by_each_view_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --all` finds it by the store's keys; `verify KEY`, `inspect`, `replay` and `export` of
    it used to find nothing (a snapshot that does not load was taken for none: exit 3)."""
    data = tmp_path / "data"
    _seed_then_damage_snapshot(data, (OK, LONE), damaged=LONE)
    code, out, _ = _cli(capsys, data, "verify", "--all", "--json")
    assert code == 7, out
    (damage,) = {c["key"]: c for c in json.loads(out)["checks"]}[LONE.composite()]["damage"]
    assert damage["problem"].startswith("snapshot: ")
    line = f"{LONE.composite()}: DAMAGED: {damage['problem']}"
    code, out, _ = _cli(capsys, data, "verify", LONE.composite(), "--json")
    assert code == 7, out
    (check,) = json.loads(out)["checks"]
    assert check["damage"] == [damage]
    for argv in (
        ["inspect", LONE.composite()],
        ["replay", LONE.composite()],
        ["export", "--key", LONE.composite()],
    ):
        code, out, err = _cli(capsys, data, *argv)
        assert code == 7, (argv, out, err)
        assert line in out + err, argv
    code, out, err = _cli(capsys, data, "sessions", "--tenant", "acme", "--user", "bob", "--json")
    assert code == 7, err
    ((row),) = json.loads(out)
    assert row["health"] == "damaged"
    assert row["problem"].startswith(damage["problem"])


def test_sessions_of_a_tenant_name_its_damaged_byte_tally_as_verify_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flipped byte in acme's tally (its sessions intact): `verify --all` named it, `sessions` did
    not (exit 0). Now a listing of the tenant whole, and `verify --tenant`, name it too (exit 7)."""
    data = tmp_path / "data"
    _tallied(data, 3)
    block = data / _USAGE_BLOCK
    raw = bytearray(block.read_bytes())
    at = raw.rfind(b'"bytes":')
    raw[at + len(b'"bytes":') + 1] ^= 0x01
    block.write_bytes(bytes(raw))
    line = "byte tally: DAMAGED: tenant 'acme' in KV_CONVMEM_EVENTS_USAGE"
    for argv in (["verify", "--all"], ["verify", "--tenant", "acme"]):
        code, out, err = _cli(capsys, data, *argv)
        assert code == 7, (argv, out, err)
        assert line in out, argv
    for argv in (["sessions"], ["sessions", "--tenant", "acme", "--json"]):
        code, out, err = _cli(capsys, data, *argv)
        assert code == 7, (argv, out, err)
        assert line in err, argv
    code, out, err = _cli(capsys, data, "sessions", "--tenant", "acme", "--json")
    assert {r["health"] for r in json.loads(out)} == {"healthy"}  # the sessions themselves are sound
    for argv in (
        ["sessions", "--tenant", "acme", "--user", "u"],
        ["verify", "--tenant", "acme", "--user", "u"],
    ):
        code, out, err = _cli(capsys, data, *argv)
        assert code == 0, (argv, out, err)  # a user's sessions are not the tenant's tally
        assert line not in out + err
