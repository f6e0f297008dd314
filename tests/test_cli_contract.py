"""The command line's contract: global options anywhere, every exit code, one-line errors, no secret shown."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

import convmem
from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.frontends.cli import _inspect as inspect_module
from convmem.adapters.frontends.cli._common import EXIT_CODES
from convmem.adapters.frontends.cli._main import build_parser, main
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

KEY = MemoryKey("acme", "alice", "chat-1")
SECRET = "hunter2-ZQXJ7"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> None:
    assert err.count("\n") == 1, err
    assert err.startswith("convmem: error: "), err
    assert "Traceback" not in err


@pytest.fixture
def seeded(nats_server: EmbeddedNatsServer) -> str:
    with convmem.connect(nats_server.url, config=ShortTermMemoryConfig(strategy="truncation")) as memory:
        for n in range(3):
            memory.session(KEY).add_turn(ConversationTurn(user_message=f"q{n}", assistant_response="a"))
    return nats_server.url


def subcommands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", subcommands())
def test_every_help_lists_the_global_options(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`convmem CMD --help` shows where the log lives and how to authenticate."""
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    for option in ("--server", "--data-dir", "--timeout", "--creds", "--nkey", "--tlsca", "--inbox-prefix"):
        assert option in out, f"{command} --help lacks {option}"


def test_global_options_work_before_and_after_the_subcommand(
    seeded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--nats, -s and --server are taken on either side of the subcommand; after it wins."""
    before = run(capsys, "--nats", seeded, "replay", KEY.composite(), "--json")
    after = run(capsys, "replay", KEY.composite(), "--json", "--nats", seeded)
    short = run(capsys, "replay", KEY.composite(), "-s", seeded, "--json")
    overridden = run(capsys, "--server", "nats://127.0.0.1:1", "replay", KEY.composite(), "--server", seeded)
    assert before[0] == after[0] == short[0] == overridden[0] == 0
    assert json.loads(before[1]) == json.loads(after[1]) == json.loads(short[1])


def test_nats_url_from_the_environment(
    seeded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NATS_URL is read as the nats CLI reads it."""
    monkeypatch.delenv("CONVMEM_NATS_URL", raising=False)
    monkeypatch.setenv("NATS_URL", seeded)
    code, out, _ = run(capsys, "replay", KEY.composite(), "--json")
    assert code == 0
    assert json.loads(out)["turns"] == 3


# -- every exit code ------------------------------------------------------------------------


def test_exit_0_done(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A command that did its job exits 0."""
    assert run(capsys, "-s", seeded, "verify", "--all")[0] == 0


def test_exit_1_verification_failed(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A poison event makes verify exit 1."""

    async def poison() -> None:
        client = await nats.connect(seeded)
        await client.jetstream().publish("convmem.ev." + ".".join(KEY.tokens()), b"\xc1 not an event")
        await client.close()

    asyncio.run(poison())
    assert run(capsys, "-s", seeded, "verify", "--all")[0] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["verify"],
        ["--timeout", "-1", "verify", "--all"],
        ["verify", "--all", "--timeout", "0"],
        ["replay"],
        ["replay", "only-one-part"],
        ["nosuchcommand"],
        ["inspect", "a:b:c", "--since", "yesterday"],
        ["export", "--user", "alice"],
        ["erase", "--tenant", "acme"],
        ["sessions", "--limit", "0"],
    ],
)
def test_exit_2_bad_arguments_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad arguments exit 2 with one line that says what is wrong."""
    code, _, err = run(capsys, "-s", "memory://", *argv)
    assert code == 2
    one_line_error(err)


def test_exit_3_nothing_there(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown key, or a scope with no events, exits 3: export too, not silence."""
    for argv in (
        ["replay", "acme:nobody:x"],
        ["inspect", "acme:nobody:x"],
        ["export", "--tenant", "nobody"],
        ["sessions", "--tenant", "nobody"],
        ["erase", "--key", "acme:nobody:x", "--yes"],
    ):
        code, out, err = run(capsys, "-s", seeded, *argv)
        assert code == 3, argv
        assert out == ""
        one_line_error(err)
    code, out, err = run(capsys, "--data-dir", "/proc/nope", "verify", "--all")  # a read creates no store
    assert code == 3
    assert "no convmem store at /proc/nope" in err
    one_line_error(err)


def test_exit_4_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    """A server nobody answers exits 4 (the log and the service alike)."""
    for argv in (["verify", "--all"], ["status"]):
        code, _, err = run(capsys, "-s", "nats://127.0.0.1:1", "--timeout", "1", *argv)
        assert code == 4, argv
        one_line_error(err)


