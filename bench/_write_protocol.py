"""The write path before and after a change, side by side: ``python -m bench._write_protocol A B OUT``.

`A` and `B` are checkouts of the code before and after the change
(``git archive <commit> convmem bench | tar -x -C /tmp/before``). One
nats-server (the server's default flush) serves both. Each
round runs one child process per tree, in alternating order (before first,
then after first), so a busy machine slows both alike; each child imports
its own tree's convmem and measures, on its own stream:

- ``memory``: `TURNS_MEMORY` ``add_turn``s from one thread over 8 sessions on
  the in-memory log: process CPU per turn (the write path's own cost, no network);
  ``memory_best``: the best of 5 more runs of 1,000;
- ``summarizing``: the same on ``rolling_summary`` sessions (3 turns in full) whose
  summarizer answers at once, so nearly every turn asks for a summary (the summarizer pool and
  the summary's own write in the process's CPU), flushed at the end;
- ``steps``: the write protocol's pure steps of one ``add_turn`` (`begin`, its
  decision, `acknowledged`) on a session of 40 turns, best of 5 runs of 3,000;
- ``threads``: `TURNS_NATS` durable ``add_turn``s from one thread: mean latency
  and process CPU per turn;
- ``asyncio``: `TASKS` asyncio tasks on `connect_here`'s loop, `TURNS_NATS`
  turns in all over `TASKS` sessions: turns/s and process CPU per turn.

Opening each session is not measured. The figures are the medians over the
rounds (4, or ``CONVMEM_BENCH_ROUNDS``); CPU time is the steadier one on a shared machine.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from bench._common import nats_server
from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "4"))
"""Rounds (each runs both trees, in alternating order); `CONVMEM_BENCH_ROUNDS` sets more."""
TURNS_MEMORY = 3000
TURNS_NATS = 600
TASKS = 16

_CHILD = r"""
import asyncio, json, sys, time, uuid
from bench._common import sample_turn
from convmem.adapters import connect, connect_here
from convmem.events import MemoryKey, ShortTermMemoryConfig

url, tag, turns_memory, turns_nats, tasks = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
import convmem
if not convmem.__file__.startswith(sys.argv[6]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[6]}")
config = ShortTermMemoryConfig(strategy="truncation")
turns = [sample_turn(n) for n in range(64)]
out = {}

def cpu_per_turn(run, count):
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return (time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6

from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
system = MemorySystem(config, log=InMemoryEventLog())
handles = [system.session(MemoryKey("bench", "u", f"m{n}")) for n in range(8)]
for h in handles:
    h.add_turn(turns[0])
def memory():
    for n in range(turns_memory):
        handles[n % 8].add_turn(turns[n % 64])
out["memory_cpu_us"], out["memory_wall_us"] = cpu_per_turn(memory, turns_memory)
def memory_1000():
    for n in range(1000):
        handles[n % 8].add_turn(turns[n % 64])
out["memory_best_cpu_us"] = min(cpu_per_turn(memory_1000, 1000)[0] for _ in range(5))
system.close()

from convmem.events import MemoryBudget
summarizing = ShortTermMemoryConfig(strategy="rolling_summary", budget=MemoryBudget(full_zone_turns=3))
system = MemorySystem(
    summarizing,
    log=InMemoryEventLog(),
    summarizer=lambda payload: {"summary": "<session_summary>\nso far\n</session_summary>"},
)
handles = [system.session(MemoryKey("bench", "u", f"s{n}")) for n in range(8)]
for h in handles:
    h.add_turn(turns[0])
    h.flush(timeout=60)
def summarizing_run():
    for n in range(turns_memory):
        handles[n % 8].add_turn(turns[n % 64])
    for h in handles:
        h.flush(timeout=60)
out["summarizing_cpu_us"], out["summarizing_wall_us"] = cpu_per_turn(summarizing_run, turns_memory)
system.close()

from convmem import projections as P
from convmem.projections import _write_protocol as W
key = MemoryKey("bench", "u", "steps")
decision = getattr(P, "decide_folded", P.decide)  # the write protocol's decider in each tree
def decider(state, command, command_id):
    return decision(state, command, now=1.0, command_id=command_id, key=key, config=config)
def opening():
    return P.StartSession(key=key, config=config)
log = P.decide(P.SessionState(), opening(), now=1.0, command_id="open", key=key, config=config)
for n in range(40):
    state = P.replay(log)
    log += P.decide(state, P.AddTurn(turn=turns[n]), now=1.0, command_id=f"t{n}", key=key, config=config)
session = P.replay(log)
def steps():
    for n in range(3000):
        command = P.AddTurn(turn=turns[n % 64])
        pending, effect = W.begin(
            session, command, key=key, command_id=f"s{n}", decide=decider, opening=opening
        )
        W.acknowledged(pending, effect.events[-1].seq)
out["steps_best_cpu_us"] = min(cpu_per_turn(steps, 3000)[0] for _ in range(5))

names = dict(stream=f"W{tag}", prefix=f"w{tag}.ev", bucket=f"WS{tag}", config=config)
system = connect(url, **names)
handle = system.session(MemoryKey("bench", "u", "t"))
handle.add_turn(turns[0])
def threads():
    for n in range(turns_nats):
        handle.add_turn(turns[n % 64], timeout=60)
out["threads_cpu_us"], out["threads_latency_us"] = cpu_per_turn(threads, turns_nats)
system.close()

async def on_loop():
    here = {**names, "stream": f"A{tag}", "prefix": f"a{tag}.ev", "bucket": f"AS{tag}"}
    system = await connect_here(url, **here)
    handles = [system.session(MemoryKey("bench", "u", f"a{n}")).aio for n in range(tasks)]
    await asyncio.gather(*(h.add_turn(turns[0]) for h in handles))
    async def task(h):
        for n in range(turns_nats // tasks):
            await h.add_turn(turns[n % 64], timeout=60)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(task(h) for h in handles))
    done = (turns_nats // tasks) * tasks
    out["asyncio_cpu_us"] = (time.process_time() - cpu) / done * 1e6
    out["asyncio_turns_per_s"] = done / (time.perf_counter() - wall)
    await system.aclose()
asyncio.run(on_loop())
print(json.dumps(out))
"""


def _child(tree: Path, url: str) -> dict[str, float]:
    return run_in_tree(tree, _CHILD, url, uuid.uuid4().hex[:8], TURNS_MEMORY, TURNS_NATS, TASKS)


def main(before: Path, after: Path) -> dict[str, Any]:
    with nats_server(None) as server:
        return side_by_side(
            before,
            after,
            lambda tree: _child(tree, server.url),
            rounds=ROUNDS,
            what="the write path before and after a change: CPU per add_turn (in-memory log), durable "
            "add_turn latency and CPU from one thread, turns/s and CPU from asyncio tasks on the "
            "connection's loop; child processes in alternating rounds",
        )


if __name__ == "__main__":
    command_line("bench._write_protocol", main)
