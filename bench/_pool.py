"""The summarizer pool before and after a change, side by side: ``python -m bench._pool A B OUT``.

`A` and `B` are checkouts (``git archive <commit> convmem bench | tar -x -C /tmp/a``). Each round
runs one child process per tree, in alternating order; each child runs, in its own tree, a
`SummarizerPool` of 4 workers with a summarizer that answers at once, and measures:

- ``serial``: `JOBS` summaries one after another from one thread (submit, wait for the reply):
  process CPU, context switches (voluntary and involuntary, `getrusage`) and wall time per summary;
- ``burst``: 4 threads submitting `JOBS` summaries in all, as fast as the queue takes them:
  process CPU and context switches per summary.

Nothing else runs in the child, so its context switches are the pool's thread hand-offs. The
figures are the medians over the rounds (4, or ``CONVMEM_BENCH_ROUNDS``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "4"))
JOBS = 2000

_CHILD = r"""
import json, resource, sys, threading, time
import convmem
if not convmem.__file__.startswith(sys.argv[2]):
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[2]}")
from convmem.actors import SummarizerPool
from convmem.events import ConversationTurn, MemoryHealth, MemoryKey
from convmem.projections import SummaryRequest

jobs = int(sys.argv[1])
request = SummaryRequest(
    key=MemoryKey("bench", "u", "pool"), previous_summary="", covers_from=1, covers_through=1,
    turns=(ConversationTurn(user_message="hello", assistant_response="hi"),),
    health=MemoryHealth.HEALTHY, attempt=0,
)
pool = SummarizerPool(lambda payload: "summary", workers=4, queue_limit=jobs + 10, call_timeout=60.0)

def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), r.ru_nvcsw + r.ru_nivcsw, time.perf_counter()

out = {}
answered = threading.Semaphore(0)
reply = lambda outcome: answered.release()
for _ in range(200):  # warm up
    pool.submit(request, reply)
    answered.acquire()
cpu, switches, wall = usage()
for _ in range(jobs):
    pool.submit(request, reply)
    answered.acquire()
cpu2, switches2, wall2 = usage()
out["serial_cpu_us"] = (cpu2 - cpu) / jobs * 1e6
out["serial_switches"] = (switches2 - switches) / jobs
out["serial_wall_us"] = (wall2 - wall) / jobs * 1e6

def submit(n):
    for _ in range(n):
        while not pool.submit(request, reply):
            time.sleep(0.0005)
threads = [threading.Thread(target=submit, args=(jobs // 4,)) for _ in range(4)]
cpu, switches, wall = usage()
for t in threads:
    t.start()
for _ in range(jobs // 4 * 4):
    answered.acquire()
cpu2, switches2, wall2 = usage()
for t in threads:
    t.join()
done = jobs // 4 * 4
out["burst_cpu_us"] = (cpu2 - cpu) / done * 1e6
out["burst_switches"] = (switches2 - switches) / done
out["burst_summaries_per_s"] = done / (wall2 - wall)
pool.close()
print(json.dumps(out))
"""


def _child(tree: Path) -> dict[str, float]:
    return run_in_tree(tree, _CHILD, JOBS)


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        _child,
        rounds=ROUNDS,
        what="the summarizer pool before and after a change: CPU, context switches and wall time per "
        "summary (4 workers, a summarizer that answers at once), serial and in a burst; child processes "
        "in alternating rounds",
    )


if __name__ == "__main__":
    command_line("bench._pool", main)
