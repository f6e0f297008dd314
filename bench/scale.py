"""6. Scale: resident memory after touching many sessions, and turns/s under passivation churn.

Resident memory runs in a child process of its own (``python -m bench.scale``)
so nothing else of the run is in its heap: a `MemorySystem` with the default
live bound (`max_live_sessions=256`) on JetStream, where the events live in
the nats-server process, not ours. That server keeps its store on tmpfs
(``/dev/shm``) when there is one: on this disk every new session costs an
fsync (see the next paragraph) and 100,000 of them would take 10-30 minutes;
where the store lies does not change this process's memory.

New sessions on disk: the first `add_turn` of a session appends
`SessionStarted` and `TurnAdded` as one atomic batch, and nats-server commits
an atomic batch with an fsync even under its default flush. The rate of new
sessions with the store on disk is measured against the same on tmpfs.

Callers add one turn to each of 1,000, then 10,000, then 100,000 sessions in
all; after each checkpoint the child collects garbage, lets passivated actors
finish, and reads its RSS (psutil). The server's RSS is reported beside it.
Sessions past the live bound stay in the idle cache (its default bound, 512
MiB, holds all 100,000 of these one-turn sessions): the target is that the
RSS grows by no more than the cache counts (`idle_bytes`, an upper estimate;
here well above, as every session's turn shares the same text objects).

Churn (in this process): `churn_turns` turns round-robin over
`churn_sessions` sessions with `max_live_sessions=churn_live`, so nearly every
turn activates a session from the log; the reference is the same load with
every session live.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench._common import (
    FULL,
    SMOKE,
    Figure,
    Result,
    Sizes,
    Target,
    embedded_backend,
    in_threads,
    memory_store_root,
    sample_turn,
    session_keys,
)
from convmem.actors import MemorySystem, SessionHandle
from convmem.events import MemoryKey, ShortTermMemoryConfig

__all__ = ["run"]


def _settle(system: MemorySystem, seconds: float = 10.0) -> None:
    """Wait until passivated actors' threads are gone (bounded), then collect garbage."""
    deadline = time.monotonic() + seconds
    live = system.live_sessions()
    while time.monotonic() < deadline and threading.active_count() > live + 16:
        time.sleep(0.05)
    gc.collect()
    gc.collect()


def _touch(system: MemorySystem, keys: list[MemoryKey], callers: int) -> None:
    turn = sample_turn(1)

    def caller(share: int) -> None:
        for key in keys[share::callers]:
            system.session(key).add_turn(turn, timeout=60)

    in_threads(caller, callers, timeout=1800)


def worker(sizes: Sizes) -> dict[str, object]:
    """The child's side: touch sessions up to each checkpoint, report RSS and rates."""
    me = psutil.Process()
    rows = []
    with embedded_backend(None, store_root=memory_store_root()) as backend:
        assert backend.server is not None
        assert backend.server.pid is not None
        server = psutil.Process(backend.server.pid)
        with MemorySystem(
            ShortTermMemoryConfig(strategy="truncation"), log=backend.log, snapshots=backend.snapshots
        ) as system:
            _touch(system, session_keys(sizes.sc_callers * 4, user="warm"), sizes.sc_callers)
            _settle(system)
            baseline = me.memory_info().rss
            keys = session_keys(max(sizes.sc_checkpoints), user="scale")
            done = 0
            for checkpoint in sizes.sc_checkpoints:
                started = time.perf_counter()
                _touch(system, keys[done:checkpoint], sizes.sc_callers)
                elapsed = time.perf_counter() - started
                _settle(system)
                rows.append(
                    {
                        "sessions": checkpoint,
                        "rss_bytes": me.memory_info().rss,
                        "server_rss_bytes": server.memory_info().rss,
                        "live_sessions": system.live_sessions(),
                        "cached_sessions": system.cached_sessions()[0],
                        "cached_bytes": system.cached_sessions()[1],
                        "threads": threading.active_count(),
                        "new_sessions_per_s": (checkpoint - done) / elapsed,
                    }
                )
                done = checkpoint
            counts = system.metrics.snapshot()["counts"]
    return {"baseline_rss_bytes": baseline, "rows": rows, "counts": counts}


