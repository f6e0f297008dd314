"""11. `convmem serve --workers N`: aggregate durable turns/s of two workers against one, and threads
through the service against the raw publish ceiling.

One nats-server (``sync_interval: always``, its store on tmpfs when there is
room, so the figure is the processes' CPU and not the disk's fsync rate).
Rounds alternate ``--workers 1`` and ``--workers 2`` (1, 2, 1, 2, 1, 2): each
round starts a fresh `convmem serve` on that server, waits until every worker
owns its partitions, runs the load generator (`bench._workers_load`, a
process of its own) on fresh sessions, and stops the serve. The load is
``add_turn`` requests from asyncio tasks on one connection, each answered
only after JetStream acknowledged the turn. Every process's CPU (nats-server,
the serve's supervisor, each worker, the load generator) is read from
/proc over the timed part, and reported as cores busy.

Threads: the blocking `RemoteSession.add_turn` from many threads through
``--workers 2``, beside the raw nats-py ``publish_async`` ceiling
(bench.throughput's) measured in the same run on the same server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import Figure, Result, Sizes, Target, memory_store_root, nats_server, sample_turn
from bench.throughput import _payloads, _raw_publish
from convmem.adapters.frontends.service._protocol import DEFAULT_API_PREFIX
from convmem.adapters.frontends.service._status import service_status

__all__ = ["run"]

_TICK = os.sysconf("SC_CLK_TCK")
_WAIT = 120.0
_CLI = [sys.executable, "-m", "convmem"]
_LIVE = ["--max-live-sessions", "100000"]  # every session live: this measures writes, not activation
THROUGHPUT_QUOTAS = {"default": {"max_in_flight": 100_000, "max_running": 100_000}}
"""The quotas of a throughput round: the default ones (32 in flight per tenant) would refuse its callers."""


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of `pid` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


class _Serve:
    """A `convmem serve --workers N` on `url`, stopped with SIGTERM."""

    def __init__(
        self,
        url: str,
        workers: int,
        folder: Path,
        *,
        quotas: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        ready = folder / f"ready-{workers}"
        self.err = folder / f"serve-{workers}.err"
        ready.unlink(missing_ok=True)  # a file left by the serve before would pass for this one's
        config = folder / "truncation.json"  # as bench.throughput's: the write path, no summaries
        settings: dict[str, Any] = {"strategy": "truncation", **({"quotas": quotas} if quotas else {})}
        config.write_text(json.dumps(settings), encoding="utf-8")
        argv = [*_CLI, "--nats", url, "serve", "--workers", str(workers), *_LIVE, "--config", str(config)]
        argv += ["--ready-file", str(ready)]
        with open(self.err, "ab") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        pause = threading.Event()
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"convmem serve exited: {self.err.read_text()[-2000:]}")
            pause.wait(0.05)
        self.pids = self._dealt(url, workers)

    def _dealt(self, url: str, workers: int) -> list[int]:
        """The worker pids once each owns its share of the partitions; if they do not within `_WAIT`
        seconds, an error that says what the workers reported and what the serve wrote."""
        deadline = time.monotonic() + _WAIT
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = asyncio.run(service_status(url, api_prefix=DEFAULT_API_PREFIX, discover=0.5))
            seen = [r.health["worker"] for r in found if r.ok and r.health and "worker" in r.health]
            if len(seen) == workers and all(w.get("members") == workers for w in seen):
                return [int(w["pid"]) for w in seen]
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        raise RuntimeError(
            f"the {workers} workers did not share the partitions within {_WAIT:g}s (serve {state}; "
            f"workers seen: {seen}); the serve's stderr ends:\n{self.err.read_text(errors='replace')[-2000:]}"
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _load(
    url: str, mode: str, sessions: int, callers: int, turns: int, tag: str, pids: dict[str, list[int]]
) -> dict[str, Any]:
    """Run the load generator; the rate, and each process group's cores busy over the timed part."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._workers_load", url, mode, *map(str, (sessions, callers, turns)), tag],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    cpu: dict[str, float] = {}
    started = 0.0
    out: dict[str, Any] = {}
    for line in proc.stdout:
        said = json.loads(line)
        now = {name: sum(_cpu_seconds(p) for p in group) for name, group in pids.items()}
        if said["phase"] == "start":
            cpu, started = now, _monotonic()
        elif said["phase"] == "end":
            wall = _monotonic() - started
            out["cores"] = {name: round((now[name] - cpu[name]) / wall, 2) for name in now}
        else:
            out["turns_per_s"] = said["turns_per_s"]
            out["cores"]["load generator"] = round(said["cpu_s"] / wall, 2)
    if proc.wait(_WAIT) != 0 or "turns_per_s" not in out:
        raise RuntimeError(f"the load generator failed ({mode}, exit {proc.returncode})")
    return out


