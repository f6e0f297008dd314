"""16. Retention: what a sweep costs per session, beside rebuilding the same session.

One embedded server (``sync_interval: always``) holds `sessions` sessions of
`turns` turns each. Side by side, on the same sessions, in alternating
rounds: a dry-run sweep (read every session's events, fold them, plan: what
any sweep pays for every session of a tenant with a policy) against
rebuilding each session from its log alone (`load_state` without snapshots,
what an audit or an activation without a snapshot pays). Then one applied
sweep compacts every session to its last 10 turns: the time per session of
the compaction (append, snapshot, every earlier message erased on disk), and
the events it removed.
"""

from __future__ import annotations

import time

import convmem
from bench._common import Figure, Result, Sizes, nats_server, sample_turn
from convmem.actors import load_state, sweep_retention
from convmem.events import MemoryKey, RetentionPolicies, RetentionPolicy, ShortTermMemoryConfig

__all__ = ["run"]

_CONFIG = ShortTermMemoryConfig(strategy="truncation")


def run(sizes: Sizes) -> Result:
    sessions, turns, rounds = (4, 14, 2) if sizes.smoke else (50, 100, 4)  # over max_turns (10) either way
    result = Result()
    policies = RetentionPolicies(default=RetentionPolicy(max_turns=10))
    keys = [MemoryKey("bench", f"user-{n}", "chat") for n in range(sessions)]
    with nats_server("always") as server, convmem.connect(server.url, config=_CONFIG) as memory:
        for key in keys:
            session = memory.session(key)
            for t in range(turns):
                session.add_turn(sample_turn(t))
        log = memory.log
        sweeps: list[float] = []
        loads: list[float] = []
        for r in range(rounds):
            for kind in ("sweep", "load") if r % 2 == 0 else ("load", "sweep"):
                began = time.perf_counter()
                if kind == "sweep":
                    report = sweep_retention(log, policies, now=time.time(), dry_run=True)
                    assert report.count("compact") == sessions
                    sweeps.append(time.perf_counter() - began)
                else:
                    for key in keys:
                        load_state(log, None, key)
                    loads.append(time.perf_counter() - began)
        began = time.perf_counter()
        applied = sweep_retention(log, policies, now=time.time(), dry_run=False)
        apply_s = time.perf_counter() - began
        assert applied.count("compact") == sessions
        removed = sum(o.events_removed for o in applied.outcomes)
    sweep_ms = min(sweeps) / sessions * 1000
    load_ms = min(loads) / sessions * 1000
    result.add(
        Figure(
            f"dry-run sweep per session of {turns + 1} events",
            sweep_ms,
            "ms",
            reference=load_ms,
            reference_label="rebuilding it from the log",
            note=f"{sessions} sessions, best of {rounds} alternating rounds each",
        )
    )
    result.add(
        Figure(
            f"compaction per session ({turns} turns to 10)",
            apply_s / sessions * 1000,
            "ms",
            note=f"append + {removed // sessions} messages erased on disk each; {sessions} sessions",
        )
    )
    result.details = {"sweep_s": sweeps, "load_s": loads, "apply_s": apply_s, "events_removed": removed}
    result.notes.append("a sweep reads and folds each session of a tenant with a policy: about a replay")
    return result
