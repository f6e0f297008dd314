"""Where the tail of `summarizer_latency`'s trivial-summarizer system comes from (issue 28 item 2).

    python -m bench._tail [--bursts 4] [--sessions 200] [--rate 1000] [--freeze]

One `MemorySystem` with `recommended(4000)`'s configuration and a summarizer that answers at once
on an embedded server (default flush), its sessions warmed as `summarizer_latency` warms them,
then open-loop bursts of 1 s at `--rate`. Besides each burst's p99 it times what can stall a
write: every snapshot save (when, how long: sessions started together save together), every
collector pause by generation, and the log's append latencies (`Metrics`); and it counts the
summaries (each a durable write of its own). ``--freeze`` freezes the start-up objects
(`gc.freeze()`) before the bursts, as `convmem serve`'s workers do. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections import Counter
from typing import Any

from bench._common import embedded_backend, percentile, sample_turn, session_keys
from bench.latency import _GcPauses, _open_loop, _settle, _Summarizer
from convmem.actors import MemorySystem, Snapshot
from convmem.adapters import recommended
from convmem.adapters.backends.jetstream._snapshots import JetStreamSnapshotStore

__all__ = ["tail"]


def tail(bursts: int, sessions: int, rate: int, freeze: bool) -> dict[str, Any]:
    saves: list[tuple[float, float]] = []
    save = JetStreamSnapshotStore.save

    def timed_save(store: JetStreamSnapshotStore, snapshot: Snapshot) -> None:
        started = time.perf_counter()
        try:
            save(store, snapshot)
        finally:
            saves.append((started, time.perf_counter() - started))

    setup = recommended(total_tokens=4000, worker_process=False)
    turns = [sample_turn(n) for n in range(64)]
    burst_p99: list[float] = []
    every: list[float] = []
    JetStreamSnapshotStore.save = timed_save  # type: ignore[method-assign]
    try:
        with embedded_backend(None) as backend, _GcPauses() as pauses:
            system = MemorySystem(
                setup.config, log=backend.log, snapshots=backend.snapshots, summarizer=_Summarizer(hung=False)
            )
            try:
                handles = [system.async_session(k) for k in session_keys(sessions, user="tail")]

                async def drive() -> float:
                    for _ in range(6):
                        await asyncio.gather(*(h.add_turn(turns[0], timeout=120) for h in handles))
                    await _settle("trivial summarizer", handles)
                    if freeze:
                        gc.collect()
                        gc.freeze()
                    saves.clear()
                    pauses.pauses.clear()
                    began = time.perf_counter()
                    for _ in range(bursts):
                        latencies, _, _ = await _open_loop(handles, turns, rate, 1.0)
                        ms = [x * 1000 for x in latencies]
                        burst_p99.append(round(percentile(ms, 99.0), 2))
                        every.extend(ms)
                        await _settle("trivial summarizer", handles)
                    return began

                began = asyncio.run(drive())
                metrics = system.metrics.snapshot()
            finally:
                system.close()
            gc_summary = pauses.summary()
    finally:
        JetStreamSnapshotStore.save = save  # type: ignore[method-assign]
        gc.unfreeze()
    windows = Counter(int((at - began) * 10) for at, _ in saves)
    durations = sorted(d * 1000 for _, d in saves)
    return {
        "p50_ms": round(percentile(every, 50.0), 2),
        "p99_ms": round(percentile(every, 99.0), 2),
        "max_ms": round(max(every, default=0.0), 2),
        "burst_p99_ms": burst_p99,
        "snapshot_saves": len(saves),
        "snapshot_save_p50_ms": round(percentile(durations, 50.0), 1) if durations else None,
        "snapshot_save_max_ms": round(durations[-1], 1) if durations else None,
        "snapshot_saves_per_100ms_top": windows.most_common(5),
        "gc": gc_summary,
        "append_ms": metrics.get("append_ms"),
        "counts": metrics.get("counts"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="What stalls the trivial-summarizer system's writes.")
    parser.add_argument("--bursts", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() the start-up objects first")
    args = parser.parse_args()
    print(json.dumps(tail(args.bursts, args.sessions, args.rate, args.freeze)))


if __name__ == "__main__":
    main()
