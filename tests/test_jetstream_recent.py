"""The JetStream log's waits: the writer remembers the last message of the sessions it wrote most
recently, so that a write to one of them publishes at once (a forgotten one costs a request to the
stream's leader first); creating the stream waits for a slow server longer than a write would."""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster import free_port, wait_for
from nats_fixtures import frozen

from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, JetStreamEventLog
from convmem.adapters.backends.jetstream import _read, _write
from convmem.adapters.backends.jetstream._appends import RECENT_SESSIONS, Last
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._embedded import find_nats_server
from convmem.adapters.backends.jetstream._setup import SETUP_TIMEOUT
from convmem.adapters.backends.jetstream._write import SessionWriter
from convmem.errors import LogUnavailable
from convmem.events import MemoryKey, encode_token
from convmem.testing._log_contract import events


def test_a_writer_remembers_the_last_message_of_its_recent_sessions(nats_server: EmbeddedNatsServer) -> None:
    """Tens of thousands of sessions written in turn (a service's round robin) stay known: every one
    of the newest `RECENT_SESSIONS` keeps its last message; the oldest beyond them is forgotten, and a
    session written again moves to the newest."""
    connection = NatsConnection.connect(nats_server.url)
    try:
        writer = SessionWriter(connection, "CONVMEM_EVENTS")
        subjects = [f"convmem.ev.acme.u{n % 97}.s{n}" for n in range(RECENT_SESSIONS + 2)]
        assert RECENT_SESSIONS >= 50_000  # a service writing to 10,000 sessions in turn pays no lookup
        for n, subject in enumerate(subjects[:-2]):
            writer.remember(subject, Last(n + 1, 2 * n + 1, f"e{n}"))
        writer.remember(subjects[0], Last(7, RECENT_SESSIONS * 4, "again"))  # written again: newest now
        for n, subject in enumerate(subjects[-2:]):
            writer.remember(subject, Last(1, RECENT_SESSIONS * 4 + n + 1, f"late{n}"))
        assert writer.known(subjects[0]) == Last(7, RECENT_SESSIONS * 4, "again")
        assert writer.known(subjects[1]) is None  # the two oldest left for the two newest
        assert writer.known(subjects[2]) is None
        assert writer.known(subjects[3]) == Last(4, 7, "e3")
        assert writer.known(subjects[-1]) == Last(1, RECENT_SESSIONS * 4 + 2, "late1")
        assert sum(writer.known(s) is not None for s in subjects) == RECENT_SESSIONS
    finally:
        connection.close()


def test_a_tenant_writing_to_many_sessions_forgets_its_own_not_another_tenants(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a writer that keeps 32 sessions and a tenant (globex) that wrote to 4, when another tenant
    (acme) writes to 200 sessions, then globex's next writes still publish at once: no request to the
    stream's leader for their last message (plain least recently used forgot all 4, and each write
    asked twice first), and acme's newest sessions fill the rest."""
    monkeypatch.setattr(_write, "RECENT_SESSIONS", 32)
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    asked: list[str] = []
    api = log._conn.api

    async def counted(subject: str, payload: dict[str, object] | None = None) -> dict[str, object]:
        if subject.startswith("$JS.API.STREAM.MSG.GET.") and payload and "globex" in str(payload):
            asked.append(str(payload))
        return await api(subject, payload)

    monkeypatch.setattr(log._conn, "api", counted)
    try:
        victims = [MemoryKey("globex", "bob", f"chat-{n}") for n in range(4)]
        for key in victims:
            log.append(key, events(1), expected_seq=0)
        asked.clear()  # a first write asks for the (empty) subject's last message: not counted
        for n in range(200):
            log.append(MemoryKey("acme", f"u{n % 7}", f"s{n}"), events(1), expected_seq=0)
        for key in victims:
            assert log.append(key, events(2), expected_seq=1) == 2
        recent = log._writer._recent  # type: ignore[attr-defined]
        assert asked == []
        assert recent.held_by(encode_token("globex")) == 4
        assert recent.held_by(encode_token("acme")) == 28
        assert recent.evicted == 200 + 4 - 32
    finally:
        log.close()


