"""The three-node NATS cluster of docker/compose.yaml, run on loopback for the tests.

The node configurations are not written here: they are the files under
docker/ (``nats-cluster/n1.conf`` .. ``n3.conf``, which include
``nats-cluster/cluster.conf`` and ``nats-tenants.conf``), copied per node
into a folder of its own with only the addresses rewritten: the client,
monitoring and route ports to free loopback ports, the route hosts
(``nats-1`` ..) to 127.0.0.1, the store to the test's tmp_path. Every rewrite
must match exactly as often as expected, so a change to the docker files
that the tests could not follow fails loudly instead of drifting.

`NatsCluster` starts the three servers, waits on facts (each node's
``/healthz``, a JetStream meta leader in ``/jsz``), kills one with SIGKILL and
brings it back on its store, and stops every process it started, by pid.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from convmem.adapters.backends.jetstream._embedded import find_nats_server

__all__ = [
    "CLUSTER_CONF",
    "COMPOSE",
    "DOCKER",
    "NODES",
    "TENANTS_CONF",
    "NatsCluster",
    "Process",
    "compose_environment",
    "exits_early",
    "free_port",
    "node_configs",
    "remap_urls",
    "wait_for",
]

T = TypeVar("T")

DOCKER = Path(__file__).resolve().parent.parent / "docker"
COMPOSE = DOCKER / "compose.yaml"
TENANTS_CONF = DOCKER / "nats-tenants.conf"
CLUSTER_CONF = DOCKER / "nats-cluster" / "cluster.conf"
NODES = ("n1", "n2", "n3")
"""Server names; node ``nK`` is compose service ``nats-K`` with config ``nats-cluster/nK.conf``."""


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(fact: Callable[[], T | None], *, timeout: float, what: str, pause: Callable[[], object]) -> T:
    """Poll `fact` until it returns something other than None/False; `pause` runs between polls.

    `pause` is a bounded wait on something real (a process, an HTTP round
    trip), never a sleep; the deadline turns a fact that never holds into a
    failure naming it.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = fact()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        pause()


def _substitute(text: str, pattern: str, replacement: str, count: int, where: str) -> str:
    out, found = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    if found != count:
        raise AssertionError(f"{where}: {pattern!r} matched {found} times, expected {count}")
    return out


def node_configs(
    root: Path, ports: dict[str, tuple[int, int, int]], stores: dict[str, Path]
) -> dict[str, Path]:
    """Per node, a copy of the docker files under ``root/<node>`` with addresses rewritten.

    `ports` gives each node its (client, monitoring, route) ports. Returns
    the path of each node's main configuration (its ``nK.conf``).
    """
    tenants = TENANTS_CONF.read_text(encoding="utf-8")
    cluster = CLUSTER_CONF.read_text(encoding="utf-8")
    out = {}
    for node in NODES:
        client, monitor, route = ports[node]
        base = root / node
        (base / "nats-cluster").mkdir(parents=True, exist_ok=True)
        text = _substitute(tenants, r"^listen: .*$", f'listen: "127.0.0.1:{client}"', 1, "nats-tenants.conf")
        text = _substitute(text, r"^http: .*$", f'http: "127.0.0.1:{monitor}"', 1, "nats-tenants.conf")
        store = json.dumps(str(stores[node]))
        text = _substitute(text, r"^(\s*)store_dir: .*$", rf"\g<1>store_dir: {store}", 1, "nats-tenants.conf")
        (base / "nats-tenants.conf").write_text(text, encoding="utf-8")
        text = _substitute(
            cluster,
            r'^(\s*)listen: "0\.0\.0\.0:6222"$',
            rf'\g<1>listen: "127.0.0.1:{route}"',
            1,
            "cluster.conf",
        )
        for peer, (_, _, peer_route) in ports.items():
            text = _substitute(
                text, rf"@nats-{peer[1:]}:6222\"", f'@127.0.0.1:{peer_route}"', 1, "cluster.conf routes"
            )
        (base / "nats-cluster" / "cluster.conf").write_text(text, encoding="utf-8")
        main = DOCKER / "nats-cluster" / f"{node}.conf"
        text = main.read_text(encoding="utf-8")  # copied as it is: it holds no address
        if not re.search(rf"^server_name: {node}$", text, re.MULTILINE):
            raise AssertionError(f"{main.name} does not name its server {node}")
        out[node] = base / "nats-cluster" / main.name
        out[node].write_text(text, encoding="utf-8")
    return out


