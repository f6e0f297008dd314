"""Output that cannot attack its reader: no raw control character and no credential reaches a terminal.

Turns holding terminal escapes (clear screen, window title, OSC 52 clipboard
writes, OSC 8 links), C1 controls, carriage returns and bidi overrides are
stored, then every command that prints stored or given text runs: stdout and
stderr hold no raw control character (newline and tab aside), and the JSON
outputs still decode to the stored text. A NATS password holding ``@``, ``:``
and ``/`` is given every way a user can give it, and every output path (CLI
errors, ``status``, ``serve``'s start line and ready file, Python exception
messages and reprs, logs) is searched for any piece of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_auth import make_creds

import convmem
from convmem.actors import MemorySystem
from convmem.adapters import EmbeddedNatsServer, InMemoryEventLog, MemoryService, RemoteMemory, redact_url
from convmem.adapters._auth import NatsAuth, scrub, url_secrets
from convmem.adapters.backends.summarizers import OpenAIChatSummarizer
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._safe import SafeStream, json_text, visible
from convmem.adapters.frontends.service._status import service_status
from convmem.errors import ConvmemError, SummarizerError
from convmem.events import ConversationTurn, EntityMention, MemoryKey, ShortTermMemoryConfig, TrajectoryDigest

WAIT = 60.0
KEY = MemoryKey("acme", "alice", "hostile")
HOSTILE = (
    "\x1b[2J\x1b[H cleared",  # clear the screen
    "\x1b]0;owned\x07 title",  # window title
    "\x1b]52;c;ZXZpbA==\x07 clipboard",  # OSC 52 clipboard write
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 link
    "\x9b31m C1 CSI \x9d0;t\x9c",  # 8-bit CSI and OSC
    "line\roverwritten \x7f\x08\x00x".replace("\x00", ""),
    "bidi \u202eevil\u202c \u2066iso\u2069 \u200f",
    "new\nline \u2028 sep",
)
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What no output may hold raw: every control character but newline and tab."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_harmless(output: str, what: object) -> None:
    found = _RAW.search(output)
    assert found is None, (
        f"{what}: raw {found.group()!r} in {output[max(0, found.start() - 40) : found.end() + 40]!r}"
    )


def read_jsonl(path: Path) -> list[object]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def strings(value: object) -> Iterator[str]:
    """Every string in a decoded JSON document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


# Control characters ---------------------------------------------------------------------------


def test_visible_escapes_every_control_character_and_nothing_else() -> None:
    """C0, DEL, C1, bidi controls and line separators become escapes; text, accents and emoji stay."""
    assert visible("a\x1b[2Jb\x9b\u202e\t\n\r\x7f") == "a\\x1b[2Jb\\x9b\\u202e\\t\\n\\r\\x7f"
    assert visible("tab\tline\n\x07", lines=True) == "tab\tline\n\\x07"
    assert visible("héllo wörld 日本 🎉 <b>&") == "héllo wörld 日本 🎉 <b>&"
    for text in HOSTILE:
        assert_harmless(visible(text), text)
        assert json.loads(json_text(json.dumps(text, ensure_ascii=False))) == text  # JSON keeps it exactly


@pytest.fixture
def hostile(nats_server: EmbeddedNatsServer) -> str:
    """A session whose turns, artifacts, entities, digest and items hold every hostile text."""
    config = ShortTermMemoryConfig(strategy="truncation")
    with convmem.connect(nats_server.url, config=config) as memory:
        session = memory.session(KEY)
        for n, text in enumerate(HOSTILE):
            session.add_turn(
                ConversationTurn(
                    user_message=text,
                    assistant_response=f"answer {n}: {text}",
                    artifacts_shown={"note": text},
                    entities=(EntityMention(name=f"E{n}", attributes={"said": text}),),
                    trajectory_digest=TrajectoryDigest(tools_invoked=("search",), observations_summary=text),
                )
            )
    return nats_server.url