def test_creating_the_stream_waits_past_a_writes_timeout_for_a_slow_server(
    nats_server: EmbeddedNatsServer,
) -> None:
    """Given a connection whose requests time out after 0.2 s and a server that stops answering as
    the stream is created (a cluster still forming the stream's group answers late as well), then
    the set-up waits (up to `SETUP_TIMEOUT`) instead of failing after 0.2 s, and the log opens once
    the server answers."""
    connection = NatsConnection.connect(nats_server.url, timeout=0.2)
    opened: list[JetStreamEventLog] = []
    failed: list[BaseException] = []

    def open_log() -> None:
        try:
            opened.append(JetStreamEventLog(connection, stream="SETUP_WAIT", prefix="setupwait"))
        except BaseException as exc:
            failed.append(exc)

    try:
        assert SETUP_TIMEOUT >= 30.0
        with frozen(nats_server):
            setting_up = threading.Thread(target=open_log, daemon=True)
            setting_up.start()
            setting_up.join(timeout=5 * connection.timeout)  # a write's timeout would have ended it
            assert setting_up.is_alive(), f"the set-up gave up: {failed}"
        setting_up.join(timeout=SETUP_TIMEOUT)
        assert not failed
        assert len(opened) == 1
        opened[0].close()
    finally:
        connection.close()


def test_a_server_without_jetstream_fails_the_set_up_at_once_and_says_so(tmp_path: Path) -> None:
    """The longer set-up wait is for an answer that comes late: a server with JetStream off answers
    "no responders" at once, and `connect` fails with `LogUnavailable` telling how to enable it,
    long before `SETUP_TIMEOUT`."""
    port = free_port()
    with (tmp_path / "nats.log").open("w") as log:
        server = subprocess.Popen(
            [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        up = "nats-server on its port"
        wait_for(lambda: _listening(port), timeout=SETUP_TIMEOUT, what=up, pause=_alive(server))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            connecting = pool.submit(JetStreamBackend.connect, f"nats://127.0.0.1:{port}")
            with pytest.raises(LogUnavailable, match="enable JetStream"):
                connecting.result(timeout=SETUP_TIMEOUT / 2)  # answered at once, not after the set-up wait
    finally:
        server.kill()
        server.wait(timeout=30)


def _alive(server: subprocess.Popen[bytes]) -> Callable[[], None]:
    """Between polls: wait briefly on the server process (its exit ends the test with its code)."""

    def pause() -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            raise AssertionError(f"nats-server exited with {server.wait(timeout=0.05)}")

    return pause


def _listening(port: int) -> bool | None:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0 or None


def test_the_sessions_written_most_recently_are_found_by_their_last_messages(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a user with 1,100 sessions written in the reverse of key order, one of them written again
    last, and another user's sessions between, then `newest_keys` gives the 1,001 written most
    recently, newest first, in one request per 1,024 sessions (their last messages, none read
    whole); a key with no event is left out."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=10.0)
    requests: list[dict[str, object]] = []
    direct_batch = _read.direct_batch

    async def counted(conn: NatsConnection, stream: str, request: dict[str, object]) -> _read.Batch:
        requests.append(request)
        return await direct_batch(conn, stream, request)

    monkeypatch.setattr(_read, "direct_batch", counted)
    try:
        ada = [MemoryKey("acme", "ada", f"s{n:04}") for n in range(1_100)]
        for n, key in enumerate(reversed(ada)):
            log.append(key, events(1), expected_seq=0)
            if n % 100 == 0:
                log.append(MemoryKey("acme", "bob", f"s{n:04}"), events(1), expected_seq=0)
        log.append(ada[500], events(2), expected_seq=1)
        never = MemoryKey("acme", "ada", "never-written")
        newest = log.newest_keys([*ada, never], limit=1_001)
        assert newest == [ada[500]] + [k for k in ada[:1_001] if k != ada[500]]
        assert len(requests) == 2
        assert all("multi_last" in r for r in requests)
    finally:
        log.close()
