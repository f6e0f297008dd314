"""The chaos cases that kill processes: a writing process, a `convmem serve`, a cluster node.

Each returns a `Tally` (tests/chaos.py); see that module for what is counted.
Processes are `cluster.Process`es (stdout lines with their arrival time,
stopped by pid), servers and clusters are stopped on the way out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from chaos import DEADLINE, Tally, ThreadLoad, keys_for, running_server, stored_texts
from cluster import NatsCluster, Process, compose_environment, exits_early, remap_urls, wait_for

from convmem.adapters import JetStreamBackend, RemoteMemory
from convmem.adapters.backends.jetstream._log import DEFAULT_STREAM
from convmem.events import MemoryKey

__all__ = ["process_restart", "r3_kill", "serve_stop"]

HERE = Path(__file__).resolve().parent
CHAOS_WORKER = HERE / "chaos_worker.py"
CLUSTER_WORKER = HERE / "cluster_worker.py"


def take_lines(tally: Tally, process: Process, label: Callable[[str], str] = str) -> None:
    """Record a worker's ACK and RETRY lines (stamped when they arrived) into `tally`."""
    for at, line in list(process.lines):
        kind, *rest = line.split() or [""]
        if kind == "ACK":
            tally.ack(label(rest[0]), rest[1], at, started=_started(rest, 2))
        elif kind == "RETRY":
            tally.error(rest[2], at, started=_started(rest, 3))


def _started(fields: list[str], at: int) -> float | None:
    """When the try began, if the line says (its writer's monotonic clock is the machine's, as ours)."""
    return float(fields[at]) if len(fields) > at else None


# A writing process dies ---------------------------------------------------------------


def process_restart(tmp: Path, *, sessions: int, turns: int, cycles: int) -> Tally:
    """kill -9 of a writing process `cycles` times; each next process continues the same sessions."""
    tally = Tally("writing process kill -9 and restart")
    keys = keys_for(sessions)
    step = sessions * turns // (cycles + 1)
    with running_server(tmp / "nats", "always") as server:
        for cycle in range(cycles + 1):
            start = min((len(set(tally.acked.get(k.session_id, ()))) for k in keys), default=0)
            worker = Process(
                [sys.executable, str(CHAOS_WORKER), server.url, str(sessions), str(turns), str(start)],
                stderr=tmp / f"worker-{cycle}.err",
            )
            try:
                if cycle < cycles:
                    wanted = step * (cycle + 1) - tally.acknowledged
                    ok = worker.wait_lines("ACK", max(1, wanted), DEADLINE)
                    assert ok, f"worker {cycle} stalled:\n{worker.stderr_tail()}"
                    tally.fault()
                    worker.kill()  # SIGKILL between or during appends
                else:
                    code = worker.finish(DEADLINE)
                    assert code == 0, f"the last worker exited with {code}:\n{worker.stderr_tail()}"
            finally:
                worker.stop()
            take_lines(tally, worker)
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    tally.notes["processes"] = cycles + 1
    return tally


# A `convmem serve` dies or is stopped -------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (parents first), from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop(0))
        todo += children.get(out[-1], [])
    return out


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (a gone process counts as stopped)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return True
    for task in tasks:
        with contextlib.suppress(FileNotFoundError):
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    return True


def stop_serve(serve: Process) -> None:
    """Stop a serve and its workers by pid (SIGTERM through the supervisor; SIGKILL whatever is left)."""
    tree = process_tree(serve.pid)
    signal_all(tree, signal.SIGCONT)  # a frozen worker cannot act on SIGTERM
    serve.stop()
    signal_all(tree[1:], signal.SIGKILL)


def start_serve(url: str, tmp: Path, name: str) -> Process:
    """`convmem serve` on `url`; returns once it answers requests (its ready file is written)."""
    ready = tmp / f"{name}.ready"
    serve = Process(
        [sys.executable, "-m", "convmem", "--nats", url, "serve", "--ready-file", str(ready)],
        stderr=tmp / f"{name}.err",
    )
    try:
        wait_for(ready.exists, timeout=DEADLINE, what=f"{name} serving", pause=exits_early(serve, name))
    except BaseException:
        stop_serve(serve)
        raise
    return serve