def compose_environment(service: str) -> dict[str, str]:
    """The environment docker/compose.yaml gives `service` (anchors and merge keys resolved).

    A value naming a file the service mounts from docker/ (CONVMEM_CONFIG) names that file here.
    """
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    environment = compose["services"][service].get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    mounts = {}
    for volume in compose["services"][service].get("volumes") or []:
        source, _, rest = str(volume).partition(":")
        if source.startswith("./"):
            mounts[rest.split(":")[0]] = str(DOCKER / source[2:])
    return {str(k): mounts.get(str(v), str(v)) for k, v in environment.items()}


def remap_urls(urls: str, clients: dict[str, int]) -> str:
    """Compose's comma-separated ``nats://user:pass@nats-K:4222`` URLs, pointed at loopback ports."""
    out = []
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        match = re.fullmatch(r"nats-(\d)", host)
        if match is None or parts.port != 4222:
            raise AssertionError(f"compose URL {url!r} is not nats://...@nats-K:4222")
        netloc = parts.netloc.rsplit("@", 1)
        auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
        out.append(f"{parts.scheme}://{auth}127.0.0.1:{clients[f'n{match.group(1)}']}")
    return ",".join(out)


def _http_json(port: int, path: str, timeout: float = 1.0) -> dict[str, Any] | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        value: dict[str, Any] = json.loads(body)
        return value
    except (OSError, ValueError):
        return None
    finally:
        connection.close()


