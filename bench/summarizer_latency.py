"""12. `add_turn` latency with a CPU-bound summarizer on the pool's threads or in a worker process (issue 15).

Issue 12 left `convmem.recommended()`'s `add_turn` p99 at 1,000 turns/s
1.5-2x that of the same configuration with a summarizer that answers at
once: the extractive summarizer's pure-Python work (0.2-0.6 ms a call) holds
the interpreter the writes need. Three systems on one embedded server (the
server's default flush), each with 200 sessions of `recommended(4000)`'s
configuration, run open-loop bursts at 1,000 turns/s in alternating order
(forwards, then backwards), so a slow moment of this shared machine falls on
all of them:

* ``trivial``: a summarizer that answers at once (the reference);
* ``in process``: the `ExtractiveSummarizer` on the summarizer pool's threads;
* ``worker process``: the same summarizer in a `ProcessSummarizer`, warmed
  (its child built) before anything is timed.

Each burst's p99 is kept too: on a busy machine a single slow moment decides
the overall p99, and the median of the bursts' p99s shows the typical one.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from bench._common import (
    Figure,
    Result,
    Sizes,
    Target,
    embedded_backend,
    percentile,
    sample_turn,
    session_keys,
)
from bench.latency import _EXTRACTIVE, _open_loop, _settle, _Summarizer
from convmem.actors import MemorySystem
from convmem.adapters import ExtractiveSummarizer, ProcessSummarizer, recommended

__all__ = ["run"]

RATE = 1000


def run(sizes: Sizes) -> Result:
    result = Result()
    rounds, seconds, sessions = (2, 0.1, 8) if sizes.smoke else (16, 1.0, 200)
    setup = recommended(total_tokens=4000, worker_process=False)
    allowance = setup.config.budget.summary_max_tokens
    apart = ProcessSummarizer(_EXTRACTIVE, max_tokens=allowance)  # warm: built before the timing
    summarizers: dict[str, Any] = {
        "trivial summarizer": _Summarizer(hung=False),
        "extractive in process": ExtractiveSummarizer(max_tokens=allowance),
        "extractive in a worker process": apart,
    }
    bursts: dict[str, list[list[float]]] = {name: [] for name in summarizers}
    turns = [sample_turn(n) for n in range(64)]
    try:
        with embedded_backend(None) as backend:
            systems = {
                name: MemorySystem(setup.config, log=backend.log, snapshots=backend.snapshots, summarizer=s)
                for name, s in summarizers.items()
            }
            try:
                handles = {
                    name: [system.async_session(k) for k in session_keys(sessions, user=f"sl-{n}")]
                    for n, (name, system) in enumerate(systems.items())
                }

                async def drive() -> None:
                    for name in systems:  # every session started and summarizing before the timing
                        for _ in range(6):
                            await asyncio.gather(*(h.add_turn(turns[0], timeout=120) for h in handles[name]))
                        await _settle(name, handles[name])
                    for n in range(rounds):
                        order = list(systems) if n % 2 == 0 else list(reversed(list(systems)))
                        for name in order:
                            latencies, _, _ = await _open_loop(handles[name], turns, RATE, seconds)
                            bursts[name].append(latencies)
                            await _settle(name, handles[name])

                asyncio.run(drive())
            finally:
                for system in systems.values():
                    system.close()
    finally:
        apart.close()
    _figures(bursts, result)
    result.notes.append(
        f"{sessions} sessions per system, recommended(4000)'s configuration, server's default flush; "
        f"{rounds} bursts of {seconds:g}s at {RATE}/s per system, order alternating"
    )
    return result


def _figures(bursts: dict[str, list[list[float]]], result: Result) -> None:
    every = {name: [x * 1000 for burst in b for x in burst] for name, b in bursts.items()}
    typical = {
        name: statistics.median(percentile([x * 1000 for x in burst], 99.0) for burst in b)
        for name, b in bursts.items()
    }
    for name in bursts:
        for p in (50.0, 90.0, 99.0):
            result.add(Figure(f"p{p:g} @ {RATE}/s, {name}", percentile(every[name], p), "ms"))
        result.add(Figure(f"median burst p99 @ {RATE}/s, {name}", typical[name], "ms"))
    trivial, here, apart = (
        every[n] for n in ("trivial summarizer", "extractive in process", "extractive in a worker process")
    )
    result.add(
        Figure(
            f"p99 @ {RATE}/s: worker process vs in process",
            percentile(apart, 99.0),
            "ms",
            reference=percentile(here, 99.0),
            reference_label="p99 with the summarizer on the pool's threads",
            target=Target("ratio", "<=", 1.0),
        )
    )
    result.add(
        Figure(
            f"p99 @ {RATE}/s: worker process vs a summarizer that answers at once",
            percentile(apart, 99.0),
            "ms",
            reference=percentile(trivial, 99.0),
            reference_label="p99 with a trivial summarizer (issue 12's reference)",
            target=Target("ratio", "<=", 1.2),
        )
    )
    result.add(
        Figure(
            f"p99 @ {RATE}/s: in process vs a summarizer that answers at once",
            percentile(here, 99.0),
            "ms",
            reference=percentile(trivial, 99.0),
            reference_label="p99 with a trivial summarizer (issue 12's reference)",
        )
    )
