"""An embedded nats-server and its runtime folder (conf, log, a reader's store copy) end with their owner.

The owner is the Python process that started the server. Whichever way it
ends (its exit without `stop`, SIGTERM, kill -9), neither the server process
nor the ``convmem-nats-*`` folder outlives it: a watcher process stops the
server and removes the folder once the owner's pipe to it closes, and a folder
that escaped even that (the owner and everything it started killed at once,
as a machine dies) is swept by the next start, which removes only folders
whose marker names an owner that is dead. A store folder is never removed.

Each owner runs with a temporary folder of its own (TMPDIR), so the runs of
other processes on the machine neither count here nor get swept.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.backends.jetstream import _watcher
from convmem.adapters.backends.jetstream._embedded import running_server_url

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits on processes by pidfd (Linux)")

WAIT = 60.0
"""A bound on each wait, never reached when things work."""

OWNER = """
import json, os, sys
from convmem.adapters import EmbeddedNatsServer
server = EmbeddedNatsServer(sys.argv[1]).start()
if sys.argv[2:] == ["fork"]:  # a child forked after the start, which ends normally (its exit handlers run)
    child = os.fork()
    if child == 0:
        sys.exit(0)
    os.waitpid(child, 0)
print(json.dumps({"server": server.pid, "runtime": str(server.log_path.parent)}), flush=True)
sys.stdin.read()
"""
"""A program that starts an embedded server, says where, and waits; it never stops the server itself."""


def ended(pidfd: int, wait: float) -> bool:
    """Whether the process behind `pidfd` has ended, waiting up to `wait` seconds for it."""
    return bool(select.select([pidfd], [], [], wait)[0])


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


@dataclass
class Owner:
    """A running `OWNER` and what it started, each held by a pidfd (opened while it was alive)."""

    proc: subprocess.Popen[str]
    server: int
    runtime: Path
    started: dict[int, int] = field(default_factory=dict)
    """pid -> pidfd of each process the owner started (the server, and whatever watches it)."""

    def kill_what_it_started(self) -> None:
        for pidfd in self.started.values():
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        for pid, pidfd in self.started.items():
            assert ended(pidfd, WAIT), f"process {pid} did not end on SIGKILL"

    def wait_for_what_it_started(self) -> None:
        for pid, pidfd in self.started.items():
            what = "the server" if pid == self.server else f"process {pid}, which the owner started,"
            assert ended(pidfd, WAIT), f"{what} outlived its owner (still running after {WAIT:g}s)"


@pytest.fixture
def temp(tmp_path: Path) -> Path:
    """The temporary folder the owners of a test use (their TMPDIR)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


@pytest.fixture
def owners(temp: Path) -> Iterator[list[Owner]]:
    """Owners `start` adds; any still running at the end is killed by pid, with what it started."""
    started: list[Owner] = []
    yield started
    for owner in started:
        if owner.proc.poll() is None:
            owner.proc.kill()
        owner.proc.communicate(timeout=WAIT)
        for pidfd in owner.started.values():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)


def start(owners: list[Owner], temp: Path, store: Path, *args: str) -> Owner:
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(store), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the owner exited with {proc.wait(WAIT)} before its server started"
    said = json.loads(line)
    owner = Owner(proc, said["server"], Path(said["runtime"]))
    owners.append(owner)
    # The owner is alive and has reaped none of them: each pid is certainly the process it started.
    owner.started = {pid: os.pidfd_open(pid) for pid in children(proc.pid)}
    assert owner.server in owner.started
    assert owner.runtime.parent == temp
    assert owner.runtime.name.startswith("convmem-nats-")
    assert (owner.runtime / "nats-server.conf").is_file()
    return owner


def runtime_folders(temp: Path) -> list[str]:
    return sorted(p.name for p in temp.glob("convmem-nats-*"))


def assert_store_intact_and_free(store: Path) -> None:
    """The store folder is there with its JetStream store, no server holds it, and a new one starts on it."""
    assert (store / "jetstream").is_dir()
    assert running_server_url(store) is None
    with EmbeddedNatsServer(store) as again:
        assert again.running


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill -9", "SIGTERM"])
def test_an_owner_killed_leaves_neither_its_server_nor_its_runtime_folder(
    owners: list[Owner], temp: Path, tmp_path: Path, signum: signal.Signals
) -> None:
    """kill -9 (or a SIGTERM it does not handle) of the process holding an embedded server: the server
    ends and the runtime folder is removed, with nobody left to call `stop`; the store stays."""
    store = tmp_path / "store"
    owner = start(owners, temp, store)
    owner.proc.send_signal(signum)
    assert owner.proc.wait(WAIT) == -signum
    owner.wait_for_what_it_started()
    assert runtime_folders(temp) == []
    assert_store_intact_and_free(store)


