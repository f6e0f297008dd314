"""What live and cached sessions cost each full collection, before and after a change.

    python -m bench._collector BEFORE AFTER [OUT]

`BEFORE` and `AFTER` are checkouts (``git archive <commit> | tar -x -C /tmp/a``). Each round runs
one child process per tree, in alternating order. Two children per tree write two turns to each of `SESSIONS`
sessions on the in-memory log, one with every session live (``max_live_sessions`` above the
count), the other with all but one passivated into the idle cache (``max_live_sessions=1``); each
reports the tracked objects the sessions keep, per session, and the CPU of one full
collection (``gc.collect()``, best of 5) with the sessions against the same system before them.

Why it matters (issue 28): a full collection walks every tracked object while every thread of the
process waits, so what each session keeps is paid again at every full collection, and the write
that arrives during one waits for it. The figures are CPU time, which the machine's load moves far
less than the wall-clock tail. Medians over ``CONVMEM_BENCH_ROUNDS`` rounds (default 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "3"))
SESSIONS = int(os.environ.get("CONVMEM_BENCH_COLLECTOR_SESSIONS", "10000"))

_CHILD = r"""
import gc, json, sys, time
from bench._common import sample_turn
from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog
from convmem.events import MemoryKey, ShortTermMemoryConfig
import convmem
if not convmem.__file__.startswith(sys.argv[-1]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[-1]}")
sessions, name = int(sys.argv[1]), sys.argv[2]
turn = sample_turn(0)
config = ShortTermMemoryConfig(strategy="truncation")
def full_collection_ms():
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        gc.collect()
        best = min(best, time.process_time() - started)
    return best * 1000
def tracked():
    gc.collect()
    return len(gc.get_objects())
out = {}
log = InMemoryEventLog()
keys = [MemoryKey("bench", "u", f"s{n}") for n in range(sessions)]
with MemorySystem(config, log=log) as writer:  # the log holds the sessions before counting
    for key in keys:
        writer.session(key).add_turn(turn)
bound = sessions + 24 if name == "live" else 1
with MemorySystem(config, log=log, max_live_sessions=bound, idle_seconds=24 * 3600.0) as system:
    handles = [system.session(key) for key in keys]
    system.session(MemoryKey("bench", "u", "warm-up")).add_turn(turn)
    objects, empty_ms = tracked(), full_collection_ms()
    for handle in handles:
        handle.add_turn(turn)
        handle.add_turn(turn)
    out[f"{name}_tracked_objects_per_session"] = (tracked() - objects) / sessions
    out[f"{name}_full_collection_ms"] = full_collection_ms()
    out[f"{name}_full_collection_ms_without_the_sessions"] = empty_ms
print(json.dumps(out))
"""


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        lambda tree: {
            **run_in_tree(tree, _CHILD, SESSIONS, "live"),
            **run_in_tree(tree, _CHILD, SESSIONS, "cached"),
        },
        rounds=ROUNDS,
        what=f"{SESSIONS:,} sessions of two turns on the in-memory log, every one live and all but one "
        "cached: tracked objects per session and the CPU of a full collection (best of 5) with and "
        "without them; child processes in alternating rounds",
    )


if __name__ == "__main__":
    command_line("bench._collector", main)
