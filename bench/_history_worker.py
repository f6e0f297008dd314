"""One run of the long-history measure, in a process of its own (see `bench.history`).

Run as a script, ``python bench/_history_worker.py '<json>'``, with ``PYTHONPATH``
naming the convmem to measure (this worktree's, or the code before a change):
it imports nothing but convmem and the standard library. The session named in
the argument already holds its history in the log. Phase ``prepare`` activates
it (a full replay) and saves its snapshot; phase ``measure``, in a fresh
process as after a restart, activates it from the snapshot 21 times (at least
3, at most 10 s of them), writes
turns, and reads its RSS growth from before the first activation to after the
writes. Each prints one JSON line of figures.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

from convmem.actors import MemorySystem, Snapshot
from convmem.adapters import JetStreamBackend
from convmem.events import ConversationTurn, MemoryKey, ShortTermMemoryConfig
from convmem.projections import encode_state, state_hash


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _turn(n: int) -> ConversationTurn:
    user = f"{n}: what did we say about the budget, the invoice and the meeting in Lyon tomorrow?"
    answer = "We said the invoice goes out on Monday and the meeting moves to Tuesday. " * 5
    return ConversationTurn(user_message=user, assistant_response=answer)


def _summarize(request: dict[str, object]) -> dict[str, str]:
    """A healthy summarizer that answers at once (rolling_summary runs)."""
    return {"summary": f"{len(request['turns'])} more turns about the budget and the meeting."}  # type: ignore[arg-type]


def main(spec: dict[str, object]) -> dict[str, object]:
    key = MemoryKey(*(str(t) for t in spec["key"]))  # type: ignore[attr-defined]
    strategy = str(spec.get("strategy", "truncation"))
    config = ShortTermMemoryConfig(strategy=strategy)  # type: ignore[arg-type]
    backend = JetStreamBackend.connect(str(spec["url"]), timeout=300.0)  # a 100,000-event read takes seconds
    summarizer = _summarize if config.summarizes else None
    try:
        with MemorySystem(
            config, log=backend.log, snapshots=backend.snapshots, snapshot_every=50, summarizer=summarizer
        ) as system:
            if spec.get("phase") == "prepare":
                return _prepare(system, backend, key)
            return _measure(system, key, int(spec["writes"]))  # type: ignore[call-overload]
    finally:
        backend.close()


def _prepare(system: MemorySystem, backend: JetStreamBackend, key: MemoryKey) -> dict[str, object]:
    """A full replay of the history, then its snapshot saved (as the session's writes leave one)."""
    handle = system.session(key)
    out: dict[str, object] = {}
    started = time.perf_counter()
    handle.get_llm_context()
    out["replay_ms"] = (time.perf_counter() - started) * 1000
    state = handle.snapshot_state()
    data = encode_state(state)
    out["snapshot_bytes"] = len(data)
    out["live_turns"] = len(state.turns)
    assert backend.snapshots is not None
    try:
        backend.snapshots.save(Snapshot(key=key, seq=state.version, state_hash=state_hash(state), data=data))
        out["snapshot_saved"] = True
    except Exception as exc:  # the code before the change cannot store a large one
        out["snapshot_saved"] = False
        out["snapshot_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def _measure(system: MemorySystem, key: MemoryKey, writes: int) -> dict[str, object]:
    """In a fresh process (a restarted service): activations from the snapshot, then writes."""
    handle = system.session(key)
    out: dict[str, object] = {}
    gc.collect()
    before = _rss()
    activations: list[float] = []
    began = time.perf_counter()
    while len(activations) < 21 and (len(activations) < 3 or time.perf_counter() - began < 10.0):
        started = time.perf_counter()
        handle.get_llm_context()
        activations.append((time.perf_counter() - started) * 1000)
        system.passivate(key)
    out["activations"] = len(activations)
    out["activation_ms"] = statistics.median(activations)
    latencies = []
    for n in range(writes):
        started = time.perf_counter()
        handle.add_turn(_turn(n), timeout=60)
        latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    out["add_turn_p50_ms"] = latencies[len(latencies) // 2]
    out["add_turn_p99_ms"] = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    gc.collect()
    out["rss_mb"] = (_rss() - before) / 2**20
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
