"""The `convmem` command line, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

import convmem
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryBudget, MemoryKey, ShortTermMemoryConfig
from convmem.projections import encode_state

KEYS = [
    MemoryKey("acme", "alice", "chat-1"),
    MemoryKey("acme", "alice", "chat-2"),
    MemoryKey("globex", "bob", "x"),
]


@pytest.fixture
def seeded(nats_server: EmbeddedNatsServer) -> Iterator[str]:
    """A server holding three sessions of five turns each (rolling summaries)."""
    config = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=2))
    with convmem.connect(nats_server.url, config=config, snapshot_every=4) as memory:
        for key in KEYS:
            session = memory.session(key)
            for i in range(5):
                session.add_turn(
                    ConversationTurn(
                        user_message=f"{key.session_id} question {i} about $4{i}", assistant_response="ok"
                    ),
                    timeout=10,
                )
            session.flush(timeout=10)
    return nats_server.url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_all_passes_on_a_healthy_log(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """verify --all rebuilds every session and exits 0 when all match their snapshots."""
    code, out, _ = run(capsys, "--nats", seeded, "verify", "--all")
    assert code == 0
    assert "3/3 sessions verified" in out


def test_verify_scopes_to_a_tenant_and_a_user(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """verify --tenant/--user checks only that tenant's or user's sessions."""
    code, out, _ = run(capsys, "--nats", seeded, "verify", "--tenant", "acme", "--user", "alice", "--json")
    report = json.loads(out)
    assert code == 0
    assert sorted(c["key"] for c in report["checks"]) == ["acme:alice:chat-1", "acme:alice:chat-2"]


def test_verify_reports_a_poison_message_with_its_position(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes that are not an event make verify exit 1 and name the log position."""

    async def publish() -> int:
        client = await nats.connect(seeded)
        try:
            ack = await client.jetstream().publish(
                "convmem.ev." + ".".join(KEYS[0].tokens()), b"\xc1 not an event"
            )
            return int(ack.seq)
        finally:
            await client.close()

    position = asyncio.run(publish())
    code, out, _ = run(capsys, "--nats", seeded, "verify", "--all")
    assert code == 1
    assert f"poison at position {position}" in out


def test_verify_catches_a_snapshot_that_does_not_match_the_log(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot whose state differs from the replay of the events it claims to cover fails verify."""
    with JetStreamBackend.connect(seeded) as backend:
        good = backend.snapshots.load(KEYS[1])
        assert good is not None
        other, _ = convmem.MemorySystem(log=backend.log).load(KEYS[2])
        forged = type(good)(key=good.key, seq=good.seq, state_hash=good.state_hash, data=encode_state(other))
        backend.snapshots.delete(KEYS[1])
        backend.snapshots.save(forged)
    code, out, _ = run(capsys, "--nats", seeded, "verify", KEYS[1].composite())
    assert code == 1
    assert "FAILED" in out


def test_inspect_shows_the_timeline(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect lists a session's events in order with their types."""
    code, out, _ = run(capsys, "--nats", seeded, "inspect", KEYS[0].composite(), "--json")
    rows = json.loads(out)
    assert code == 0
    assert rows[0]["type"] == "session.started"
    assert [r["type"] for r in rows].count("turn.added") == 5
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))