def test_no_cli_output_path_writes_a_raw_control_character(
    hostile: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """inspect, replay, sessions, export, verify, fork and errors: escapes only, JSON that decodes exactly."""
    exported = tmp_path / "export.jsonl"
    paths: list[list[str]] = [
        ["inspect", KEY.composite()],
        ["inspect", KEY.composite(), "--json"],
        ["inspect", KEY.composite(), "--full"],
        ["replay", KEY.composite()],
        ["replay", KEY.composite(), "--json"],
        ["sessions"],
        ["sessions", "--json"],
        ["export", "--key", KEY.composite()],
        ["export", "--key", KEY.composite(), "--output", str(exported)],
        ["verify", KEY.composite()],
        ["fork", KEY.composite(), "--to", "acme:alice:forked"],
        ["timeline", KEY.composite(), "--output", str(tmp_path / "t.html")],
        ["replay", "acme:ali\x1b]0;owned\x07ce:s"],  # given text in an error
        ["inspect", KEY.composite(), "--type", "\x1b[2J\u202e"],
        ["replay", KEY.composite(), "--time", "\x1b]52;c;eA==\x07"],
    ]
    texts = 0
    for argv in paths:
        code, out, err = run(capsys, "-s", hostile, *argv)
        assert_harmless(out + err, argv)
        assert (code == 0) == (argv not in paths[-3:]), (argv, err)
        if "--json" in argv and code == 0:
            documents = (
                [json.loads(line) for line in out.splitlines()] if "--lines" in argv else [json.loads(out)]
            )
            texts += sum(any(text in found for found in strings(documents)) for text in HOSTILE)
        if argv[0] == "export" and "--output" not in argv:
            lines = [json.loads(line) for line in out.splitlines()]
            assert any(HOSTILE[2] in found for found in strings(lines))
    assert texts >= len(HOSTILE)  # the JSON outputs carry the stored text exactly, escaped the JSON way
    assert any(HOSTILE[0] in found for found in strings(read_jsonl(exported)))  # a file export as before


def test_a_log_line_of_a_serve_worker_cannot_carry_raw_controls(capsys: pytest.CaptureFixture[str]) -> None:
    """The guard covers anything written to stderr, a log line quoting a tenant's subject too."""
    stream = SafeStream(sys.stderr, secret_free=True)
    handler = logging.StreamHandler(stream)  # type: ignore[arg-type]
    log = logging.getLogger("convmem.test.safety")
    log.propagate = False  # only this handler (a command run before may have left its own on the root)
    log.addHandler(handler)
    try:
        log.error("request on %s not answered", "convmem.api.v1.\x1b]0;x\x07.add_turn nats://u:p@ss@h")
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert_harmless(err, "log")
    assert "p@ss" not in err
    assert "\\x1b]0;x\\x07" in err


# Credentials ----------------------------------------------------------------------------------

SECRET = "h0rse@batt3ry:st4ple-7731"
"""A password with ``@`` and ``:`` that nats-py can send in a URL."""
SLASHED = "c0rrect/b4ttery@h0rse:st4ple,9"
"""A password with ``/``, ``@``, ``:`` and ``,``, given where a URL cannot carry it, or to a dead server."""
PIECES = ("h0rse", "batt3ry", "st4ple", "c0rrect", "b4ttery", "t0ken-s3cret")


def assert_secret_free(output: str, what: object) -> None:
    for piece in PIECES:
        assert piece not in output, f"{what}: {piece!r} shown in {output!r}"


@pytest.fixture
def guarded_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A nats-server whose one user, convmem, has the hostile password."""
    server = EmbeddedNatsServer(
        tmp_path / "nats", extra_config=f'authorization {{ user: convmem, password: "{SECRET}" }}'
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_one_redaction_hides_credentials_whole() -> None:
    """scrub/redact_url: any character in a password, tokens, URLs without a scheme, seeds, JWTs."""
    for url in (
        f"nats://convmem:{SECRET}@host:4222",
        f"convmem:{SECRET}@host:4222",
        f"nats://convmem:{SLASHED}@host:4222",
        f"tls://a:{SECRET}@h1:4222,nats://b:{SLASHED}@h2:4222",
        "nats://t0ken-s3cret@host",
        "t0ken-s3cret@host:4222",
    ):
        assert_secret_free(redact_url(url), url)
        assert_secret_free(scrub(f"cannot connect to {url}: refused", url_secrets(url)), url)
        assert "host" in redact_url(url) or "h1" in redact_url(url)
    assert redact_url(f"nats://convmem:{SECRET}@host:4222") == "nats://convmem:***@host:4222"
    assert redact_url("nats://host:4222") == "nats://host:4222"
    assert_secret_free(repr(NatsAuth(user="convmem", password=SLASHED, token="t0ken-s3cret")), "NatsAuth")


def test_a_summarizer_url_with_a_password_is_never_shown() -> None:
    """The OpenAI-compatible summarizer's repr and errors show its URL with the password hidden."""
    summarizer = OpenAIChatSummarizer(
        base_url=f"http://convmem:{SECRET}@127.0.0.1:1/v1", api_key="sk-t0ken-s3cret-key", timeout=1
    )
    shown = [repr(summarizer)]
    with pytest.raises(SummarizerError) as failed:
        summarizer({"turns": [{"user": "q", "assistant": "a"}], "previous_summary": ""})
    shown.append(str(failed.value))
    for text in shown:
        assert_secret_free(text, text)
        assert "convmem:***@127.0.0.1:1" in text


def test_creds_contents_are_hidden(tmp_path: Path) -> None:
    """A credentials file's seed and JWT are hidden wherever its contents would be printed."""
    creds = make_creds(tmp_path)
    contents = Path(creds.creds_file).read_text(encoding="utf-8")
    shown = scrub(f"bad credentials: {contents}")
    assert creds.user_seed not in shown
    assert "eyJ" not in shown
    assert "BEGIN USER NKEY SEED" in shown  # the frame stays, saying what was hidden


def _python_errors(url: str) -> list[str]:
    """The messages of the Python API's errors and reprs for a URL that cannot be reached."""
    shown: list[str] = []
    try:
        convmem.connect(url, timeout=1)
    except ConvmemError as exc:
        shown.append(str(exc))
    try:
        with RemoteMemory(url, timeout=1) as remote:
            remote.session(KEY).add_turn(ConversationTurn(user_message="q", assistant_response="a"))
    except ConvmemError as exc:
        shown.append(str(exc))
    with MemorySystem(log=InMemoryEventLog()) as system:
        service = MemoryService(system, url, connect_timeout=1)
        shown.append(repr(service))
        try:
            service.start()
        except ConvmemError as exc:
            shown.append(str(exc))
    try:
        asyncio.run(service_status(url, api_prefix="convmem.api", timeout=1))
    except ConvmemError as exc:
        shown.append(str(exc))
    assert len(shown) >= 4, shown
    return shown


@pytest.mark.slow  # ~20 s: serve, status and the CLI as processes (`.ci/run` runs it)
def test_no_output_path_shows_a_hostile_password(
    guarded_server: EmbeddedNatsServer,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """serve's start line and ready file, status, CLI errors, Python errors and logs: no piece of it."""
    port = guarded_server.url.rsplit(":", 1)[1]
    good = f"nats://convmem:{SECRET}@127.0.0.1:{port}"
    outputs: list[tuple[object, str]] = []
    ready = tmp_path / "ready"
    with open(tmp_path / "serve.err", "wb") as err_file:
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "convmem",
                "-s",
                good,
                "serve",
                "--workers",
                "1",
                "--ready-file",
                str(ready),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        while not ready.exists():
            try:  # waiting on the process doubles as the pause between checks
                code = serve.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"serve exited with {code}: {(tmp_path / 'serve.err').read_text()}")
        outputs.append(("ready file", ready.read_text(encoding="utf-8")))
        assert ready.read_text(encoding="utf-8") == f"nats://convmem:***@127.0.0.1:{port}"
        for url in (good, f"convmem:{SECRET}@127.0.0.1:{port}"):
            code, out, err = run(capsys, "-s", url, "status")
            assert code == 0, err
            outputs.append((("status", url), out + err))
    finally:
        serve.terminate()
        serve.wait(WAIT)
    start_line = (tmp_path / "serve.err").read_text(encoding="utf-8")
    assert f"at nats://convmem:***@127.0.0.1:{port}" in start_line
    outputs.append(("serve stderr", start_line))
    dead = [
        f"nats://convmem:{SLASHED}@127.0.0.1:1",
        f"convmem:{SLASHED}@127.0.0.1:1",
        f"convmem:{SECRET}@127.0.0.1:1",
        "nats://t0ken-s3cret@127.0.0.1:1",
    ]
    for url in dead:
        for argv in (["status"], ["replay", KEY.composite()], ["sessions"]):
            code, out, err = run(capsys, "-s", url, "--timeout", "1", *argv)
            assert code != 0
            outputs.append(((url, argv), out + err))
        outputs.extend(((url, "python"), text) for text in _python_errors(url))
    wrong = f"nats://convmem:{SLASHED}@127.0.0.1:{port}"  # the server refuses it
    code, out, err = run(capsys, "-s", wrong, "--timeout", "1", "sessions")
    outputs.append(("refused", out + err))
    given = ["-s", f"nats://127.0.0.1:{port}", "--nats-user", "convmem", "--nats-password", SLASHED]
    code, out, err = run(capsys, *given, "--timeout", "1", "sessions")
    outputs.append(("--nats-password", out + err))
    outputs.append(("logs", caplog.text))
    for what, text in outputs:
        assert_secret_free(text, what)
