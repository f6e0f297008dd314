"""What a tenant's largest requests cost the process that serves them, before and after a change.

    python -m bench._hostile_costs BEFORE AFTER [OUT]

`BEFORE` and `AFTER` are checkouts (``git archive <commit> convmem bench | tar -x -C /tmp/a``). Each
round runs one child process per tree, in alternating order; each imports its own tree's convmem
and measures the process CPU (``time.process_time``) of work one request can ask for:

- ``items_one_write_ms``: one ``add_items`` of `ITEMS` items joining one turn (a user message, then
  one write of empty SDK items), in memory;
- ``items_small_write_ms``: then one more one-item write into that turn (mean of 50);
- ``summary_sentences_<K>_ms``: the `ExtractiveSummarizer` (``max_tokens=3900``, the service's
  summarizer) summarizing one message of K short distinct sentences ("Word01234 went far.");
- ``summary_history_ms``: the same summarizer folding a restored history of `HISTORY` turns of two
  40-word messages into an empty summary in one call.

Why it matters: each was reachable by one tenant's request to the shared service (issue 23's class:
a hostile tenant), and each grew faster than its input: the service's worker, or its summarizer,
was held for seconds to minutes. Medians over ``CONVMEM_BENCH_ROUNDS`` rounds (default 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench._side_by_side import command_line, run_in_tree, side_by_side

ROUNDS = int(os.environ.get("CONVMEM_BENCH_ROUNDS", "2"))
ITEMS = int(os.environ.get("CONVMEM_BENCH_HOSTILE_ITEMS", "4000"))
SENTENCES = os.environ.get("CONVMEM_BENCH_HOSTILE_SENTENCES", "1000,2000,4000")
HISTORY = int(os.environ.get("CONVMEM_BENCH_HOSTILE_HISTORY", "500"))

_CHILD = r"""
import json, random, sys, time
import convmem
if not convmem.__file__.startswith(sys.argv[-1]):  # measure the tree asked for, not another checkout
    raise SystemExit(f"imported {convmem.__file__}, not the tree {sys.argv[-1]}")
from convmem.actors import MemorySystem
from convmem.adapters import ExtractiveSummarizer, InMemoryEventLog
from convmem.events import MemoryKey, ShortTermMemoryConfig
items, sentences, history = int(sys.argv[1]), [int(k) for k in sys.argv[2].split(",")], int(sys.argv[3])
out = {}

def cpu_ms(run):
    started = time.process_time()
    run()
    return (time.process_time() - started) * 1e3

with MemorySystem(ShortTermMemoryConfig(strategy="truncation"), log=InMemoryEventLog()) as memory:
    session = memory.session(MemoryKey("bench", "u", "items"))
    session.add_items([{"role": "user", "content": "go"}])
    out["items_one_write_ms"] = cpu_ms(lambda: session.add_items([{} for _ in range(items)], timeout=600))
    def small_writes():
        for n in range(50):
            session.add_items([{"role": "assistant", "content": f"step {n}"}], timeout=60)
    out["items_small_write_ms"] = cpu_ms(small_writes) / 50

for count in sentences:
    text = " ".join(f"Word{n:05d} went far." for n in range(count))
    summarizer = ExtractiveSummarizer(max_tokens=3900)
    out[f"summary_sentences_{count}_ms"] = cpu_ms(
        lambda: summarizer.summarize("", [{"user": text, "assistant": "ok"}])
    )

draw = random.Random(history)
def words(n):
    return " ".join(f"w{draw.randrange(100000):05d}" + ("." if i % 7 == 6 else "") for i in range(n))
turns = [{"user": words(40), "assistant": words(40)} for _ in range(history)]
summarizer = ExtractiveSummarizer(max_tokens=3900)
out["summary_history_ms"] = cpu_ms(lambda: summarizer.summarize("", turns))
print(json.dumps(out))
"""


def main(before: Path, after: Path) -> dict[str, Any]:
    return side_by_side(
        before,
        after,
        lambda tree: run_in_tree(tree, _CHILD, ITEMS, SENTENCES, HISTORY),
        rounds=ROUNDS,
        what=(
            f"process CPU of one add_items of {ITEMS:,} items into one turn and of a one-item write after "
            f"it; of the extractive summarizer (max_tokens 3,900) on one message of {SENTENCES} short "
            f"sentences and on a restored history of {HISTORY:,} turns; child processes in alternating rounds"
        ),
    )


if __name__ == "__main__":
    command_line("bench._hostile_costs", main)
