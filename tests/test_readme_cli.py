"""The README's "Command line" section, line by line: every example that needs no terminal runs as written.

The lines are run as they are printed there (in process, `main(argv)`),
against a real server named by ``NATS_URL`` the way a reader's shell would,
holding the session the examples name, written at the times they name, with
a service running for `status`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

import convmem
from convmem.actors import ManualClock
from convmem.adapters import EmbeddedNatsServer, MemoryService
from convmem.adapters.backends.keys import generate_key_text
from convmem.adapters.frontends.cli._main import main
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

README = Path(__file__).resolve().parent.parent / "README.md"


def examples() -> list[tuple[str, str]]:
    """(command line, its comment) of every line of the section's first bash block."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Command line\n") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    lines = []
    for line in block.group(1).splitlines():
        command, _, comment = line.partition("#")
        lines.append((command.strip(), comment.strip()))
    return lines


def runnable() -> list[str]:
    return [command for command, comment in examples() if "needs a terminal" not in comment]


def test_the_section_shows_the_commands() -> None:
    """Every subcommand the CLI has appears in the section, and only lines that start with convmem."""
    commands = {shlex.split(command)[1] for command, _ in examples()}
    assert commands >= {"demo", "serve", "status", "sessions", "replay", "verify", "inspect", "timeline"}
    assert commands >= {"fork", "export", "erase", "retention"}
    assert all(command.startswith("convmem ") for command, _ in examples())


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """acme:alice:chat-1 written from 2026-11-21 09:30 UTC on, one turn every 10 minutes, and a service."""
    store = tmp_path_factory.mktemp("readme-cli")
    start = datetime(2026, 11, 21, 9, 30, tzinfo=UTC).timestamp()
    clock = ManualClock(start=start)
    with EmbeddedNatsServer(store) as server:
        config = ShortTermMemoryConfig(strategy="truncation")
        with convmem.connect(server.url, config=config, clock=clock) as memory:
            for n in range(6):
                memory.session(MemoryKey("acme", "alice", "chat-1")).add_turn(
                    ConversationTurn(user_message=f"question {n}", assistant_response="answer")
                )
                clock.advance(600)
            with MemoryService(memory, server.url):
                yield server.url


@pytest.fixture(scope="module")
def master_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deployment's master key, in a file (the embedded default keeps its own in its folder)."""
    path = tmp_path_factory.mktemp("readme-keys") / "master.key"
    path.write_text(generate_key_text(), encoding="ascii")
    return path


@pytest.mark.parametrize("command", runnable())
def test_every_example_runs_as_written(
    command: str,
    deployment: str,
    master_key_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The line exits 0 (the export it reads back is made first, in the same folder)."""
    monkeypatch.setenv("NATS_URL", deployment)
    monkeypatch.delenv("CONVMEM_NATS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    if "--from-file" in argv:
        assert main(["export", "--tenant", "acme", "-o", "acme.jsonl"]) == 0
    if argv[0] == "retention":  # the policy file the README shows
        text = README.read_text(encoding="utf-8")
        policy = re.search(r"```toml\n(.*?)```", text[text.index("## Retention\n") :], re.DOTALL)
        assert policy is not None
        (tmp_path / "retention.toml").write_text(policy.group(1), encoding="utf-8")
    if argv[0] == "fork":
        main(["erase", "--key", "acme:alice:chat-1-retry", "--yes"])  # a fork needs a new session
    if argv[0] == "keys":
        monkeypatch.setenv("CONVMEM_MASTER_KEY_FILE", str(master_key_file))
    code = main(argv)
    _, err = capsys.readouterr()
    assert code == 0, (command, err)
    assert "Traceback" not in err
    if argv[0] == "timeline":
        assert (tmp_path / "chat-1.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
