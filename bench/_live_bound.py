"""Writes past the live bound before and after a change: ``python -m bench._live_bound A B OUT``.

`A` and `B` are checkouts of the code before and after (``git archive <commit> | tar -x -C /tmp/a``).
Each round runs one child process per tree, in alternating order; each child imports its own
tree's convmem and writes one turn to each of `SESSIONS` sessions in turn, `PASSES` times (the
first pass, which creates the sessions, not timed), two ways each:

- ``memory``: one thread, the in-memory log; ``max_live_sessions`` 256 (the default: past it each
  write starts one session's actor from the idle cache and stops another's) and above the session
  count (every session live): process CPU per write;
- ``durable``: `CALLERS` threads over `convmem.connect()`'s embedded server (``sync_interval:
  always``), the default live bound and every session live: writes/s and process CPU per write.

The figures are the medians over the rounds (``CONVMEM_BENCH_ROUNDS``, default 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "3"))
SESSIONS = int(os.environ.get("CONVMEM_BENCH_BOUND_SESSIONS", "10000"))
PASSES = int(os.environ.get("CONVMEM_BENCH_BOUND_PASSES", "3"))
CALLERS = 64

_CHILD = r"""
import json, os, sys, tempfile, threading, time
from bench._common import sample_turn
from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
from convmem.events import MemoryKey, ShortTermMemoryConfig
import convmem
if not convmem.__file__.startswith(sys.argv[-1]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[-1]}")
sessions, passes, callers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
turns = [sample_turn(n) for n in range(64)]
config = ShortTermMemoryConfig(strategy="truncation")
everyone = {"max_live_sessions": sessions + 24, "idle_seconds": 24 * 3600.0}
def cpu():
    t = os.times()
    return t.user + t.system
def passes_of(handles, threads):
    # Pass 0 creates the sessions; the others are timed: (writes/s, CPU µs a write).
    def one(p):
        def caller(c):
            for s in range(c, sessions, threads):
                handles[s].add_turn(turns[(p * 7 + s) % 64], timeout=120)
        started, used = time.perf_counter(), cpu()
        workers = [threading.Thread(target=caller, args=(c,)) for c in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - started, cpu() - used
    one(0)
    timed = [one(p) for p in range(1, passes)]
    wall, used = sum(t for t, _ in timed), sum(c for _, c in timed)
    n = sessions * (passes - 1)
    return n / wall, used / n * 1e6
out = {}
for name, live in (("bound", {}), ("all_live", everyone)):
    system = MemorySystem(config, log=InMemoryEventLog(), **live)
    handles = [system.session(MemoryKey("bench", "u", f"m{n}")) for n in range(sessions)]
    _, out[f"memory_{name}_cpu_us_per_write"] = passes_of(handles, 1)
    system.close()
for name, live in (("bound", {}), ("all_live", everyone)):
    with tempfile.TemporaryDirectory(prefix="convmem-bench-bound-") as folder:
        system = convmem.connect(data_dir=os.path.join(folder, "nats"), config=config, **live)
        handles = [system.session(MemoryKey("bench", "u", f"d{n}")) for n in range(sessions)]
        rate, used = passes_of(handles, callers)
        out[f"durable_{name}_writes_per_s"], out[f"durable_{name}_cpu_us_per_write"] = rate, used
        system.close()
print(json.dumps(out))
"""


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        lambda tree: run_in_tree(tree, _CHILD, SESSIONS, PASSES, CALLERS),
        rounds=ROUNDS,
        what=f"writes to {SESSIONS:,} sessions in turn past the default live bound (256) and with every "
        f"session live, before and after a change: in memory from one thread (CPU per write) and "
        f"through connect()'s embedded server (fsync always) from {CALLERS} threads (writes/s, CPU per "
        f"write); {PASSES - 1} timed passes of one turn a session after one that creates them; child "
        "processes in alternating rounds",
    )


if __name__ == "__main__":
    command_line("bench._live_bound", main)
