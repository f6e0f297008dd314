"""11. Long histories: a session of 100,000 turns against one of 100 (JetStream backend).

Each run is a child process (``bench/_history_worker.py``) on one embedded
nats-server. This process writes the session's history into the log first
(`SessionStarted` then `TurnAdded` events in batches, strategy ``truncation``,
the default live horizon), so the child's memory holds only what convmem
keeps. The child then:

* activates the session with no snapshot (a full replay), saves its snapshot
  and records its size (the encoded state);
* activates it again from the snapshot five times (median);
* writes `hist_writes` turns with `add_turn` (p50, p99);
* reads its RSS growth from before the first activation to after the writes.

Runs alternate: 100 turns, then 100,000, round after round. With
``CONVMEM_BASE`` naming a checkout of the code before a change (for example
``git worktree add --detach ../base main``), every run is made with that code
too, alternating with this one, and shown beside it (it is no target: the
targets compare this code's 100,000-turn session with its 100-turn one).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench._common import Figure, Result, Sizes, Target, nats_server
from convmem.adapters import JetStreamEventLog
from convmem.events import ConversationTurn, MemoryKey, SessionStarted, ShortTermMemoryConfig, TurnAdded

__all__ = ["run"]

_WORKER = Path(__file__).resolve().parent / "_history_worker.py"
_ROOT = Path(__file__).resolve().parent.parent
_FIGURES = ("snapshot_bytes", "activation_ms", "add_turn_p99_ms", "rss_mb")


def _fill(log: JetStreamEventLog, key: MemoryKey, turns: int) -> None:
    """The session's history written straight into the log, 500 events a batch."""
    config = ShortTermMemoryConfig(strategy="truncation")
    at = 1_700_000_000.0
    started = SessionStarted(seq=1, event_id=f"{key.session_id}-0", at=at, key=key, config=config)
    log.append(key, [started], expected_seq=0)
    answer = "We said the invoice goes out on Monday and the meeting moves to Tuesday. " * 5
    seq = 1
    while seq <= turns:
        batch = []
        for n in range(seq, min(seq + 500, turns + 1)):
            turn = ConversationTurn(user_message=f"{n}: and the budget?", assistant_response=answer)
            batch.append(
                TurnAdded(seq=n + 1, event_id=f"{key.session_id}-{n}", at=at + n, index=n, turn=turn)
            )
        log.append(key, batch, expected_seq=seq)
        seq += len(batch)


def _child(code: Path, url: str, key: MemoryKey, writes: int) -> dict[str, object]:
    spec = {"url": url, "key": list(key.tokens()), "writes": writes}
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, str(_WORKER), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"history worker ({code}) failed: {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(sizes: Sizes) -> Result:
    result = Result()
    short, long = sizes.hist_turns
    codes = {"this code": _ROOT}
    base = os.environ.get("CONVMEM_BASE")
    if base:
        codes["code before the change"] = Path(base).resolve()
    runs: dict[tuple[str, int], list[dict[str, object]]] = {(c, t): [] for c in codes for t in (short, long)}
    with nats_server(None) as server:
        log = JetStreamEventLog.connect(server.url)
        try:
            for round_ in range(sizes.hist_rounds):
                for turns in (short, long):
                    for label, code in codes.items():
                        key = MemoryKey(
                            "bench", "history", f"r{round_}-{turns}-{len(runs[(label, turns)])}-{label[:4]}"
                        )
                        _fill(log, key, turns)
                        runs[(label, turns)].append(_child(code, server.url, key, sizes.hist_writes))
        finally:
            log.close()
    medians = {
        run_key: {f: statistics.median(float(r[f]) for r in samples) for f in _FIGURES}  # type: ignore[arg-type]
        for run_key, samples in runs.items()
    }
    units = {"snapshot_bytes": "bytes", "activation_ms": "ms", "add_turn_p99_ms": "ms", "rss_mb": "MiB"}
    bounds = {"snapshot_bytes": 2.0, "activation_ms": 2.0, "add_turn_p99_ms": 1.5, "rss_mb": None}
    for figure in _FIGURES:
        value, reference = medians[("this code", long)][figure], medians[("this code", short)][figure]
        bound = bounds[figure]
        result.add(
            Figure(
                f"{figure} at {long:,} turns",
                value,
                units[figure],
                reference=reference,
                reference_label=f"the same at {short:,} turns",
                target=Target("ratio", "<=", bound) if bound is not None else None,
                note="RSS growth: flat means about the same MiB" if figure == "rss_mb" else "",
            )
        )
        if base:
            before = medians[("code before the change", long)][figure]
            result.add(
                Figure(
                    f"{figure} at {long:,} turns, code before the change",
                    before,
                    units[figure],
                    reference=medians[("code before the change", short)][figure],
                    reference_label=f"the same at {short:,} turns",
                )
            )
    result.details = {
        "runs": {f"{label} / {turns} turns": samples for (label, turns), samples in runs.items()},
    }
    result.notes.append(
        f"{sizes.hist_rounds} alternating rounds of a {short}-turn and a {long:,}-turn session "
        f"(strategy truncation, default live horizon), each in a child process: snapshot size, "
        f"activation from the snapshot (median of 5), {sizes.hist_writes} add_turn calls (p99), RSS growth; "
        "JetStream, server default flush"
        + ("; the code before the change alternates with this code" if base else "")
    )
    return result
