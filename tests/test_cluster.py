"""The three-node cluster of docker/compose.yaml, for real: kill -9 a node or a service mid-load.

The nodes run the docker/ configuration files (see tests/cluster.py: only
addresses are rewritten), the clients use compose's URLs and environment,
and the event stream and snapshot bucket have three replicas. Sizes are
bounded by CONVMEM_FAULT_SCALE (default 1: each test takes seconds), so
`.ci/run` always runs them. Run with ``-s`` to see what was measured.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cluster import DOCKER, NatsCluster, Process, compose_environment, exits_early, remap_urls, wait_for

from convmem.actors import EventLog, load_state
from convmem.adapters import JetStreamBackend, RemoteMemory
from convmem.adapters.backends.jetstream._log import DEFAULT_STREAM
from convmem.adapters.backends.jetstream._snapshots import DEFAULT_BUCKET
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX
from convmem.adapters.frontends.service._status import service_status
from convmem.errors import ConvmemError
from convmem.events import ConversationTurn, MemoryKey, TurnAdded, decode_event
from convmem.projections import SessionState, llm_context

pytestmark = pytest.mark.soak

SCALE = max(1, int(os.environ.get("CONVMEM_FAULT_SCALE", "1")))
WORKER = Path(__file__).with_name("cluster_worker.py")
DEADLINE = 60.0
CLI = [sys.executable, "-m", "convmem"]
STREAMS = (DEFAULT_STREAM, f"KV_{DEFAULT_BUCKET}")
CLIENT_TIMEOUT = 3.0
SERVICE = "convmem-1"  # compose's first serve replica; both have the same environment


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """The three nodes, healthy with a meta leader; every one stopped by pid in teardown."""
    with NatsCluster(tmp_path) as running:
        yield running


def compose_urls(cluster: NatsCluster) -> str:
    """compose's CONVMEM_NATS_URL (the service's credentials, every node) pointed at the test nodes."""
    return remap_urls(compose_environment(SERVICE)["CONVMEM_NATS_URL"], cluster.clients)


def stored_turns(log: EventLog, key: MemoryKey) -> list[str]:
    """Every TurnAdded of `key` in the log, in order (a turn stored twice shows twice)."""
    events = (decode_event(r.data) for r in log.read(key))
    return [e.turn.user_message for e in events if isinstance(e, TurnAdded)]


def ack_gap(stamps: list[float], since: float) -> float:
    """The longest pause between consecutive acknowledgements that ends after `since`."""
    stamps = sorted(stamps)
    return max((b - a for a, b in itertools.pairwise(stamps) if b > since), default=0.0)


# A node dies ---------------------------------------------------------------------------------


class WorkerReport(msgspec.Struct):
    """What a tests/cluster_worker.py process printed."""

    acked: dict[str, list[str]]
    stamps: list[float]
    retries: Counter[str]
    states: dict[str, SessionState]
    done: bool


def read_worker(worker: Process) -> WorkerReport:
    report = WorkerReport(acked=defaultdict(list), stamps=[], retries=Counter(), states={}, done=False)
    for at, line in worker.lines:
        kind, *rest = line.split()
        if kind == "ACK":
            report.acked[rest[0]].append(rest[1])
            report.stamps.append(at)
        elif kind == "RETRY":
            report.retries[rest[2]] += 1
        elif kind == "STATE":
            report.states[rest[0]] = msgspec.msgpack.decode(base64.b64decode(rest[1]), type=SessionState)
        elif kind == "DONE":
            report.done = True
    return report


def wait_caught_up(cluster: NatsCluster, node: str, leader: str) -> None:
    """Until `node`'s replicas of the stream and the bucket hold what the leader's hold."""
    fields = ("messages", "bytes", "first_seq", "last_seq")

    def caught_up() -> bool:
        for stream in STREAMS:
            mine, theirs = cluster.stream(node, stream), cluster.stream(leader, stream)
            if mine is None or theirs is None or any(mine["state"][f] != theirs["state"][f] for f in fields):
                return False
        return True

    wait_for(caught_up, timeout=DEADLINE, what=f"{node} catching up", pause=cluster.pause(node))


def state_diff(live: SessionState, replayed: SessionState) -> str:
    """The fields where two states differ (turns compared one by one)."""
    out = []
    for field in live.__struct_fields__:
        mine, theirs = getattr(live, field), getattr(replayed, field)
        if field == "turns" and len(mine) == len(theirs):
            out += [
                f"turns[{i}]: {a!r} != {b!r}"
                for i, (a, b) in enumerate(zip(mine, theirs, strict=True))
                if a != b
            ]
        elif mine != theirs:
            out.append(f"{field}: {mine!r} != {theirs!r}")
    return "; ".join(out)


def without_turn_times(state: SessionState) -> SessionState:
    turns = tuple(msgspec.structs.replace(t, at=0.0) for t in state.turns)
    return msgspec.structs.replace(state, turns=turns, last_at=0.0)


def check_sessions(urls: str, writer: str, report: WorkerReport) -> list[str]:
    """Each session holds exactly its acknowledged turns, in order, and its live state is the replay.

    Returns the sessions whose live state differs from the replay only in
    the time of a turn: the trace of an append whose answer was lost in the
    failover and whose retry was folded as decided, not as stored (fixed: a
    command whose append was left in doubt is confirmed against the log, and
    reads are made up to the stream leader's last message). Any other
    difference fails at once.
    """
    assert report.done
    diverged = []
    with JetStreamBackend.connect(urls, replicas=3) as backend:
        for session_id, acked in report.acked.items():
            key = MemoryKey("cluster", writer, session_id)
            assert stored_turns(backend.log, key) == acked, f"{key}: stored turns are not the acked ones once"
            replayed, loaded = load_state(backend.log, None, key)
            assert not loaded.poison
            live = report.states[session_id]
            assert llm_context(live) == llm_context(replayed), f"{key}: live context is not the replay's"
            if live != replayed:
                assert without_turn_times(live) == without_turn_times(replayed), state_diff(live, replayed)
                diverged.append(f"{key}: {state_diff(live, replayed)}")
    return diverged


def test_killing_the_stream_leader_node_mid_load_loses_no_acknowledged_turn(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    """kill -9 of the R3 stream's leader: writes resume after an election, stored once; it catches up."""
    urls = compose_urls(cluster)
    JetStreamBackend.connect(urls, replicas=3).close()  # the stream and the bucket, three replicas each
    sessions, turns = 20, 100 * SCALE
    writers = ("a", "b")
    workers = [
        Process(
            [sys.executable, str(WORKER), urls, name, str(sessions), str(turns)],
            stderr=tmp_path / f"worker-{name}.err",
        )
        for name in writers
    ]
    try:
        started = [w.wait_lines("ACK", sessions * turns // 3, DEADLINE) for w in workers]
        assert all(started), "\n".join(w.stderr_tail() for w in workers)
        victim = cluster.wait_stream_leader(DEFAULT_STREAM, DEADLINE)
        killed_at = time.monotonic()
        cluster.kill(victim)
        leader = cluster.wait_stream_leader(DEFAULT_STREAM, DEADLINE, not_on=victim)
        elected = time.monotonic() - killed_at
        for worker in workers:
            assert worker.finish(DEADLINE) == 0, worker.stderr_tail()
    finally:
        for worker in workers:
            worker.stop()

    restarted_at = time.monotonic()
    cluster.start(victim)
    wait_caught_up(cluster, victim, leader)
    catch_up = time.monotonic() - restarted_at

    reports = [read_worker(worker) for worker in workers]
    diverged = []
    for writer, report in zip(writers, reports, strict=True):
        assert sum(map(len, report.acked.values())) == sessions * turns
        diverged += check_sessions(urls, writer, report)
    retries = sum((r.retries for r in reports), Counter[str]())
    assert retries, "no writer noticed the kill"
    stamps = sorted(t for r in reports for t in r.stamps)
    print(
        f"\nnode kill: killed {victim} (stream leader), new leader {leader} seen after {elected:.2f}s; "
        f"longest pause in acknowledgements {ack_gap(stamps, killed_at):.2f}s; "
        f"writer retries {dict(retries)}; {victim} restarted and caught up in {catch_up:.2f}s"
    )
    assert not diverged, diverged


# A service dies ------------------------------------------------------------------------------


def healthcheck_argv() -> list[str]:
    """The Dockerfile's HEALTHCHECK command (exec form)."""
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^HEALTHCHECK\b(?:.*\\\n)*.*?CMD (\[.*\])$", text, re.MULTILINE)
    assert match is not None
    argv: list[str] = json.loads(match.group(1))
    return argv


def serve_env(url: str, data_dir: Path) -> dict[str, str]:
    """This environment without CONVMEM_*, plus compose's for the service, with `url` for NATS.

    `data_dir` stands for the container's own folder, where its serve records its instance.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    env.update(compose_environment(SERVICE))
    env["CONVMEM_NATS_URL"] = url
    # compose's responder identity, on the same node(s) as `url`
    env["CONVMEM_API_NATS_URL"] = url.replace(
        "convmem:convmem-service-secret@", "convmem-api:convmem-api-secret@"
    )
    env["CONVMEM_DATA_DIR"] = str(data_dir)
    return env


def start_serve(url: str, tmp_path: Path, name: str) -> Process:
    """`convmem serve` as compose runs it (its workers in its process group); returns once it serves."""
    ready = tmp_path / f"{name}.ready"
    serve = Process(
        [*CLI, "serve", "--ready-file", str(ready)],
        stderr=tmp_path / f"{name}.err",
        env=serve_env(url, tmp_path / name),
        group=True,
    )
    try:
        wait_for(ready.exists, timeout=DEADLINE, what=f"{name} serving", pause=exits_early(serve, name))
    except BaseException:
        serve.stop()
        raise
    return serve


def run_healthcheck(url: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    """The image's health check, in the container (data folder) of the serve it should ask."""
    argv = healthcheck_argv()
    assert argv[0] == "convmem"
    return subprocess.run(
        [*CLI, *argv[1:]],
        env=serve_env(url, data_dir),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )


class TenantLoad:
    """Planner threads of one tenant adding turns through the service, retrying with the same key."""

    def __init__(self, remote: RemoteMemory, keys: list[MemoryKey], turns: int, threads: int) -> None:
        self.remote = remote
        self.turns = turns
        self.acked: dict[MemoryKey, list[str]] = defaultdict(list)
        self.stamps: list[float] = []
        self.retries: Counter[str] = Counter()
        self.failures: list[str] = []
        self.third = threading.Event()
        self.retried = threading.Event()
        self._total = len(keys) * turns
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._plan, args=(keys[i::threads],)) for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self._threads), "the load did not finish"

    def _plan(self, group: list[MemoryKey]) -> None:
        for n in range(self.turns):
            for key in group:
                text = f"{key.session_id}-{n}"
                if not self._add(key, text):
                    return

    def _add(self, key: MemoryKey, text: str) -> bool:
        turn = ConversationTurn(user_message=text, assistant_response="ok")
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                self.remote.session(key).add_turn(turn, timeout=CLIENT_TIMEOUT, idempotency_key=text)
                break
            except ConvmemError as exc:  # a clear error: retry with the same key
                with self._lock:
                    self.retries[type(exc).__name__] += 1
                self.retried.set()
                if time.monotonic() > deadline:
                    self.failures.append(text)
                    return False
        with self._lock:
            self.acked[key].append(text)
            self.stamps.append(time.monotonic())
            if len(self.stamps) >= self._total // 3:
                self.third.set()
        return True


def test_killing_a_serve_process_mid_load_hands_its_sessions_to_the_other(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    """kill -9 of one `convmem serve` (its workers too, as a machine dies) with requests in flight:
    the other's workers take over its partitions, nothing lost."""
    urls = compose_urls(cluster)  # both replicas exactly as compose configures them
    serves = [start_serve(urls, tmp_path, f"serve-{n}") for n in (1, 2)]
    sessions, turns = 40, 40 * SCALE
    keys = [MemoryKey("acme", f"u{i % 4}", f"s{i}") for i in range(sessions)]
    try:
        for n in (1, 2):
            assert run_healthcheck(urls, tmp_path / f"serve-{n}").returncode == 0
        # A tenant's planners: acme's credentials, on the third node, replies on acme's inbox.
        tenant = cluster.url("n3", "acme", "acme-secret")
        with RemoteMemory(tenant, inbox_prefix="_INBOX_acme", timeout=CLIENT_TIMEOUT) as remote:
            load = TenantLoad(remote, keys, turns, threads=8)
            load.start()
            try:
                assert load.third.wait(DEADLINE), "the load did not reach a third of its turns"
                # Freeze it first, so that requests are surely in flight to it when it dies: a plain
                # kill found none often enough (requests spend a millisecond or two in a serve).
                serves[0].freeze()
                assert load.retried.wait(DEADLINE), "no request reached the frozen service"
                killed_at = time.monotonic()
                serves[0].kill()
            finally:
                load.join(DEADLINE * 2)
            assert not load.failures, f"never acknowledged: {load.failures[:5]}"
            assert run_healthcheck(urls, tmp_path / "serve-2").returncode == 0  # the survivor answers
            assert run_healthcheck(urls, tmp_path / "serve-1").returncode == 4  # the dead one is seen dead
            with JetStreamBackend.connect(urls, replicas=3) as backend:
                for key in keys:
                    assert stored_turns(backend.log, key) == load.acked[key], f"{key}: not stored once"
                    state, _ = load_state(backend.log, None, key)
                    assert remote.session(key).get_llm_context() == llm_context(state), key
    finally:
        for serve in serves:
            serve.stop()

    assert sum(map(len, load.acked.values())) == sessions * turns
    assert load.retries, "no request was in flight to the killed service"
    first_after = min(t for t in load.stamps if t > killed_at) - killed_at
    print(
        f"\nserve kill: longest pause in acknowledgements {ack_gap(load.stamps, killed_at):.2f}s "
        f"(client timeout {CLIENT_TIMEOUT:g}s), first acknowledgement {first_after:.2f}s after the kill; "
        f"client retries {dict(load.retries)}"
    )


# Workers across machines ---------------------------------------------------------------------


def test_serve_workers_on_two_nodes_share_the_partitions_and_serve_each_session_from_one_process(
    cluster: NatsCluster, tmp_path: Path
) -> None:
    """`convmem serve --workers 2` on one node and `--workers 1` on another deal the partitions over
    all three workers; a tenant's planners on the third node see every turn stored once, every session
    live in exactly one process, and no write conflict (optimistic concurrency never had to step in)."""
    service_url = {node: cluster.url(node, "convmem", "convmem-service-secret") for node in ("n1", "n2")}
    JetStreamBackend.connect(compose_urls(cluster), replicas=3).close()
    serves = []
    for node, count in (("n1", "2"), ("n2", "1")):
        serve_dir = tmp_path / f"serve-{node}"
        ready = tmp_path / f"{node}.ready"
        env = {**serve_env(service_url[node], serve_dir), "CONVMEM_WORKERS": count}
        serves.append(
            Process(
                [*CLI, "serve", "--ready-file", str(ready)],
                stderr=tmp_path / f"{node}.err",
                env=env,
                group=True,
            )
        )
        wait_for(ready.exists, timeout=DEADLINE, what=f"serve on {node}", pause=exits_early(serves[-1], node))
    keys = [MemoryKey("acme", f"u{i % 4}", f"s{i}") for i in range(30)]
    try:

        def dealt() -> list[dict[str, object]] | None:
            found = asyncio.run(
                service_status(service_url["n1"], api_prefix=DEFAULT_API_PREFIX, discover=0.5)
            )
            workers = [r.health["worker"] for r in found if r.ok and r.health]
            return workers if len(workers) == 3 and all(w["members"] == 3 for w in workers) else None

        workers = wait_for(dealt, timeout=DEADLINE, what="three workers on two nodes", pause=cluster.pause())
        assert sorted(w["partitions"] for w in workers) == [21, 21, 22]  # type: ignore[type-var]
        assert len({w["serve"] for w in workers}) == 2
        tenant = cluster.url("n3", "acme", "acme-secret")
        with RemoteMemory(tenant, inbox_prefix="_INBOX_acme", timeout=CLIENT_TIMEOUT) as remote:
            load = TenantLoad(remote, keys, 10, threads=6)
            load.start()
            load.join(DEADLINE * 2)
            assert not load.failures, load.failures[:5]
            assert not load.retries, load.retries
        replicas = asyncio.run(service_status(service_url["n2"], api_prefix=DEFAULT_API_PREFIX, discover=0.5))
        assert sum(r.health["live_sessions"] for r in replicas if r.health) == len(keys)  # one process each
        assert all(r.metrics and r.metrics["conflicts"] == 0 for r in replicas), replicas
        assert all(r.metrics and r.metrics["turns"] > 0 for r in replicas)  # each worker served its share
        with JetStreamBackend.connect(compose_urls(cluster), replicas=3) as backend:
            for key in keys:
                assert stored_turns(backend.log, key) == load.acked[key], key
    finally:
        for serve in serves:
            serve.stop()
    for serve in serves:
        assert serve.proc.returncode == 0, serve.stderr_tail()
