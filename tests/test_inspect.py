"""`inspect` filters and follow mode, `sessions`, progress bars, and joining a running `serve`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import convmem
from convmem.actors import ManualClock
from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.frontends.cli._common import Progress
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

KEY = MemoryKey("acme", "alice", "chat-1")
LONG = "word " * 40 + "END-OF-A-LONG-TURN"
WAIT = 60.0
CLI = [sys.executable, "-m", "convmem"]


@pytest.fixture
def seeded(nats_server: EmbeddedNatsServer) -> str:
    """Four turns, one per minute from epoch 1_800_000_000, the last one long; then a clear."""
    clock = ManualClock(start=1_800_000_000.0)
    with convmem.connect(
        nats_server.url, config=ShortTermMemoryConfig(strategy="truncation"), clock=clock
    ) as m:
        for n in range(4):
            text = LONG if n == 3 else f"turn {n}"
            m.session(KEY).add_turn(ConversationTurn(user_message=text, assistant_response="ok"))
            clock.advance(60)
        m.session(KEY).clear()
    return nats_server.url


def rows(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> list[dict[str, object]]:
    assert main(["-s", url, "inspect", KEY.composite(), "--json", *argv]) == 0
    found: list[dict[str, object]] = json.loads(capsys.readouterr()[0])
    return found


def test_inspect_filters_by_type_and_time_and_shows_details_whole(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--type keeps those events, --since/--until a time window, --full the whole detail."""
    assert [r["type"] for r in rows(capsys, seeded, "--type", "session.cleared")] == ["session.cleared"]
    turns = rows(capsys, seeded, "--type", "turn.added", "--since", "1800000060", "--until", "1800000120")
    assert [r["detail"] for r in turns] == ["#2 user: turn 1", "#3 user: turn 2"]
    clipped = rows(capsys, seeded, "--type", "turn.added")[-1]["detail"]
    whole = rows(capsys, seeded, "--type", "turn.added", "--full")[-1]["detail"]
    assert isinstance(clipped, str)
    assert "END-OF-A-LONG-TURN" not in clipped
    assert whole == "#4 user: " + LONG.strip()
    assert (
        main(["-s", seeded, "inspect", KEY.composite(), "--since", "2030-01-01", "--until", "2029-01-01"])
        == 5
    )


def test_inspect_follow_shows_events_as_they_are_stored(seeded: str) -> None:
    """--follow prints the history, then each new event as a JSON line, until interrupted."""
    proc = subprocess.Popen(
        [*CLI, "-s", seeded, "inspect", KEY.composite(), "--follow", "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = [json.loads(proc.stdout.readline()) for _ in range(6)]  # the history: start, 4 turns, clear
        assert seen[-1]["type"] == "session.cleared"
        with convmem.connect(seeded, config=ShortTermMemoryConfig(strategy="truncation")) as memory:
            memory.session(KEY).add_turn(
                ConversationTurn(user_message="while following", assistant_response="ok")
            )
        fresh = json.loads(proc.stdout.readline())
        assert fresh["type"] == "turn.added"
        assert "while following" in fresh["detail"]
    finally:
        proc.terminate()
        proc.communicate(timeout=WAIT)


def test_sessions_lists_with_counts_and_health(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """sessions: key, events, turns written and live (the 4 written were cleared), last activity, health."""
    assert main(["-s", seeded, "sessions", "--tenant", "acme", "--user", "alice", "--json"]) == 0
    [row] = json.loads(capsys.readouterr()[0])
    assert (row["key"], row["events"], row["turns"], row["live_turns"], row["health"]) == (
        KEY.composite(),
        6,
        4,
        0,
        "healthy",
    )
    assert row["last_at"] == 1_800_000_240.0
    assert main(["-s", seeded, "sessions", "--tenant", "globex"]) == 3


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_with_total_and_eta_on_a_terminal_only() -> None:
    """On a terminal: the label, done/total and an ETA; off a terminal or quiet: nothing."""
    screen = Terminal()
    bar = Progress("verify: events read", 200, stream=screen)
    bar.update(50)
    bar.close()
    assert "verify: events read" in screen.getvalue()
    assert "50/200" in screen.getvalue()
    assert "-:--:--" in screen.getvalue() or "0:00:0" in screen.getvalue()  # the ETA column
    for stream, quiet in ((io.StringIO(), False), (Terminal(), True)):
        silent = Progress("x", 10, stream=stream, quiet=quiet)
        silent.update(5)
        silent.close()
        assert stream.getvalue() == ""


CLI_SERVE = [sys.executable, "-m", "convmem"]


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Path]:
    """`convmem serve` on the embedded default of a data folder, as a real process."""
    data, ready = tmp_path / "data", tmp_path / "ready"
    with open(tmp_path / "serve.err", "wb") as err:
        proc = subprocess.Popen(
            [*CLI_SERVE, "--data-dir", str(data), "serve", "--workers", "1", "--ready-file", str(ready)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        while not ready.exists():
            try:
                code = proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"serve exited with {code}: {(tmp_path / 'serve.err').read_text()}")
        yield data
    finally:
        proc.terminate()
        proc.wait(WAIT)


@pytest.mark.slow  # `serve` with its worker processes, 10 s and more (`.ci/run` runs it)
def test_commands_join_the_serve_that_holds_the_data_folder(
    serving: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With serve on the embedded default, the audit commands use its server rather than refuse the folder."""
    assert main(["--data-dir", str(serving), "verify", "--all"]) == 3  # joined: an empty log, not "in use"
    _, err = capsys.readouterr()
    assert "in use" not in err
    assert main(["status", "--data-dir", str(serving), "--json"]) == 0
    assert len(json.loads(capsys.readouterr()[0])["replicas"]) == 1  # its one worker