def _monotonic() -> float:
    return os.times().elapsed


def _median_cpu(rounds: list[dict[str, Any]]) -> float:
    """The median of the rounds' worker CPU microseconds per turn."""
    per_turn = sorted(r["cores"]["workers"] / r["turns_per_s"] * 1e6 for r in rounds)
    return per_turn[len(per_turn) // 2]


def run(sizes: Sizes) -> Result:
    result = Result()
    sessions, callers = sizes.tp_sessions, sizes.tp_callers
    turns = sizes.tp_turns - sizes.tp_turns % callers
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    rounds: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    threads: list[dict[str, Any]] = []
    raws: list[float] = []
    texts = [sample_turn(n) for n in range(64)]
    store = memory_store_root()
    with nats_server("always", store_root=store) as server, tempfile.TemporaryDirectory() as tmp:
        url = server.url
        assert server.pid is not None
        for n, workers in enumerate((1, 2) * (1 if sizes.smoke else 3)):
            serve = _Serve(url, workers, Path(tmp), quotas=THROUGHPUT_QUOTAS)
            try:
                pids = {"nats-server": [server.pid], "supervisor": [serve.proc.pid], "workers": serve.pids}
                rounds[workers].append(_load(url, "async", sessions, callers, turns, f"r{n}", pids))
                if workers == 2 and (n == 1 or not sizes.smoke):
                    raws.append(asyncio.run(_raw_publish(url, sessions, _payloads(turns, texts, f"w{n}"))))
                    threads.append(_load(url, "threads", sessions, callers, turns // 2, f"t{n}", pids))
            finally:
                serve.stop()
    one = max(rounds[1], key=lambda r: r["turns_per_s"])
    two = max(rounds[2], key=lambda r: r["turns_per_s"])
    best_threads = max(threads, key=lambda r: r["turns_per_s"])
    ceiling = max(raws)
    result.add(
        Figure(
            f"serve --workers 2, {callers} asyncio callers, {sessions} sessions [sync=always]",
            two["turns_per_s"],
            "turns/s",
            reference=one["turns_per_s"],
            reference_label="serve --workers 1",
            target=Target("ratio", ">=", 1.6),
            note=f"cores busy, 2 workers: {two['cores']}; 1 worker: {one['cores']}",
        )
    )
    result.add(
        Figure(
            "workers' CPU per turn, --workers 2 (median round)",
            _median_cpu(rounds[2]),
            "µs",
            reference=_median_cpu(rounds[1]),
            reference_label="--workers 1",
            note="the cores the partitioned workers spend per turn: what two free cores would scale by",
        )
    )
    result.add(
        Figure(
            f"serve --workers 2, {callers} threads of RemoteSession.add_turn [sync=always]",
            best_threads["turns_per_s"],
            "turns/s",
            reference=ceiling,
            reference_label="raw js.publish_async ceiling",
            target=Target("ratio", ">=", 0.5),
            note=f"cores busy: {best_threads['cores']}",
        )
    )
    result.details.update(
        {
            "workers_1_rounds": rounds[1],
            "workers_2_rounds": rounds[2],
            "threads_rounds": threads,
            "raw_rounds_per_s": raws,
            "machine_cores": len(os.sched_getaffinity(0)),
            "load_average": {"start": load_at_start, "end": [round(x, 2) for x in os.getloadavg()]},
        }
    )
    result.notes.append(
        "convmem serve as a process on a private nats-server (sync_interval always, store on tmpfs "
        "when there is room), strategy truncation, every session live; rounds alternate --workers 1 "
        "and 2, each on a fresh serve and fresh sessions, best of each; load from a separate process "
        "(asyncio tasks sending add_turn on the routed subjects; or RemoteSession threads); cores busy "
        "read from /proc over the timed part; every process shares the machine's cores"
    )
    return result
