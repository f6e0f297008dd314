"""Snapshot saves of sessions with many live turns, before and after a change.

    python -m bench._snapshot_cadence BEFORE AFTER [OUT]

`BEFORE` and `AFTER` are checkouts (``git archive <commit> convmem bench | tar -x -C /tmp/a``).
Each round runs one child process per tree, in alternating order; each child imports its own
tree's convmem and uses `convmem.recommended(worker_process=True)`'s configuration (1,000 live
turns) and summarizer (a new one for each system). `SESSIONS` sessions are each filled with
`FILL` turns first (past the live turns, so every snapshot holds 1,000 of them; each session
flushed after, none of it timed), then one thread writes `WRITES` turns over them in turn, timed:

- ``memory``: `MemorySystem` on the in-memory log and snapshot store: process CPU per write;
- ``durable``: `convmem.connect()`'s embedded server (``sync_interval: always``), `DURABLE_WRITES`
  timed writes: writes/s and process CPU per write; then the system is closed and opened again
  on the same data folder, and the first `get_llm_context()` of each session is timed (its
  reactivation: the snapshot and the log's tail past it), with the tail's events beside it.

A timed part ends when every session is flushed, so the saves a durable write leaves to its
session's actor are in it. Each counts the snapshot saves it made and their bytes (the store's
`save` wrapped to add up ``len(snapshot.data)``). Why it matters: a snapshot holds the session's
live turns, so with 1,000 of them one is some 580 KB, and a save every 50 events was a quarter of
an in-memory write's CPU. The figures are the medians over the rounds (``CONVMEM_BENCH_ROUNDS``,
default 3); ``CONVMEM_BENCH_CADENCE_SESSIONS``, ``_FILL``, ``_WRITES`` and ``_DURABLE_WRITES``
set the sizes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "3"))
SESSIONS = int(os.environ.get("CONVMEM_BENCH_CADENCE_SESSIONS", "4"))
FILL = int(os.environ.get("CONVMEM_BENCH_CADENCE_FILL", "1100"))
WRITES = int(os.environ.get("CONVMEM_BENCH_CADENCE_WRITES", "3000"))
DURABLE_WRITES = int(os.environ.get("CONVMEM_BENCH_CADENCE_DURABLE_WRITES", "3000"))

_CHILD = r"""
import json, os, statistics, sys, tempfile, threading, time
from bench._common import sample_turn
from convmem.actors import MemorySystem
from convmem.adapters import InMemoryEventLog, InMemorySnapshotStore
from convmem.events import MemoryKey
import convmem
if not convmem.__file__.startswith(sys.argv[-1]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[-1]}")
sessions, fill, writes, durable_writes = map(int, sys.argv[1:5])
turns = [sample_turn(n) for n in range(512)]
cpu = time.process_time  # every thread of this process, at a finer grain than os.times()
def counted(store):
    # Count the store's saves and their snapshot bytes: (saves, bytes), reset by the caller.
    tally = [0, 0]
    save = store.save
    def counting(snapshot):
        tally[0] += 1
        tally[1] += len(snapshot.data)
        save(snapshot)
    store.save = counting
    return tally
def filled(system, prefix):
    # `fill` turns a session, one thread a session, each flushed: the handles (not timed).
    handles = [system.session(MemoryKey("bench", "u", f"{prefix}{n}")) for n in range(sessions)]
    def one(s):
        for i in range(fill):
            handles[s].add_turn(turns[(i * 5 + s) % 512], timeout=120)
        handles[s].flush(timeout=120)
    workers = [threading.Thread(target=one, args=(s,)) for s in range(sessions)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return handles
def timed(handles, tally, count, name):
    # `count` writes over the sessions in turn from this thread, then every session flushed.
    tally[:] = [0, 0]
    started, used = time.perf_counter(), cpu()
    for n in range(count):
        handles[n % sessions].add_turn(turns[(n * 3 + 1) % 512], timeout=120)
    for handle in handles:
        handle.flush(timeout=120)
    wall, used = time.perf_counter() - started, cpu() - used
    out[f"{name}_cpu_us_per_write"] = used / count * 1e6
    out[f"{name}_snapshot_saves"] = tally[0]
    out[f"{name}_snapshot_mb"] = tally[1] / 1e6
    out[f"{name}_snapshot_kb_per_write"] = tally[1] / count / 1e3
    return wall
out = {}
setup = convmem.recommended(worker_process=True)
store = InMemorySnapshotStore()
tally = counted(store)
with MemorySystem(log=InMemoryEventLog(), snapshots=store, **setup) as system:
    timed(filled(system, "m"), tally, writes, "memory")
setup.summarizer.close()
with tempfile.TemporaryDirectory(prefix="convmem-bench-cadence-") as folder:
    data_dir = os.path.join(folder, "nats")
    setup = convmem.recommended(worker_process=True)
    with convmem.connect(data_dir=data_dir, config=setup.config, summarizer=setup.summarizer) as system:
        tally = counted(system.snapshots)
        wall = timed(filled(system, "d"), tally, durable_writes, "durable")
        out["durable_writes_per_s"] = durable_writes / wall
    setup.summarizer.close()
    setup = convmem.recommended(worker_process=True)
    with convmem.connect(data_dir=data_dir, config=setup.config, summarizer=setup.summarizer) as system:
        handles = [system.session(MemoryKey("bench", "u", f"d{n}")) for n in range(sessions)]
        took = []
        for handle in handles:
            started = time.perf_counter()
            handle.get_llm_context()
            took.append((time.perf_counter() - started) * 1000)
        tails = [h.snapshot_state().version - system.snapshots.load(h.key).seq for h in handles]
        out["durable_reopen_first_context_ms"] = statistics.mean(took)
        out["durable_reopen_first_context_ms_max"] = max(took)
        out["durable_reopen_tail_events"] = statistics.mean(tails)
    setup.summarizer.close()
print(json.dumps(out))
"""


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        lambda tree: run_in_tree(tree, _CHILD, SESSIONS, FILL, WRITES, DURABLE_WRITES),
        rounds=ROUNDS,
        what=f"recommended(worker_process=True)'s sessions (1,000 live turns), {SESSIONS} filled with "
        f"{FILL:,} turns each (not timed), then written to in turn from one thread: {WRITES:,} writes in "
        f"memory (CPU per write) and {DURABLE_WRITES:,} through connect()'s embedded server (fsync "
        "always; writes/s, CPU per write), each part up to every session flushed, with the snapshot "
        "saves and bytes it made; then the durable system reopened and the first get_llm_context() "
        "of each session timed (snapshot and the log's tail); child processes in alternating rounds",
    )


if __name__ == "__main__":
    command_line("bench._snapshot_cadence", main)