def test_exit_5_bad_input_files(seeded: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A file that cannot be written or read, or holds no events, exits 5 in one line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    for argv in (
        ["-s", seeded, "export", "-o", "/nonexistent/x.jsonl"],
        ["replay", KEY.composite(), "--from-file", str(bad)],
        ["verify", "--all", "--from-file", str(tmp_path / "missing.jsonl")],
    ):
        code, _, err = run(capsys, *argv)
        assert code in (4, 5), argv
        one_line_error(err)


def test_exit_6_the_erase_prompt_declined(
    seeded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt answered with anything but the key exits 6, erases nothing, shows the key as typed."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal("no\n"))
    code, out, _ = run(capsys, "-s", seeded, "erase", "--key", KEY.composite())
    assert code == 6
    assert f"Type {KEY.composite()} to confirm" in out
    assert "MemoryKey(" not in out
    assert run(capsys, "-s", seeded, "replay", KEY.composite())[0] == 0


def test_exit_70_and_130(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug is one line with exit 70; Ctrl-C exits 130."""

    def broken(_args: object) -> int:
        raise RuntimeError("a bug\nwith two lines")

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect_module, "cmd_sessions", broken)
    code, _, err = run(capsys, "-s", "memory://", "sessions")
    assert code == 70
    one_line_error(err)
    monkeypatch.setattr(inspect_module, "cmd_sessions", interrupted)
    assert run(capsys, "-s", "memory://", "sessions")[0] == 130


def test_the_exit_code_table_is_the_readme_s() -> None:
    """The README's table lists exactly the codes the CLI uses, with the same meanings."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    rows = {
        int(line.split("|")[1]): line.split("|")[2].strip()
        for line in readme.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    }
    assert rows == EXIT_CODES


# -- no traceback anywhere -------------------------------------------------------------------


BAD_INPUT = {
    "demo": ["--sessions", "0"],
    "replay": ["a:b"],
    "verify": ["a:b:c", "--from-file", "/nonexistent"],
    "inspect": ["a:b:c", "--type", "nope"],
    "export": ["--key", "a:b"],
    "erase": ["--key", "x"],
    "sessions": ["--user", "u"],
    "serve": ["--config", "/nonexistent.toml"],
    "status": ["--api-prefix", "a b"],
    "fork": ["a:b:c", "--to", "bad"],
    "timeline": ["a:b"],
    "retention": ["--dry-run", "--policy", "/nonexistent.toml"],
    "keys": ["rotate", "--new-master-key-file", "/nonexistent.key"],
    "repair": ["a:b"],
    "restore": ["a:b"],
}


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_with_bad_input_fails_in_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each subcommand given bad input exits with a code of the table and one line, no traceback."""
    code, _, err = run(capsys, "-s", "memory://", command, *BAD_INPUT[command])
    assert code in EXIT_CODES
    assert code != 0
    one_line_error(err)


# -- no secret printed -----------------------------------------------------------------------


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A nats-server that wants a user and password."""
    server = EmbeddedNatsServer(
        tmp_path / "nats", extra_config=f'authorization {{ user: ops, password: "{SECRET}" }}'
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_no_password_in_errors_or_output(
    password_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A password in the URL is never printed: not by status, replay, inspect, nor any error."""
    good = password_server.url.replace("nats://", f"nats://ops:{SECRET}@")
    wrong = password_server.url.replace("nats://", "nats://ops:wrong-ZQXJ7@")
    dead = f"nats://ops:{SECRET}@127.0.0.1:1"
    for argv in (
        ["-s", good, "replay", KEY.composite()],
        ["-s", good, "inspect", KEY.composite()],
        ["-s", good, "status"],
        ["-s", wrong, "verify", "--all"],
        ["-s", dead, "--timeout", "1", "status"],
        ["-s", dead, "--timeout", "1", "verify", "--all"],
        ["-s", password_server.url, "--nats-user", "ops", "--nats-password", SECRET, "erase", "--key", "a"],
    ):
        code, out, err = run(capsys, *argv)
        assert code != 0
        assert SECRET not in out + err + caplog.text, argv
        assert "wrong-ZQXJ7" not in out + err + caplog.text, argv
    code, _, err = run(capsys, "-s", dead, "--timeout", "1", "status")
    assert "nats://ops:***@127.0.0.1:1" in err


def test_read_only_commands_never_create_the_stream(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """replay, verify, inspect, export and sessions on an empty server exit 3 and create nothing."""
    for argv in (
        ["replay", KEY.composite()],
        ["verify", "--all"],
        ["inspect", KEY.composite()],
        ["export"],
        ["sessions"],
    ):
        code, _, err = run(capsys, "-s", nats_server.url, *argv)
        assert code == 3, argv
        assert "no stream" in err
        one_line_error(err)

    async def streams() -> list[str]:
        client = await nats.connect(nats_server.url)
        try:
            reply = await client.request("$JS.API.STREAM.NAMES", b"{}")
            return list(json.loads(reply.data).get("streams") or [])
        finally:
            await client.close()

    assert asyncio.run(streams()) == []


def test_the_demo_counts_are_the_same_for_the_same_seed(capsys: pytest.CaptureFixture[str]) -> None:
    """Two demo runs with one --seed store the same turns, events and summaries (only rates differ)."""
    runs = []
    for _ in range(2):
        code, out, _ = run(capsys, "demo", "--sessions", "3", "--max-turns", "8", "--seed", "11", "--json")
        assert code == 0
        report = json.loads(out)
        runs.append({k: report[k] for k in ("sessions", "turns", "events", "summaries", "verified")})
    assert runs[0] == runs[1]
