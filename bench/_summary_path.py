"""The summary path before and after a change, side by side: ``python -m bench._summary_path A B OUT``.

`A` and `B` are checkouts of the code before and after (``git archive <commit> | tar -x -C /tmp/a``).
Each round runs one child process per tree, in alternating order; each child imports its own
tree's convmem and measures ``rolling_summary`` sessions (full zone 5) whose summarizer answers at
once, so that nearly every turn asks for a summary and each summary is a write of its own:

- ``memory``: `TURNS` ``add_turn``s from one thread over 200 sessions on the in-memory log, then
  every session flushed: process CPU per turn, per write (turns and summaries together: how many
  summaries a run makes depends on how fast they come back), and summaries per turn;
- ``durable``: `TURNS` ``add_turn``s from 32 asyncio tasks over 200 sessions on an embedded
  nats-server (default flush; the log on its own loop thread, as `summarizer_latency` and
  `latency` run it): process CPU and wall time per turn, turns/s, summaries per turn.

The figures are the medians over the rounds (``CONVMEM_BENCH_ROUNDS``, default 4).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "4"))
TURNS = int(os.environ.get("CONVMEM_BENCH_SUMMARY_TURNS", "4000"))

_CHILD = r"""
import asyncio, json, sys, time
from bench._common import embedded_backend, sample_turn
from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
from convmem.events import MemoryKey, ShortTermMemoryConfig
import convmem
if not convmem.__file__.startswith(sys.argv[-1]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[-1]}")
count = int(sys.argv[1])
turns = [sample_turn(n) for n in range(64)]
config = ShortTermMemoryConfig(strategy="rolling_summary")
def summarizer(request):
    return {"summary": "They talked about the weather and a trip to the lake."}
def summaries(system):
    return system.metrics.snapshot()["counts"].get("summary_calls", 0)
out = {}
system = MemorySystem(config, log=InMemoryEventLog(), summarizer=summarizer)
handles = [system.session(MemoryKey("bench", "u", f"m{n}")) for n in range(200)]
for _ in range(6):
    for h in handles:
        h.add_turn(turns[0])
for h in handles:
    h.flush()
asked, cpu = summaries(system), time.process_time()
for n in range(count):
    handles[n % 200].add_turn(turns[n % 64])
for h in handles:
    h.flush()
cpu, asked = time.process_time() - cpu, summaries(system) - asked
out["memory_cpu_us_per_turn"] = cpu / count * 1e6
out["memory_cpu_us_per_write"] = cpu / (count + asked) * 1e6
out["memory_summaries_per_turn"] = asked / count
system.close()
with embedded_backend(None) as backend:
    system = MemorySystem(config, log=backend.log, snapshots=backend.snapshots, summarizer=summarizer)
    handles = [system.async_session(MemoryKey("bench", "u", f"d{n}")) for n in range(200)]
    async def drive():
        for _ in range(6):
            await asyncio.gather(*(h.add_turn(turns[0], timeout=120) for h in handles))
        numbers = iter(range(count))
        async def task():
            for n in numbers:
                await handles[n % 200].add_turn(turns[n % 64], timeout=120)
        asked, cpu, wall = summaries(system), time.process_time(), time.perf_counter()
        await asyncio.gather(*(task() for _ in range(32)))
        cpu, wall, asked = time.process_time() - cpu, time.perf_counter() - wall, summaries(system) - asked
        out["durable_cpu_us_per_turn"] = cpu / count * 1e6
        out["durable_wall_us_per_turn"] = wall / count * 1e6
        out["durable_turns_per_s"] = count / wall
        out["durable_summaries_per_turn"] = asked / count
    asyncio.run(drive())
    system.close()
print(json.dumps(out))
"""


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        lambda tree: run_in_tree(tree, _CHILD, TURNS),
        rounds=ROUNDS,
        what="the summary path before and after a change: CPU per turn and per write of rolling_summary "
        "sessions whose summarizer answers at once, in memory and durable; child processes in "
        "alternating rounds",
    )


if __name__ == "__main__":
    command_line("bench._summary_path", main)