def test_an_owner_that_exits_without_stopping_its_server_leaves_no_runtime_folder(
    owners: list[Owner], temp: Path, tmp_path: Path
) -> None:
    """A program that ends normally with its server still running: its exit stops the server and
    removes the folder before the program is gone (nothing is left to wait for)."""
    store = tmp_path / "store"
    owner = start(owners, temp, store)
    owner.proc.communicate(timeout=WAIT)  # closes its stdin: the program ends
    assert owner.proc.returncode == 0
    assert runtime_folders(temp) == []
    for pid, pidfd in owner.started.items():
        assert ended(pidfd, 0), f"process {pid} outlived the program that started it"
    assert_store_intact_and_free(store)


def test_a_forked_child_that_exits_leaves_its_parents_server_and_folder_alone(
    owners: list[Owner], temp: Path, tmp_path: Path
) -> None:
    """A child forked from the owner inherits its servers but does not own them: its exit stops none
    and removes no folder, and the watcher still acts when the owner dies afterwards."""
    owner = start(owners, temp, tmp_path / "store", "fork")
    assert owner.runtime.is_dir()
    assert not ended(owner.started[owner.server], 0)
    owner.proc.kill()
    owner.proc.wait(WAIT)
    owner.wait_for_what_it_started()
    assert runtime_folders(temp) == []


def test_a_runtime_folder_left_by_a_dead_owner_is_swept_by_the_next_start_and_nothing_else(
    owners: list[Owner], temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner and all it started killed at once (nothing got to clean up): the next start removes
    that folder, and only it: not a live owner's folder, not a folder or link of the same name that
    this code did not make, not a store folder whose name matches."""
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    dead = start(owners, temp, temp / "convmem-nats-store-a")
    live = start(owners, temp, temp / "convmem-nats-store-b")
    dead.kill_what_it_started()  # the server and its watcher first: none of them sees the owner die
    dead.proc.kill()
    dead.proc.wait(WAIT)
    assert dead.runtime.is_dir()  # the leak: nobody was left to remove it

    foreign = temp / "convmem-nats-foreign"
    foreign.mkdir()
    (foreign / "nats-server.conf").write_text("a folder this code did not make\n")
    elsewhere = temp / "elsewhere"
    shutil.copytree(dead.runtime, elsewhere)  # even with the dead owner's marker in it
    (temp / "convmem-nats-link").symlink_to(elsewhere, target_is_directory=True)
    copied = sorted(p.name for p in elsewhere.iterdir())
    before = set(runtime_folders(temp))

    with EmbeddedNatsServer(temp / "convmem-nats-store-c") as fresh:
        assert fresh.running
        assert not dead.runtime.exists()
        assert fresh.log_path is not None
        made = {fresh.log_path.parent.name, "convmem-nats-store-c"}
        assert set(runtime_folders(temp)) == (before - {dead.runtime.name}) | made
        assert live.runtime.is_dir()
        assert sorted(p.name for p in elsewhere.iterdir()) == copied
        assert (foreign / "nats-server.conf").is_file()
    assert (temp / "convmem-nats-store-a" / "jetstream").is_dir()
    assert (temp / "convmem-nats-store-b" / "jetstream").is_dir()

    live.proc.communicate(timeout=WAIT)
    assert not live.runtime.exists()
    kept = ["convmem-nats-foreign", "convmem-nats-link", *(f"convmem-nats-store-{n}" for n in "abc")]
    assert runtime_folders(temp) == sorted(kept)


# The watcher alone, on a stand-in for the server ------------------------------------------


@pytest.mark.parametrize("by", ["pidfd", "pid"])
@pytest.mark.parametrize("owner_ends", ["stops its server", "dies"])
def test_the_watcher_acts_only_when_its_owner_dies(tmp_path: Path, by: str, owner_ends: str) -> None:
    """Told `done`, the watcher leaves everything as it is; its pipe closed without it (the owner
    died), it stops the server and removes the runtime folder (by pidfd, or by pid where none)."""
    runtime = tmp_path / "convmem-nats-x"
    (runtime / "store").mkdir(parents=True)
    stand_in = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    pidfd = os.pidfd_open(stand_in.pid)
    try:
        args = [str(runtime), str(stand_in.pid)]
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", _watcher.__file__, *args, *([str(pidfd)] if by == "pidfd" else [])],
            stdin=subprocess.PIPE,
            pass_fds=(pidfd,) if by == "pidfd" else (),
        )
        watcher.communicate(_watcher.DONE if owner_ends == "stops its server" else b"", timeout=WAIT)
        assert watcher.returncode == 0
        if owner_ends == "stops its server":
            assert stand_in.poll() is None
            assert (runtime / "store").is_dir()
        else:
            assert stand_in.wait(WAIT) == -signal.SIGTERM
            assert not runtime.exists()
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
        stand_in.communicate(timeout=WAIT)
        os.close(pidfd)