class NatsCluster:
    """Three nats-server processes running the docker configurations on loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {node: (free_port(), free_port(), free_port()) for node in NODES}
        self.stores = {node: root / "data" / node for node in NODES}
        self.configs = node_configs(root / "conf", self.ports, self.stores)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._binary = find_nats_server()

    # Addresses ------------------------------------------------------------------------------

    @property
    def clients(self) -> dict[str, int]:
        return {node: ports[0] for node, ports in self.ports.items()}

    def url(self, node: str, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"nats://{auth}127.0.0.1:{self.ports[node][0]}"

    def log(self, node: str) -> Path:
        return self.root / f"{node}.log"

    # Processes ------------------------------------------------------------------------------

    def start(self, node: str) -> None:
        """Start `node` on its store (a first start, or a restart after `kill`)."""
        assert node not in self.procs, f"{node} is running"
        self.stores[node].mkdir(parents=True, exist_ok=True)
        with open(self.log(node), "ab") as log:
            self.procs[node] = subprocess.Popen(
                [str(self._binary), "-c", str(self.configs[node])],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def start_all(self, timeout: float = 30.0) -> float:
        """Start every node; returns the seconds until all are healthy with a meta leader."""
        began = time.monotonic()
        for node in NODES:
            self.start(node)
        for node in NODES:
            self.wait_healthy(node, timeout)
        self.wait_meta_leader(timeout)
        return time.monotonic() - began

    def kill(self, node: str) -> None:
        """SIGKILL `node`, as a crash would; its store stays for `start`."""
        proc = self.procs.pop(node)
        proc.kill()
        proc.wait(10)

    def stop(self) -> None:
        """Stop every node still running (SIGTERM, then SIGKILL), by pid."""
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def pause(self, node: str | None = None) -> Callable[[], object]:
        """Between polls: wait briefly on a node process (a crash ends the wait early)."""

        def pause() -> None:
            proc = self.procs.get(node) if node else next(iter(self.procs.values()), None)
            if proc is None:
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=0.05)
                raise AssertionError(f"nats-server {node} exited with {code}:\n{self.tail(node or '')}")

        return pause

    def tail(self, node: str, lines: int = 30) -> str:
        path = self.log(node)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    # Facts ----------------------------------------------------------------------------------

    def jsz(self, node: str, query: str = "") -> dict[str, Any] | None:
        """`node`'s /jsz monitoring report (None when it does not answer)."""
        return _http_json(self.ports[node][1], f"/jsz{query}")

    def healthy(self, node: str) -> bool:
        report = _http_json(self.ports[node][1], "/healthz")
        return report is not None and report.get("status") == "ok"

    def wait_healthy(self, node: str, timeout: float = 30.0) -> None:
        wait_for(lambda: self.healthy(node), timeout=timeout, what=f"{node} healthy", pause=self.pause(node))

    def meta_leader(self, node: str) -> str | None:
        """The JetStream meta leader `node` knows of (None: none yet, or no answer)."""
        report = self.jsz(node)
        if report is None:
            return None
        leader = (report.get("meta_cluster") or {}).get("leader")
        return str(leader) if leader else None

    def wait_meta_leader(self, timeout: float = 30.0) -> str:
        """A meta leader that every running node agrees on."""

        def agreed() -> str | None:
            leaders = {self.meta_leader(node) for node in self.procs}
            return leaders.pop() if len(leaders) == 1 and None not in leaders else None

        return wait_for(agreed, timeout=timeout, what="a JetStream meta leader", pause=self.pause())

    def stream(self, node: str, name: str) -> dict[str, Any] | None:
        """`node`'s own view of stream `name` (state and cluster) from /jsz, or None."""
        report = self.jsz(node, "?accounts=true&streams=true")
        for account in (report or {}).get("account_details") or ():
            for stream in account.get("stream_detail") or ():
                if stream.get("name") == name:
                    found: dict[str, Any] = stream
                    return found
        return None

    def stream_leader(self, name: str, among: tuple[str, ...] | None = None) -> str | None:
        """The leader of stream `name` that every node in `among` (default: the running ones) reports."""
        leaders = set()
        for node in among or tuple(self.procs):
            info = self.stream(node, name)
            leaders.add(((info or {}).get("cluster") or {}).get("leader"))
        return leaders.pop() if len(leaders) == 1 and None not in leaders else None

    def wait_stream_leader(self, name: str, timeout: float = 30.0, *, not_on: str | None = None) -> str:
        def elected() -> str | None:
            leader = self.stream_leader(name)
            return leader if leader != not_on else None

        return wait_for(elected, timeout=timeout, what=f"a leader of stream {name}", pause=self.pause())

    def last_seq(self, node: str, name: str) -> int | None:
        """The last sequence of `node`'s own replica of stream `name`."""
        info = self.stream(node, name)
        return None if info is None else int(info["state"]["last_seq"])

    # Context manager ------------------------------------------------------------------------

    def __enter__(self) -> NatsCluster:
        try:
            self.start_all()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _in_session(sid: int) -> list[int]:
    """The processes of session `sid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
    return found


class Process:
    """A child process whose stdout lines are collected, with their arrival time, by a reader thread.

    stderr goes to a file (a full pipe would stall the child). `stop` kills
    it by pid if it still runs and closes everything; call it in teardown.
    With `group`, it leads a session of its own (a `convmem serve`, its workers
    and an embedded server, each of those in a process group of its own within
    the session): `freeze` and `kill` then reach every process of the session, as
    a hung or dead machine would, and `stop` kills what is left of it.
    """

    def __init__(
        self, argv: list[str], *, stderr: Path, env: dict[str, str] | None = None, group: bool = False
    ) -> None:
        self.argv = argv
        self.stderr_path = stderr
        self.lines: list[tuple[float, str]] = []
        self.group = group
        self._changed = threading.Condition()
        with open(stderr, "ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                start_new_session=group,
            )
        self._reader = threading.Thread(target=self._read, name=f"reader-{self.proc.pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def count(self, word: str) -> int:
        with self._changed:
            return sum(1 for _, line in self.lines if line.startswith(word + " "))

    def wait_lines(self, word: str, at_least: int, timeout: float) -> bool:
        """Whether `at_least` lines starting with `word` arrived within `timeout` (woken per line)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(1 for _, line in self.lines if line.startswith(word + " ")) < at_least:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    return False
                self._changed.wait(min(left, 0.5))
            return True

    def finish(self, timeout: float) -> int:
        """Wait for the process to exit and its output to be read; its exit code."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code

    def _signal(self, signum: int) -> None:
        if not self.group:
            os.kill(self.proc.pid, signum)
            return
        for pid in _in_session(self.proc.pid):  # the session this process leads (its id is its pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def freeze(self) -> None:
        """SIGSTOP: the process holds its connections but answers nothing, as a hung machine."""
        self._signal(signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self._signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; close the pipe. Idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.group:
            self._signal(signal.SIGKILL)  # a worker that outlived its supervisor
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr_tail(self, lines: int = 30) -> str:
        text = (
            self.stderr_path.read_text(encoding="utf-8", errors="replace")
            if self.stderr_path.exists()
            else ""
        )
        return "\n".join(text.splitlines()[-lines:])


def exits_early(process: Process, what: str) -> Callable[[], None]:
    """A pause between polls that fails at once if `process` has exited."""

    def pause() -> None:
        try:
            code = process.proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            return
        raise AssertionError(f"{what} exited with {code}:\n{process.stderr_tail()}")

    return pause
