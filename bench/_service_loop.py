"""A served durable turn's CPU on the service's loop, before and after.

    python -m bench._service_loop BEFORE AFTER [OUT.json]


`A` and `B` are checkouts (``git archive <commit> convmem bench | tar -x -C /tmp/before``). Each
round runs one child process per tree, in alternating order (`bench._side_by_side`). A child
starts its own nats-server (``sync_interval: always``, the store on tmpfs when there is room),
opens the JetStream log on an `EventLoopThread` and serves it with a `MemoryService` on that same
loop, as a `convmem serve` worker does (strategy truncation, quotas lifted so no caller is
refused); two load processes (`bench._workers_load`, 32 asyncio callers over 200 sessions each)
warm their sessions, then send `TURNS` timed ``add_turn``s each. It reports:

- ``loop_cpu_us``: the CPU time of the loop's thread per durable turn (every request, append,
  acknowledgement and reply runs there; the thread's own clock, so the load processes and the
  server beside it are not counted);
- ``process_cpu_us``: the whole serving process's CPU per turn;
- ``turns_per_s``: the turns of both load processes over the timed part;
- ``calls_per_turn``: Python function calls on the loop's thread per turn (cProfile, a second
  timed part of the same size): the count does not move with the machine's load as the times do.

The figures are the medians over the rounds (4, or ``CONVMEM_BENCH_ROUNDS``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "4"))
TURNS = 8000
"""Timed turns of each of the two load processes."""

_CHILD = r"""
import asyncio, cProfile, json, pstats, subprocess, sys, time, uuid
turns = int(sys.argv[1])
import convmem
if not convmem.__file__.startswith(sys.argv[2]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[2]}")
from bench._common import memory_store_root, nats_server
from bench.workers import THROUGHPUT_QUOTAS
from convmem.actors import MemorySystem
from convmem.adapters import MemoryService
from convmem.adapters._loop_thread import EventLoopThread
from convmem.adapters.frontends._connect import open_backend_here
from convmem.adapters.frontends.service._quotas import Quotas
from convmem.events import ShortTermMemoryConfig

def timed(url, profile):
    tag = uuid.uuid4().hex[:8]
    loads = [
        subprocess.Popen(
            [sys.executable, "-m", "bench._workers_load", url, "async", "200", "32", str(turns), f"{tag}{i}",
             "--wait"],
            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    for load in loads:
        for line in load.stdout:
            if json.loads(line).get("phase") == "ready":
                break
    mark = {}
    async def begin():
        mark["thread"] = time.thread_time()
        if profile is not None:
            profile.enable()
    loop.call(begin, timeout=30, what="begin")
    process, wall = time.process_time(), time.perf_counter()
    for load in loads:
        load.stdin.write("go\n")
        load.stdin.flush()
    for load in loads:
        for _ in load.stdout:
            pass
        if load.wait() != 0:
            raise SystemExit("a load process failed")
    async def end():
        if profile is not None:
            profile.disable()
        mark["thread"] = time.thread_time() - mark["thread"]
    loop.call(end, timeout=30, what="end")
    done = 2 * (turns // 32) * 32
    return done, mark["thread"], time.process_time() - process, time.perf_counter() - wall

with nats_server("always", store_root=memory_store_root()) as server:
    loop = EventLoopThread(name="bench-service-loop")
    backend = loop.call(lambda: open_backend_here(server.url), timeout=60, what="the log")
    system = MemorySystem(
        ShortTermMemoryConfig(strategy="truncation"), log=backend.log, snapshots=backend.snapshots,
        max_live_sessions=10_000,
    )
    service = MemoryService(system, server.url, loop=loop, quotas=Quotas.from_mapping(THROUGHPUT_QUOTAS))
    service.start()
    try:
        done, thread, process, wall = timed(server.url, None)
        profile = cProfile.Profile()
        counted, _, _, _ = timed(server.url, profile)
        calls = sum(row[1] for row in pstats.Stats(profile).stats.values())
    finally:
        service.stop()
        system.close()
        backend.close()
        loop.stop()
print(json.dumps({
    "loop_cpu_us": thread / done * 1e6,
    "process_cpu_us": process / done * 1e6,
    "turns_per_s": done / wall,
    "calls_per_turn": calls / counted,
}))
"""


def _child(tree: Path) -> dict[str, float]:
    return run_in_tree(tree, _CHILD, TURNS)


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        _child,
        rounds=ROUNDS,
        what=(
            "a MemoryService on the JetStream log's own loop (as a serve worker), 2 load processes x 32 "
            "asyncio callers x 200 sessions, sync_interval always: the loop thread's and the process's "
            "CPU per durable turn, turns/s, Python calls per turn on the loop (cProfile)"
        ),
    )


if __name__ == "__main__":
    command_line("bench._service_loop", main)
