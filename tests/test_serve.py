"""`convmem serve` as a real process: its workers, status while serving, clean shutdown on a signal mid-load.

`convmem serve` runs as many worker processes as the machine has cores
unless told otherwise (`--workers`); each is a replica in `convmem status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from convmem.actors import load_state
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, RemoteMemory
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX, SLOTS
from convmem.adapters.frontends.service._status import service_status
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey

WAIT = 60.0
T = TypeVar("T")


class Serve:
    """A `convmem serve` child process on a given NATS server, stopped by pid in teardown."""

    def __init__(self, url: str, tmp: Path, *argv: str) -> None:
        self.ready = tmp / "ready"
        self.stderr_path = tmp / "serve.err"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "convmem",
                    "--nats",
                    url,
                    "serve",
                    "--ready-file",
                    str(self.ready),
                    *argv,
                ],
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


@pytest.mark.slow  # `serve` with its worker processes, 10 s and more (`.ci/run` runs it)
def test_status_reports_health_and_metrics_of_a_running_service(
    serve: Serve, nats_server: EmbeddedNatsServer
) -> None:
    """`convmem status --json` answers with each worker's health and counters; one worker took the turn."""
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
    replicas = json.loads(done.stdout)["replicas"]
    assert len(replicas) == len(os.sched_getaffinity(0))  # --workers defaults to the cores
    assert all(r["health"]["status"] == "ok" for r in replicas)
    assert sorted(r["metrics"]["turns"] for r in replicas) == [0] * (len(replicas) - 1) + [1]


@pytest.mark.parametrize(
    "signum",
    [
        signal.SIGTERM,
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),
    ],  # the same path: SIGINT in `.ci/run`
)
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


def workers(url: str) -> dict[int, dict[str, Any]]:
    """What each worker of the running serve says of itself, by index (workers not answering: absent)."""
    replicas = asyncio.run(service_status(url, api_prefix=DEFAULT_API_PREFIX, timeout=5.0, discover=0.5))
    return {r.health["worker"]["index"]: r.health["worker"] for r in replicas if r.ok and r.health}


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(fact: Callable[[], T | None], what: str, proc: subprocess.Popen[bytes]) -> T:
    """Poll `fact` until it holds; waiting on the serve process between polls (its exit fails the test)."""
    deadline = time.monotonic() + WAIT
    while True:
        value = fact()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {WAIT:g}s"
        with contextlib.suppress(subprocess.TimeoutExpired):
            pytest.fail(f"convmem serve exited with {proc.wait(timeout=0.1)}")


@pytest.mark.slow  # `serve` with its worker processes, 10 s and more (`.ci/run` runs it)
def test_serve_runs_its_workers_restarts_a_dead_one_and_stops_them_all(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """`--workers 2`: two processes sharing the partitions; kill -9 of one brings it back under the same
    id with a new pid; SIGTERM stops both (exit 0) and every acknowledged turn is in the log."""
    serve = Serve(nats_server.url, tmp_path, "--workers", "2")
    try:

        def sharing() -> dict[int, dict[str, Any]] | None:
            found = workers(nats_server.url)
            return (
                found if sorted(found) == [0, 1] and all(w["members"] == 2 for w in found.values()) else None
            )

        seen = wait_for(sharing, "both workers sharing the partitions", serve.proc)
        assert sorted(w["partitions"] for w in seen.values()) == [SLOTS // 2, SLOTS // 2]
        pids = {i: w["pid"] for i, w in seen.items()}
        assert serve.proc.pid not in pids.values()
        assert len(set(pids.values())) == 2
        keys = [MemoryKey("acme", "alice", f"s{i}") for i in range(12)]
        with RemoteMemory(nats_server.url, timeout=WAIT) as remote:
            for key in keys:
                remote.session(key).add_turn(ConversationTurn(user_message="one", assistant_response="ok"))
            os.kill(pids[0], signal.SIGKILL)

            def restarted() -> dict[str, Any] | None:
                found = workers(nats_server.url).get(0)
                return found if found is not None and found["pid"] != pids[0] else None

            back = wait_for(restarted, "worker 0 started again", serve.proc)
            assert back["serve"] == seen[0]["serve"]
            assert "worker 0" in serve.stderr()
            assert "starting it again" in serve.stderr()
            for key in keys:  # served again, whichever worker owns each now
                remote.session(key).add_turn(ConversationTurn(user_message="two", assistant_response="ok"))
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(WAIT) == 0, serve.stderr()
        assert not any(alive(pid) for pid in (back["pid"], pids[1]))
    finally:
        serve.stop()
    with JetStreamBackend.connect(nats_server.url) as backend:
        for key in keys:
            state, _ = load_state(backend.log, None, key)
            assert [r.turn.user_message for r in state.turns] == ["one", "two"]


def test_serve_refuses_a_bad_worker_count(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "convmem", "serve", "--workers", "0"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert "--workers" in done.stderr
    assert "must be 1 or more" in done.stderr


def test_workers_stop_when_their_supervisor_is_killed(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """kill -9 of `convmem serve` itself: its workers get SIGTERM from the kernel and stop, none orphaned."""
    serve = Serve(nats_server.url, tmp_path, "--workers", "1")
    worker: dict[str, Any] = {"pid": -1}
    try:
        worker = wait_for(lambda: workers(nats_server.url).get(0), "the worker answering", serve.proc)
        serve.proc.kill()
        serve.proc.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while alive(worker["pid"]):
            assert time.monotonic() < deadline, "the worker outlived its supervisor"
            threading.Event().wait(0.05)
    finally:
        serve.stop()
        if alive(worker["pid"]):
            os.kill(worker["pid"], signal.SIGKILL)
