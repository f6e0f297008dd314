"""13. Scaling with cores (issue 28, item 4): `convmem serve --workers N` for N = 1, 2, 4, 8 under several
load processes, aggregate durable turns/s and every process's cores busy.

One nats-server (``sync_interval: always``, its store on tmpfs when there is
room, so the figure is the processes' CPU and not the disk's fsync rate).
For each N a fresh `convmem serve --workers N` (strategy truncation, every
session live, quotas lifted so the callers are not refused) is started and
waited on until every worker owns its share of the partitions; then several
load generators (`bench._workers_load`, each a process of its own, each its
own sessions, asyncio callers on one connection, each ``add_turn`` answered
only after JetStream acknowledged it) warm their sessions, wait for the go,
and run their timed turns together. Aggregate turns/s is every process's
timed turns over the time from the go to the last one done. Every process's
CPU (nats-server, the serve's supervisor, its workers, the load generators)
is read over the timed part and reported as cores busy, so whichever of them
is the limit is named.

Rounds alternate the order of N (1 2 4 8, then 8 4 2 1, ...), so a busy
moment of the machine falls on all of them; each figure is the best round.

Before/after: with ``CONVMEM_BENCH_BASELINE=/path/to/another/checkout`` the
same rounds also run a serve from that tree (its ``PYTHONPATH``), each beside
this tree's in the same round, and the figures say both (``baseline``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import Figure, Result, Sizes, Target, memory_store_root, nats_server
from bench.peers import BASELINE_ENV
from bench.workers import THROUGHPUT_QUOTAS, _cpu_seconds, _monotonic, _Serve

__all__ = ["run"]

_WAIT = 300.0


def _trees() -> dict[str, dict[str, str] | None]:
    """The serves measured: this tree's, and the baseline's when `BASELINE_ENV` names one."""
    trees: dict[str, dict[str, str] | None] = {"this tree": None}
    baseline = os.environ.get(BASELINE_ENV)
    if baseline:
        if not (Path(baseline) / "convmem" / "__init__.py").is_file():
            raise RuntimeError(f"{BASELINE_ENV}={baseline!r} is no convmem checkout (no convmem/__init__.py)")
        trees["baseline"] = {**os.environ, "PYTHONPATH": str(Path(baseline).resolve())}
    return trees


def _loads(
    url: str, processes: int, sessions: int, callers: int, turns: int, tag: str, pids: dict[str, list[int]]
) -> dict[str, Any]:
    """Run `processes` load generators at once; aggregate turns/s and each group's cores busy."""
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "bench._workers_load", url, "async"),
                *map(str, (sessions, callers, turns)),
                *(f"{tag}p{p}", "--wait"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(processes)
    ]
    try:
        for proc in procs:  # every one warmed up
            assert proc.stdout is not None
            said = json.loads(proc.stdout.readline() or "{}")
            if said.get("phase") != "ready":
                name, code = f"{tag}p{procs.index(proc)}", proc.wait(_WAIT)
                raise RuntimeError(
                    f"load generator {name} failed in its warm-up (exit {code}; see standard error)"
                )
        before = {name: sum(_cpu_seconds(p) for p in group) for name, group in pids.items()}
        started = _monotonic()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        rates, load_cpu, ended, after = [], [], {}, {}
        for proc in procs:
            assert proc.stdout is not None
            for line in proc.stdout:
                said = json.loads(line)
                if said["phase"] == "end":
                    ended[proc.pid] = _monotonic()
                    after[proc.pid] = {n: sum(_cpu_seconds(p) for p in g) for n, g in pids.items()}
                elif said["phase"] == "done":
                    rates.append(said["turns_per_s"])
                    load_cpu.append(said["cpu_s"])
        for proc in procs:
            if proc.wait(_WAIT) != 0:
                raise RuntimeError(
                    f"load generator {tag}p{procs.index(proc)} failed (exit {proc.returncode})"
                )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if len(rates) != processes:
        raise RuntimeError("a load generator did not report its rate")
    wall = max(ended.values()) - started
    last = max(ended, key=lambda pid: ended[pid])
    per_process = (turns // callers) * callers
    cores = {name: round((after[last][name] - before[name]) / wall, 2) for name in pids}
    cores["load generators"] = round(sum(load_cpu) / wall, 2)  # each one's own CPU over its timed part
    return {
        "turns_per_s": per_process * processes / wall,
        "per_process_turns_per_s": [round(r) for r in rates],
        "cores": cores,
        "wall_s": round(wall, 3),
    }


SIZES_ENV = "CONVMEM_BENCH_CORES"
"""Sizes other than the run's, as ``key=value`` pairs split by ``;``: ``workers=1,2;processes=2;
sessions=200;callers=32;turns=3200;rounds=3`` (a quick before/after on a small machine)."""


def _sizes(sizes: Sizes) -> dict[str, Any]:
    chosen: dict[str, Any] = (
        {"workers": (1, 2), "processes": 2, "sessions": 8, "callers": 4, "turns": 64, "rounds": 1}
        if sizes.smoke
        else {
            "workers": (1, 2, 4, 8),
            "processes": 4,
            "sessions": 1000,
            "callers": 64,
            "turns": 12_800,
            "rounds": 2,
        }
    )
    for pair in filter(None, os.environ.get(SIZES_ENV, "").split(";")):
        name, _, value = pair.partition("=")
        name = name.strip()
        if name not in chosen:
            raise RuntimeError(f"{SIZES_ENV}: unknown size {name!r}; choose from {', '.join(chosen)}")
        try:
            numbers = tuple(int(v) for v in value.split(","))
        except ValueError:
            raise RuntimeError(f"{SIZES_ENV}: {name}={value!r} is not a number") from None
        if not numbers or min(numbers) < 1:
            raise RuntimeError(f"{SIZES_ENV}: {name}={value!r} must be 1 or more")
        chosen[name] = numbers if name == "workers" else numbers[0]
    return chosen


def run(sizes: Sizes) -> Result:
    result = Result()
    chosen = _sizes(sizes)
    counts: tuple[int, ...] = chosen["workers"]
    processes, sessions, callers = chosen["processes"], chosen["sessions"], chosen["callers"]
    turns, rounds_n = chosen["turns"], chosen["rounds"]
    trees = _trees()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = {t: {n: [] for n in counts} for t in trees}
    store = memory_store_root()
    with nats_server("always", store_root=store) as server, tempfile.TemporaryDirectory() as tmp:
        assert server.pid is not None
        for r in range(rounds_n):
            order = counts if r % 2 == 0 else tuple(reversed(counts))
            for workers in order:
                for tree, env in trees.items():
                    serve = _Serve(server.url, workers, Path(tmp), quotas=THROUGHPUT_QUOTAS, env=env)
                    try:
                        pids = {"nats-server": [server.pid], "supervisor": [serve.proc.pid]}
                        result.details.setdefault("order", []).append(f"{tree}, --workers {workers}")
                        pids["workers"] = serve.pids
                        tag = f"c{r}w{workers}{'b' if env else ''}"
                        once = _loads(server.url, processes, sessions, callers, turns, tag, pids)
                        rounds[tree][workers].append(once)
                        # each run as it ends, so a run stopped at its time limit still tells its figures
                        print(
                            f"cores: round {r + 1}, {tree}, --workers {workers}: "
                            f"{once['turns_per_s']:,.0f} turns/s, cores busy {once['cores']}",
                            file=sys.stderr,
                            flush=True,
                        )
                    finally:
                        serve.stop()
    best = {
        t: {n: max(rs, key=lambda x: x["turns_per_s"]) for n, rs in by_n.items()}
        for t, by_n in rounds.items()
    }
    fewest = min(counts)
    one = best["this tree"][fewest]["turns_per_s"]
    for workers in counts:
        here = best["this tree"][workers]
        cpu = here["cores"]["workers"] / here["turns_per_s"] * 1e6
        scaling = workers == 8 and not sizes.smoke
        result.add(
            Figure(
                f"serve --workers {workers}, {processes} load processes x {callers} asyncio callers, "
                f"{sessions} sessions each [sync=always]",
                here["turns_per_s"],
                "turns/s",
                reference=one if workers > fewest else None,
                reference_label=f"serve --workers {fewest}" if workers > fewest else "",
                target=Target("ratio", ">=", 6.0) if scaling else None,
                note=f"cores busy: {here['cores']}; workers' CPU {cpu:.0f} µs per turn",
            )
        )
        result.add(Figure(f"workers' CPU per durable turn, --workers {workers}", cpu, "µs"))
        if "baseline" in best:
            then = best["baseline"][workers]
            result.add(
                Figure(
                    f"serve --workers {workers}, this tree against the baseline",
                    here["turns_per_s"],
                    "turns/s",
                    reference=then["turns_per_s"],
                    reference_label=f"the baseline ({os.environ[BASELINE_ENV]})",
                    note=f"baseline cores busy: {then['cores']}",
                )
            )
    result.details.update(
        {
            "rounds": {t: {str(n): rs for n, rs in by_n.items()} for t, by_n in rounds.items()},
            "machine_cores": len(os.sched_getaffinity(0)),
            "load_average": {"start": load_at_start, "end": [round(x, 2) for x in os.getloadavg()]},
        }
    )
    result.notes.append(
        f"convmem serve --workers N (N = {', '.join(map(str, counts))}) on a private nats-server "
        "(sync_interval always, store on tmpfs when there is room), strategy truncation, every session "
        f"live, quotas lifted; {processes} load processes started together after their warm-up, each "
        f"{callers} asyncio callers over its own {sessions} sessions; rounds alternate the order of N, "
        "best of each; cores busy read from /proc over the timed part; every process shares the "
        "machine's cores"
    )
    return result
