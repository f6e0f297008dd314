"""Real nats-server processes for the tests: never skipped, always stopped.

`nats_server` starts a fresh server (JetStream, loopback, a free port, a
store under the test's tmp_path) for one test; it starts in a few tens of
milliseconds, so isolation costs little. `nats_server_shared` is one server
for the whole run, for suites that keep to names of their own
(`jetstream_names`). A missing binary fails the test loudly: the durable
adapters are never silently untested.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from convmem.adapters import EmbeddedNatsServer

__all__ = [
    "JetStreamNames",
    "frozen",
    "jetstream_names",
    "nats_server",
    "nats_server_shared",
    "start_nats_server",
]


def start_nats_server(store_dir: Path) -> EmbeddedNatsServer:
    """Start a server on `store_dir`; the caller stops it (the fixtures do so in teardown)."""
    return EmbeddedNatsServer(store_dir).start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A nats-server for this test only, stopped by pid in teardown even when the test failed."""
    server = start_nats_server(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    """One nats-server for the whole run; tests on it use `jetstream_names` to stay apart."""
    server = start_nats_server(tmp_path_factory.mktemp("nats-shared"))
    try:
        yield server
    finally:
        server.stop()


class JetStreamNames(msgspec.Struct, frozen=True):
    """A stream, subject prefix and bucket that no other test uses."""

    stream: str
    prefix: str
    bucket: str


@pytest.fixture
def jetstream_names() -> JetStreamNames:
    """Fresh stream, prefix and bucket names for one test."""
    tag = uuid.uuid4().hex[:12]
    return JetStreamNames(stream=f"EV_{tag}", prefix=f"t{tag}.ev", bucket=f"SNAP_{tag}")


def _all_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (so it answers nothing)."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("T", "t"):
                return False
    return True


@contextlib.contextmanager
def frozen(server: EmbeddedNatsServer, timeout: float = 15.0) -> Iterator[None]:
    """SIGSTOP the server and wait until all its threads are stopped; SIGCONT on the way out.

    `kill` returns before a busy process has stopped: a publish sent at once
    may still be answered. Waiting for the fact keeps "no answer" certain: the
    server is this process's child, and the kernel reports its stop to us
    (`waitid`) once the last of its threads has stopped.
    """
    pid = server.pid
    assert pid is not None, "the server is not running"
    os.kill(pid, signal.SIGSTOP)
    try:
        reported = threading.Thread(target=os.waitid, args=(os.P_PID, pid, os.WSTOPPED), daemon=True)
        reported.start()
        reported.join(timeout)
        assert not reported.is_alive(), f"nats-server {pid} did not stop within {timeout:g}s"
        assert _all_stopped(pid), f"nats-server {pid} was reported stopped with a thread still running"
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