def _churn(sizes: Sizes, live: int) -> tuple[float, int]:
    keys = session_keys(sizes.churn_sessions, user="churn")
    callers = 16 if not sizes.smoke else 4
    per_caller = sizes.churn_turns // callers
    turns = [sample_turn(n) for n in range(16)]
    with (
        embedded_backend(None) as backend,
        MemorySystem(
            ShortTermMemoryConfig(strategy="truncation"),
            log=backend.log,
            snapshots=backend.snapshots,
            max_live_sessions=live,
        ) as system,
    ):
        handles: list[SessionHandle] = [system.session(k) for k in keys]
        for handle in handles:  # every session exists before the timed part
            handle.start(timeout=60)
        before = system.metrics.snapshot()["counts"].get("activations", 0)

        def caller(index: int) -> None:
            for n in range(per_caller):
                # Round-robin over all sessions, callers interleaved.
                handles[(n * callers + index) % len(handles)].add_turn(turns[n % len(turns)], timeout=60)

        elapsed = in_threads(caller, callers, timeout=900)
        activations = system.metrics.snapshot()["counts"].get("activations", 0) - before
    return per_caller * callers / elapsed, activations


def _new_sessions_rate(sizes: Sizes, store_root: str | None) -> float:
    """New sessions per second (each a first add_turn) with the store on `store_root` (None: disk)."""
    with (
        embedded_backend(None, store_root=store_root) as backend,
        MemorySystem(
            ShortTermMemoryConfig(strategy="truncation"), log=backend.log, snapshots=backend.snapshots
        ) as system,
    ):
        _touch(system, session_keys(sizes.sc_callers, user="warm"), sizes.sc_callers)
        keys = session_keys(sizes.sc_disk_sessions, user="disk")
        started = time.perf_counter()
        _touch(system, keys, sizes.sc_callers)
        return len(keys) / (time.perf_counter() - started)


def run(sizes: Sizes) -> Result:
    result = Result()
    completed = subprocess.run(
        [sys.executable, "-m", "bench.scale", "smoke" if sizes.smoke else "full"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the scale worker failed:\n{completed.stderr[-3000:]}")
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    rows = report["rows"]
    first = rows[0]
    for row in rows:
        result.add(
            Figure(
                f"RSS after touching {row['sessions']:,} sessions",
                row["rss_bytes"] / 2**20,
                "MiB",
                reference=first["rss_bytes"] / 2**20,
                reference_label=f"RSS after {first['sessions']:,} sessions",
                note=f"server RSS {row['server_rss_bytes'] / 2**20:.0f} MiB; "
                f"{row['cached_sessions']:,} sessions in the idle cache, "
                f"{row['cached_bytes'] / 2**20:.0f} MiB by its count",
            )
        )
    last = rows[-1]
    # The idle cache holds up to `idle_cache_bytes` (512 MiB by default) on purpose: what grows
    # with the sessions must be no more than it counts (its count is an upper estimate).
    result.add(
        Figure(
            f"RSS growth from {first['sessions']:,} to {last['sessions']:,} sessions",
            (last["rss_bytes"] - first["rss_bytes"]) / 2**20,
            "MiB",
            reference=max(last["cached_bytes"] - first["cached_bytes"], 1) / 2**20,
            reference_label="the idle cache's count of its growth (idle_bytes)",
            target=Target("ratio", "<=", 1.0),
        )
    )
    for row in rows:
        result.add(
            Figure(f"new sessions/s up to {row['sessions']:,}", row["new_sessions_per_s"], "sessions/s")
        )
    tmpfs = memory_store_root()
    if tmpfs is not None:
        on_disk = _new_sessions_rate(sizes, None)
        in_memory = _new_sessions_rate(sizes, tmpfs)
        result.add(
            Figure(
                f"new sessions/s, store on disk ({sizes.sc_disk_sessions} sessions)",
                on_disk,
                "sessions/s",
                reference=in_memory,
                reference_label="the same with the store on tmpfs (as the RSS run)",
                note="a first add_turn appends SessionStarted + TurnAdded as one atomic batch",
            )
        )
    churn_rate, churn_activations = _churn(sizes, sizes.churn_live)
    steady_rate, _ = _churn(sizes, sizes.churn_sessions + 24)
    result.add(
        Figure(
            f"add_turn turns/s, {sizes.churn_sessions:,} sessions round-robin, {sizes.churn_live} live",
            churn_rate,
            "turns/s",
            reference=steady_rate,
            reference_label="same load, every session live",
            note=f"{churn_activations} activations",
        )
    )
    result.details = {"worker": report, "churn_activations": churn_activations}
    result.notes.append(
        "RSS measured in a child process on JetStream (the events live in the nats-server process, whose RSS "
        "is in the details); default live bound 256 and idle cache (512 MiB); baseline RSS before any "
        f"session "
        f"{report['baseline_rss_bytes'] / 2**20:.0f} MiB; "
        "churn and its reference use the server default flush"
    )
    return result


if __name__ == "__main__":
    chosen = SMOKE if sys.argv[1:] == ["smoke"] else FULL
    print(json.dumps(worker(chosen)))
