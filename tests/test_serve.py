"""`convmem serve` as a real process: status while serving, clean shutdown on a signal mid-load."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from convmem.actors import load_state
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, RemoteMemory
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey

WAIT = 60.0


class Serve:
    """A `convmem serve` child process on a given NATS server, stopped by pid in teardown."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.ready = tmp / "ready"
        self.stderr_path = tmp / "serve.err"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "convmem", "--nats", url, "serve", "--ready-file", str(self.ready)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        while not self.ready.exists():
            try:  # waiting on the process doubles as the pause between checks
                code = self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"convmem serve exited with {code}: {self.stderr()}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)


@pytest.fixture
def serve(nats_server: EmbeddedNatsServer, tmp_path: Path) -> Iterator[Serve]:
    process = Serve(nats_server.url, tmp_path)
    try:
        yield process
    finally:
        process.stop()


def test_status_reports_health_and_metrics_of_a_running_service(
    serve: Serve, nats_server: EmbeddedNatsServer
) -> None:
    """`convmem status --json` answers with the service's health and its counters."""
    with RemoteMemory(nats_server.url) as remote:
        remote.session(MemoryKey("acme", "alice", "s")).add_turn(
            ConversationTurn(user_message="hi", assistant_response="hello")
        )
    done = subprocess.run(
        [sys.executable, "-m", "convmem", "--nats", nats_server.url, "status", "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [replica] = json.loads(done.stdout)["replicas"]
    assert replica["health"]["status"] == "ok"
    assert replica["metrics"]["turns"] == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_load_stops_the_service_cleanly_and_loses_nothing(
    serve: Serve, nats_server: EmbeddedNatsServer, signum: signal.Signals
) -> None:
    """SIGTERM/SIGINT while planners write: exit 0, and every acknowledged turn is in the log."""
    keys = [MemoryKey("acme", "alice", f"s{i}") for i in range(8)]
    acked: dict[MemoryKey, list[str]] = {key: [] for key in keys}
    failures: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()

    def plan(key: MemoryKey) -> None:
        with RemoteMemory(nats_server.url, timeout=5.0) as remote:
            session = remote.session(key)
            for n in range(200):
                text = f"{key.session_id}-{n}"
                try:
                    session.add_turn(
                        ConversationTurn(user_message=text, assistant_response="ok"), idempotency_key=text
                    )
                except ConvmemError as exc:  # the service is gone: a clear error, never a silent loss
                    with lock:
                        failures.append(type(exc).__name__)
                    return
                with lock:
                    acked[key].append(text)
                    if sum(map(len, acked.values())) >= 100:
                        enough.set()

    threads = [threading.Thread(target=plan, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    assert enough.wait(WAIT), serve.stderr()
    serve.proc.send_signal(signum)
    assert serve.proc.wait(WAIT) == 0, serve.stderr()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    assert "stopped" in serve.stderr()
    assert failures, "requests after the stop should have failed with a clear error"
    with JetStreamBackend.connect(nats_server.url) as backend:
        for key in keys:
            state, _ = load_state(backend.log, None, key)
            stored = [r.turn.user_message for r in state.turns]
            assert stored[: len(acked[key])] == acked[key], f"{key}: an acknowledged turn is missing"
            assert len(stored) <= len(acked[key]) + 1  # at most the one in flight at the stop