def test_export_then_replay_from_file_equals_replay_from_the_log(
    seeded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An export read back offline rebuilds the same state and context as the live log."""
    dump = tmp_path / "acme.jsonl"
    code, _, _ = run(capsys, "--nats", seeded, "export", "--tenant", "acme", "-o", str(dump))
    assert code == 0
    lines = dump.read_text().splitlines()
    assert len(lines) > 10
    assert all(json.loads(line)["key"]["tenant_id"] == "acme" for line in lines)
    code, from_log, _ = run(capsys, "--nats", seeded, "replay", KEYS[0].composite(), "--json")
    assert code == 0
    code, from_file, _ = run(capsys, "replay", KEYS[0].composite(), "--from-file", str(dump), "--json")
    assert code == 0
    assert json.loads(from_file) == json.loads(from_log)
    code, out, _ = run(capsys, "verify", "--all", "--from-file", str(dump))
    assert code == 0
    assert "2/2 sessions verified" in out


def test_replay_as_of_a_position_shows_the_past(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """replay --position folds only the events up to that log position."""
    code, out, _ = run(capsys, "--nats", seeded, "inspect", KEYS[0].composite(), "--json")
    rows = json.loads(out)
    third_turn = [r for r in rows if r["type"] == "turn.added"][2]
    code, out, _ = run(
        capsys,
        "--nats",
        seeded,
        "replay",
        KEYS[0].composite(),
        "--position",
        str(third_turn["position"]),
        "--json",
    )
    past = json.loads(out)
    assert code == 0
    assert past["turns"] == 3
    assert past["seq"] == third_turn["seq"]


def test_replay_as_of_a_time_before_the_session_finds_nothing(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """replay --time before the first event has nothing to show: exit 3, one line."""
    code, _out, err = run(
        capsys, "--nats", seeded, "replay", KEYS[0].composite(), "--time", "2001-01-01T00:00:00Z"
    )
    assert code == 3
    assert err.count("\n") == 1


def test_erase_needs_confirmation_then_purges(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """erase refuses without --yes when nobody can answer, and with it purges the user's sessions."""
    code, _, err = run(capsys, "--nats", seeded, "erase", "--tenant", "acme", "--user", "alice")
    assert code == 2
    assert "--yes" in err
    code, out, _ = run(
        capsys, "--nats", seeded, "erase", "--tenant", "acme", "--user", "alice", "--yes", "--json"
    )
    assert code == 0
    assert json.loads(out)["sessions"] == 2
    code, out, _ = run(capsys, "--nats", seeded, "replay", KEYS[0].composite(), "--json")
    assert code == 3  # nothing of the session is left
    code, out, _ = run(capsys, "--nats", seeded, "verify", "--all", "--json")
    assert json.loads(out)["failed"] == 0


def test_a_missing_key_is_one_line_and_exit_3(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A key with no events is reported in one line with exit code 3, no traceback."""
    code, _, err = run(capsys, "--nats", seeded, "inspect", "acme:nobody:none")
    assert code == 3
    assert err.startswith("convmem: error:")
    assert err.count("\n") == 1


def test_a_bad_key_is_a_usage_error(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A key that is not tenant:user:session exits 2 and says how to write it."""
    code, _, err = run(capsys, "--nats", seeded, "inspect", "only-one-part")
    assert code == 2
    assert "tenant:user:session" in err


def test_an_unreachable_server_is_exit_4_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A NATS URL nobody answers gives exit 4 and advice, not a traceback."""
    code, _, err = run(capsys, "--nats", "nats://127.0.0.1:1", "--timeout", "1", "verify", "--all")
    assert code == 4
    assert "Traceback" not in err
    assert "--server" in err


def test_the_demo_plays_and_verifies_every_session(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo plays real conversations on the embedded server and every session verifies."""
    code, out, _ = run(capsys, "demo", "--sessions", "4", "--max-turns", "10", "--planners", "2", "--json")
    summary = json.loads(out)
    assert code == 0
    assert summary["verified"] == "4/4"
    assert summary["turns"] >= 4 * 4
    assert summary["summaries"] > 0


def test_a_demo_rerun_in_the_same_data_folder_is_refused_and_leaves_the_first_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a demo run kept in --data-dir, when the demo runs again there, then it refuses with a
    clear error naming the folder (rather than appending every turn a second time), and the first
    run's sessions still verify with the same events."""
    folder = str(tmp_path / "demo")
    argv = ("--data-dir", folder, "demo", "--sessions", "2", "--max-turns", "2", "--planners", "1", "--json")
    code, out, _ = run(capsys, *argv)
    assert code == 0
    first = json.loads(out)
    code, out, err = run(capsys, *argv)
    assert code == 5
    assert "earlier demo run" in err
    assert folder in err
    assert out == ""
    code, out, _ = run(capsys, "--data-dir", folder, "verify", "--all", "--json")
    assert code == 0
    assert sum(row["events"] for row in json.loads(out)["checks"]) == first["events"]


def test_the_console_script_runs() -> None:
    """`python -m convmem --version` works from a fresh process."""
    done = subprocess.run(
        [sys.executable, "-m", "convmem", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("convmem ")