def serve_stop(tmp: Path, *, how: Literal["kill -9", "SIGTERM"], sessions: int, turns: int) -> Tally:
    """Two `convmem serve` in one queue group; one is killed (frozen first) or stopped mid-load.

    Planners retry through the service with the same key until the other
    serve answers; no turn may be stored twice.
    """
    tally = Tally(f"convmem serve {how}")
    keys = keys_for(sessions)
    with running_server(tmp / "nats", "always") as server:
        serves = [start_serve(server.url, tmp, f"serve-{n}") for n in (1, 2)]
        try:
            with RemoteMemory(server.url, timeout=3.0) as remote:
                load = ThreadLoad(remote.session, tally, keys, turns)
                load.start()
                try:
                    tally.wait_acks(sessions * turns // 3, alive=load.alive)
                    victim = serves[0]
                    if how == "kill -9":
                        # The supervisor and its workers frozen first, so that requests are surely
                        # in flight to it when it dies, then all killed as a machine's crash would.
                        tree = process_tree(victim.pid)
                        signal_all(tree, signal.SIGSTOP)
                        wait_for(
                            lambda: all(map(stopped, tree)),
                            timeout=DEADLINE,
                            what="serve-1 frozen",
                            pause=exits_early(victim, "serve-1"),
                        )
                        tally.wait_errors(len(tally.error_stamps), alive=load.alive)
                        tally.fault()
                        signal_all(tree, signal.SIGKILL)
                        victim.finish(DEADLINE)
                        tally.notes["processes_killed"] = len(tree)
                    else:
                        tally.fault()
                        victim.proc.send_signal(signal.SIGTERM)
                        code = victim.finish(DEADLINE)
                        assert code == 0, f"serve-1 exited with {code} on SIGTERM:\n{victim.stderr_tail()}"
                finally:
                    load.join(DEADLINE * 2)
        finally:
            for serve in serves:
                stop_serve(serve)
        tally.stored = stored_texts(server.url, {k.session_id: k for k in keys})
    return tally


# A cluster node dies ------------------------------------------------------------------


def compose_urls(cluster: NatsCluster) -> str:
    """compose's CONVMEM_NATS_URL for the service (every node), pointed at the test nodes."""
    return remap_urls(compose_environment("convmem-1")["CONVMEM_NATS_URL"], cluster.clients)


def r3_kill(tmp: Path, *, role: Literal["leader", "follower"], sessions: int, turns: int) -> Tally:
    """kill -9 of the R3 stream's leader or of a follower mid-load; the node comes back and catches up.

    Two writer processes (tests/cluster_worker.py) on every node's URL. The
    error window is from the kill to the last write that failed after it;
    the longest stall is the longest pause in acknowledgements.
    """
    tally = Tally(f"R3 cluster, stream {role} kill -9")
    writers = ("a", "b")
    with NatsCluster(tmp / "cluster") as cluster:
        urls = compose_urls(cluster)
        JetStreamBackend.connect(urls, replicas=3).close()  # the stream and bucket, three replicas each
        workers = [
            Process(
                [sys.executable, str(CLUSTER_WORKER), urls, name, str(sessions), str(turns)],
                stderr=tmp / f"worker-{name}.err",
            )
            for name in writers
        ]
        try:
            for worker in workers:
                ok = worker.wait_lines("ACK", sessions * turns // 3, DEADLINE)
                assert ok, worker.stderr_tail()
            leader = cluster.wait_stream_leader(DEFAULT_STREAM, DEADLINE)
            victim = leader if role == "leader" else next(n for n in cluster.procs if n != leader)
            tally.fault()
            killed_at = time.monotonic()
            cluster.kill(victim)
            now_leader = cluster.wait_stream_leader(DEFAULT_STREAM, DEADLINE, not_on=victim)
            tally.notes["killed"] = victim
            tally.notes["leader_seen_after_s"] = round(time.monotonic() - killed_at, 3)
            for worker in workers:
                code = worker.finish(DEADLINE * 2)
                assert code == 0, f"a writer exited with {code}:\n{worker.stderr_tail()}"
        finally:
            for worker in workers:
                worker.stop()
        for name, worker in zip(writers, workers, strict=True):
            take_lines(tally, worker, lambda session, name=name: f"{name}/{session}")
        restarted = time.monotonic()
        cluster.start(victim)
        cluster.wait_healthy(victim, DEADLINE)

        def caught_up() -> bool:
            mine, theirs = (
                cluster.last_seq(victim, DEFAULT_STREAM),
                cluster.last_seq(now_leader, DEFAULT_STREAM),
            )
            return mine is not None and mine == theirs

        wait_for(caught_up, timeout=DEADLINE, what=f"{victim} catching up", pause=cluster.pause(victim))
        tally.notes["caught_up_after_s"] = round(time.monotonic() - restarted, 3)
        labels = {f"{w}/s{i}": MemoryKey("cluster", w, f"s{i}") for w in writers for i in range(sessions)}
        tally.stored = stored_texts(urls, labels, replicas=3)
    return tally
