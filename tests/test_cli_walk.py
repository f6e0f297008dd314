"""Every command with the bad values a user can type: one line on stderr and the documented exit code.

Never exit 70 (an internal error), never a traceback. The walk covers each
command's options with values out of range or of the wrong kind (the cases
issue 26 found included: `demo --max-turns 2` to 7, Ctrl-D at the erase
prompt, bad `serve` options that reached its workers), and a bogus option for
every command the parser has, so a new command is walked too. A client closes
quietly whatever state its connection is in.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import convmem
from convmem.adapters import EmbeddedNatsServer, MemoryService
from convmem.adapters.frontends.cli._main import build_parser, main
from convmem.events import ConversationTurn, MemoryKey

KEY = MemoryKey("acme", "alice", "chat-1")


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No NATS or convmem settings from the environment; the data folder is a missing one of the test's."""
    for name in ("NATS_URL", "CONVMEM_NATS_URL", "CONVMEM_SUMMARIZER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONVMEM_DATA_DIR", str(tmp_path / "no-store"))
    monkeypatch.chdir(tmp_path)
    yield
    assert not (tmp_path / "no-store").exists(), "a command that failed made a data folder"


def walked(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "internal error" not in err, err
    return code, err


def one_line(err: str) -> None:
    assert err.count("\n") == 1, err
    assert err.startswith("convmem: error: "), err


def commands() -> list[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", commands())
def test_every_command_refuses_an_unknown_option_in_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = walked(capsys, [command, "--no-such-option"])
    assert code == 2
    one_line(err)


BAD = {
    "global": [
        (["--timeout", "0", "sessions"], 2),
        (["--timeout", "soon", "sessions"], 2),
        (["--timeout", "inf", "sessions"], 2),
        (["--timeout", "1e12", "sessions"], 2),
        (["-s", "memory://", "sessions", "--timeout", "1e12"], 2),
        (["-s", "not-a-url", "sessions"], 5),
        (["-s", "memory://", "--data-dir", "x", "sessions", "--tenant", "t", "--user"], 2),
    ],
    "demo": [
        (["demo", "--max-turns", "1"], 2),
        (["demo", "--max-turns", "0"], 2),
        (["demo", "--max-turns", "many"], 2),
        (["demo", "--sessions", "0"], 2),
        (["demo", "--sessions", "-3"], 2),
        (["demo", "--planners", "0"], 2),
        (["demo", "--seed", "x"], 2),
    ],
    "replay": [
        (["replay", "no-colons"], 2),
        (["replay", "a:b"], 2),
        (["replay", KEY.composite(), "--position", "0"], 2),
        (["replay", KEY.composite(), "--position", "-1"], 2),
        (["replay", KEY.composite(), "--time", "yesterday"], 2),
        (["replay", KEY.composite(), "--position", "1", "--time", "1"], 2),
        (["replay", KEY.composite(), "--from-file", "missing.jsonl"], 5),
    ],
    "verify": [
        (["verify"], 2),
        (["verify", "--user", "alice"], 2),
        (["verify", "bad-key"], 2),
        (["verify", "--all", "--from-file", "missing.jsonl"], 5),
    ],
    "export": [
        (["export", "--user", "alice"], 2),
        (["export", "--key", "bad"], 2),
    ],
    "erase": [
        (["erase"], 2),
        (["erase", "--key", "bad"], 2),
        (["erase", "--tenant", "acme"], 2),
        (["erase", "--user", "alice"], 2),
        (["erase", "--key", KEY.composite(), "--user", "alice", "--tenant", "acme"], 2),
    ],
    "inspect": [
        (["inspect", "bad"], 2),
        (["inspect", KEY.composite(), "--since", "later"], 2),
        (["inspect", KEY.composite(), "--until", "2026-13-45"], 2),
        (["inspect", KEY.composite(), "--from-file", "missing.jsonl"], 5),
    ],
    "sessions": [
        (["sessions", "--limit", "0"], 2),
        (["sessions", "--limit", "some"], 2),
        (["sessions", "--user", "alice"], 2),
    ],
    "fork": [
        (["fork", KEY.composite()], 2),
        (["fork", "bad", "--to", "a:b:c"], 2),
        (["fork", KEY.composite(), "--to", "bad"], 2),
        (["fork", KEY.composite(), "--to", "a:b:c", "--position", "0"], 2),
        (["fork", KEY.composite(), "--to", "a:b:c", "--time", "noon"], 2),
    ],
    "timeline": [
        (["timeline", KEY.composite()], 2),
        (["timeline", "bad", "-o", "x.html"], 2),
        (["timeline", KEY.composite(), "-o", "x.html", "--from-file", "missing.jsonl"], 5),
    ],
    "serve": [
        (["serve", "--max-live-sessions", "0"], 2),
        (["serve", "--actor-threads", "0"], 2),
        (["serve", "--summarizer-workers", "0"], 2),
        (["serve", "--summarizer-workers", "-2"], 2),
        (["serve", "--replicas", "0"], 2),
        (["serve", "--replicas", "9"], 2),
        (["serve", "--workers", "0"], 2),
        (["serve", "--port", "0"], 2),
        (["serve", "--port", "70000"], 2),
        (["serve", "--port", "http"], 2),
        (["serve", "--metrics-port", "0"], 2),
        (["serve", "--metrics-port", "65535", "--workers", "2"], 2),
        (["serve", "--port", "4333", "--nats", "nats://127.0.0.1:4222"], 2),
        (["serve", "--total-tokens", "5"], 2),
        (["serve", "--total-tokens", "lots"], 2),
        (["serve", "--api-prefix", "convmem.>"], 2),
        (["serve", "--api-prefix", "two words"], 2),
        (["serve", "--summarizer", "gpt"], 2),
        (["serve", "--queue-group", "a b"], 2),
        (["serve", "--actor-threads", "100000000"], 2),
        (["serve", "--summarizer-workers", "1000000000"], 2),
        (["serve", "--workers", "1000000000"], 2),
        (["serve", "--timeout", "1e12"], 2),
        (["serve", "--queue-group", "a.b"], 2),
        (["serve", "--queue-group", ""], 2),
        (["serve", "--summarizer", "openai"], 2),  # no API key
        (["serve", "--config", "missing.json"], 5),
        (["serve", "--nats", "memory://"], 2),
    ],
    "status": [
        (["status"], 2),
        (["status", "--expect", "0"], 2),
        (["status", "--discover", "0"], 2),
        (["status", "--discover", "1e12", "-s", "nats://127.0.0.1:4222"], 2),
        (["status", "--timeout", "1e12", "-s", "nats://127.0.0.1:4222"], 2),
        (["status", "-s", "nats://127.0.0.1:4222", "--api-prefix", "a b"], 5),
    ],
}


@pytest.mark.parametrize(
    ("argv", "code"),
    [case for cases in BAD.values() for case in cases],
    ids=[f"{name}-{n}" for name, cases in BAD.items() for n in range(len(cases))],
)
def test_a_bad_value_is_one_line_and_its_exit_code(
    argv: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    got, err = walked(capsys, argv)
    assert got == code, err
    one_line(err)


def test_the_walk_covers_every_command_of_this_issue() -> None:
    issue = {
        "demo",
        "replay",
        "verify",
        "export",
        "erase",
        "inspect",
        "sessions",
        "fork",
        "timeline",
        "serve",
    }
    assert set(BAD) >= {*issue, "status"}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CONVMEM_PORT", "abc"),
        ("CONVMEM_PORT", "0"),
        ("CONVMEM_METRICS_PORT", "web"),
        ("CONVMEM_WORKERS", "0"),
        ("CONVMEM_MAX_LIVE_SESSIONS", "0"),
        ("CONVMEM_ACTOR_THREADS", "-1"),
        ("CONVMEM_SUMMARIZER_WORKERS", "none"),
        ("CONVMEM_REPLICAS", "7"),
        ("CONVMEM_TOTAL_TOKENS", "x"),
        ("CONVMEM_SUMMARIZER", "bogus"),
        ("CONVMEM_WORKERS", "1000000000"),
        ("CONVMEM_ACTOR_THREADS", "100000000"),
        ("CONVMEM_QUEUE_GROUP", "a b"),
        ("CONVMEM_QUEUE_GROUP", "convmem.>"),
        ("CONVMEM_API_PREFIX", "two words"),
    ],
)
def test_a_bad_environment_setting_is_one_line(
    variable: str, value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    code, err = walked(capsys, ["serve"])
    assert code == 2
    one_line(err)
    assert variable in err


@pytest.mark.parametrize(
    ("variable", "value"),
    [("CONVMEM_WORKERS", "abc"), ("CONVMEM_PORT", "99999"), ("CONVMEM_SUMMARIZER", "bogus")],
)
@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--version"], 0), (["--help"], 0), (["serve", "--help"], 0), (["-s", "memory://", "sessions"], 3)],
)
def test_a_bad_serve_variable_is_only_serves_concern(
    variable: str,
    value: str,
    argv: list[str],
    expected: int,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The serve variables are checked when `serve` runs: other commands, --help, --version ignore them."""
    monkeypatch.setenv(variable, value)
    code, err = walked(capsys, argv)
    assert code == expected, err
    assert variable not in err


def test_a_serve_variable_given_as_a_flag_is_not_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flag wins over its variable: a bad variable the flag overrides is never checked."""
    monkeypatch.setenv("CONVMEM_SUMMARIZER", "bogus")
    code, err = walked(capsys, ["serve", "--summarizer", "extractive", "--nats", "memory://"])
    assert code == 2
    assert "CONVMEM_SUMMARIZER" not in err
    assert "serve needs NATS" in err


@pytest.mark.parametrize("max_turns", ["2", "5", "7"])
def test_the_demo_plays_short_conversations(max_turns: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --max-turns 2` to 7 plays conversations of that length (it exited 70 before)."""
    code, err = walked(
        capsys, ["-s", "memory://", "demo", "--max-turns", max_turns, "--sessions", "2", "--json"]
    )
    assert code == 0, err


class EndOfInput(io.StringIO):
    """A terminal on which the user pressed Ctrl-D at once."""

    def isatty(self) -> bool:
        return True


def test_ctrl_d_at_the_erase_prompt_declines(
    nats_server: EmbeddedNatsServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """End of input at the prompt is no: exit 6, nothing erased."""
    with convmem.connect(nats_server.url) as memory:
        memory.session(KEY).add_turn(ConversationTurn(user_message="keep me", assistant_response="ok"))
    monkeypatch.setattr("sys.stdin", EndOfInput(""))
    code, err = walked(capsys, ["-s", nats_server.url, "erase", "--key", KEY.composite()])
    assert code == 6, err
    assert "not erased" in err
    assert main(["-s", nats_server.url, "replay", KEY.composite(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["turns"] == 1


def test_clients_close_quietly_after_the_server_died(tmp_path: Path) -> None:
    """The service and a planner's connection close without raising once nats-server is gone (SIGKILL)."""
    server = EmbeddedNatsServer(tmp_path / "store").start()
    try:
        system = convmem.connect(server.url)
        service = MemoryService(system, server.url)
        service.start()
        remote = convmem.connect_remote(server.url, timeout=5.0)
        remote.session(KEY).add_turn(ConversationTurn(user_message="hi", assistant_response="ok"))
        server.kill()
        remote.close()
        service.stop()
        system.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "setting",
    [{"timeout": 1e12}, {"timeout": float("nan")}, {"actor_threads": 10**8}, {"summarizer_workers": 10**9}],
)
def test_connect_refuses_an_unbounded_setting(setting: dict[str, float]) -> None:
    """A wait past a day or a thread count past the bound is InvalidConfig, before anything starts."""
    with pytest.raises(convmem.InvalidConfig):
        convmem.connect("memory://", **setting)  # type: ignore[arg-type]
