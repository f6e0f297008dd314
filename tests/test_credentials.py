"""Credentials files, nkeys and TLS with client certificates, on real nats-servers configured for each."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats_auth import Creds, TlsFiles, make_creds, make_nkey, make_tls

import convmem
from convmem.adapters import EmbeddedNatsServer, MemoryService, NatsAuth, RemoteSession
from convmem.adapters.frontends.cli._main import main
from convmem.errors import LogUnavailable
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig

KEY = MemoryKey("acme", "alice", "chat-1")
CONFIG = ShortTermMemoryConfig(strategy="truncation")
WAIT = 60.0


def turn(text: str) -> ConversationTurn:
    return ConversationTurn(user_message=text, assistant_response="ok")


def recent(memory: convmem.MemorySystem, key: MemoryKey = KEY) -> list[str]:
    context = memory.session(key).get_llm_context()
    return [t["user"] for t in context.get("conversation_memory", {}).get("recent_turns", [])]


@pytest.fixture
def creds(tmp_path: Path) -> Iterator[tuple[EmbeddedNatsServer, Creds]]:
    """An operator-mode server (JWT accounts) and a user's credentials file."""
    made = make_creds(tmp_path / "creds")
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=made.server_config) as server:
        yield server, made


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[EmbeddedNatsServer, TlsFiles]]:
    """A server that speaks TLS only and requires a client certificate signed by its CA."""
    files = make_tls(tmp_path / "tls")
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=files.server_block()) as server:
        yield server, files


@pytest.fixture
def nkey(tmp_path: Path) -> Iterator[tuple[EmbeddedNatsServer, Path]]:
    """A server whose one user is known by its public nkey; yields it and the seed file."""
    key = make_nkey()
    seed = tmp_path / "user.nk"
    seed.write_text(key.seed, encoding="utf-8")
    config = f"authorization {{ users: [ {{ nkey: {key.public} }} ] }}"
    with EmbeddedNatsServer(tmp_path / "nats", extra_config=config) as server:
        yield server, seed


def test_a_credentials_file_from_python_the_environment_and_the_cli(
    creds: tuple[EmbeddedNatsServer, Creds],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """connect(auth=NatsAuth(creds=...)), NATS_URL + NATS_CREDS alone, and `--creds` all reach the log."""
    server, made = creds
    with convmem.connect(server.url, config=CONFIG, auth=NatsAuth(creds=made.creds_file)) as memory:
        memory.session(KEY).add_turn(turn("by creds"))
    monkeypatch.setenv("NATS_URL", server.url)
    monkeypatch.setenv("NATS_CREDS", made.creds_file)
    with convmem.connect(config=CONFIG) as memory:  # as the nats CLI: everything from the environment
        assert recent(memory) == ["by creds"]
    monkeypatch.delenv("NATS_CREDS")
    with pytest.raises(LogUnavailable):
        convmem.connect(config=CONFIG, timeout=2)
    code = main(["sessions", "--json", "-s", server.url, "--creds", made.creds_file])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [row["key"] for row in json.loads(out)] == [KEY.composite()]


def test_serve_and_a_remote_client_with_credentials_files(
    creds: tuple[EmbeddedNatsServer, Creds], tmp_path: Path
) -> None:
    """`convmem serve --creds` answers a RemoteSession that has credentials too; no seed is logged."""
    server, made = creds
    ready, errors = tmp_path / "ready", tmp_path / "serve.err"
    with open(errors, "wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "convmem",
                "serve",
                "-s",
                server.url,
                "--creds",
                made.creds_file,
                "--ready-file",
                str(ready),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        while not ready.exists():
            try:
                code = proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"serve exited with {code}: {errors.read_text()}")
        with RemoteSession(server.url, KEY, auth=NatsAuth(creds=made.creds_file)) as session:
            assert session.add_turn(turn("through the service")) == 1
            assert [t["user_message"] for t in session.to_dict()["turns"]] == ["through the service"]
    finally:
        proc.terminate()
        proc.wait(WAIT)
    assert made.user_seed not in errors.read_text()


def test_tls_with_client_certificates(
    tls: tuple[EmbeddedNatsServer, TlsFiles], capsys: pytest.CaptureFixture[str]
) -> None:
    """The log, the service and its client, and the CLI connect with --tlsca/--tlscert/--tlskey."""
    server, files = tls
    auth = NatsAuth(tls_ca=files.ca, tls_cert=files.client_cert, tls_key=files.client_key)
    with convmem.connect(server.url, config=CONFIG, auth=auth) as memory:
        memory.session(KEY).add_turn(turn("over TLS"))
        with (
            MemoryService(memory, server.url, auth=auth),
            RemoteSession(server.url, KEY, auth=auth) as remote,
        ):
            assert remote.add_turn(turn("remote over TLS")) == 2
    tls_flags = ["--tlsca", files.ca, "--tlscert", files.client_cert, "--tlskey", files.client_key]
    code = main(["-s", server.url, *tls_flags, "replay", KEY.composite(), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["turns"] == 2
    # Without the client certificate the server refuses: one line, exit 4.
    code = main(["-s", server.url, "--tlsca", files.ca, "--timeout", "2", "replay", KEY.composite()])
    _, err = capsys.readouterr()
    assert code == 4
    assert err.count("\n") == 1


def test_tls_from_a_coroutine(tls: tuple[EmbeddedNatsServer, TlsFiles]) -> None:
    """connect_here takes the same TLS settings."""
    server, files = tls
    auth = NatsAuth(tls_ca=files.ca, tls_cert=files.client_cert, tls_key=files.client_key)

    async def planner() -> int:
        memory = await convmem.connect_here(server.url, config=CONFIG, auth=auth)
        try:
            return await memory.session(KEY).aio.add_turn(turn("async over TLS"))
        finally:
            await memory.aclose()

    assert asyncio.run(planner()) == 1


def test_an_nkey_seed_file(nkey: tuple[EmbeddedNatsServer, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A user known by its public nkey connects with its seed file (Python and --nkey); a stranger cannot."""
    server, seed = nkey
    with convmem.connect(server.url, config=CONFIG, auth=NatsAuth(nkey=str(seed))) as memory:
        memory.session(KEY).add_turn(turn("by nkey"))
    code = main(["inspect", KEY.composite(), "--json", "--nkey", str(seed), "-s", server.url])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [row["type"] for row in json.loads(out)] == ["session.started", "turn.added"]
    stranger = seed.with_name("stranger.nk")
    stranger.write_text(make_nkey().seed, encoding="utf-8")
    code = main(["-s", server.url, "--nkey", str(stranger), "--timeout", "2", "replay", KEY.composite()])
    _, err = capsys.readouterr()
    assert code == 4
    assert stranger.read_text() not in err


def test_a_missing_credentials_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """A credentials, seed or certificate file that cannot be read is a one-line error naming it."""
    for flag in ("--creds", "--nkey", "--tlsca"):
        code = main(["-s", "nats://127.0.0.1:1", flag, "/nonexistent/file", "replay", "a:b:c"])
        _, err = capsys.readouterr()
        assert code == 5
        assert "/nonexistent/file" in err
        assert err.count("\n") == 1
