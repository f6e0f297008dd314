"""11. Long histories: a session of 100,000 turns against one of 100 (JetStream backend).

Each run is a child process (``bench/_history_worker.py``) on one embedded
nats-server. This process writes the session's history into the log first
(`SessionStarted` then `TurnAdded` events in batches; for ``rolling_summary``
a `SummaryProduced` every 10 turns, as a healthy summarizer leaves it; the
default live horizon), so the child's memory holds only what convmem keeps.
The child then:

* activates the session with no snapshot (a full replay), saves its snapshot
  and records its size (the encoded state);
* then, in a second child (a service restarted), activates it from the
  snapshot 21 times (median; at least 3, at most 10 s of them), writes
  `hist_writes` turns with `add_turn` (p50, p99) and reads its RSS growth
  from before the first activation to after the writes.

Runs alternate: for each strategy (``truncation``, ``rolling_summary``), 100
turns, then 100,000, round after round. With ``CONVMEM_BASE`` naming a
checkout of the code before a change (for example ``git worktree add
--detach ../base main``), every run is made with that code too, alternating
with this one, and shown beside it (it is no target: the targets compare
this code's 100,000-turn session with its 100-turn one).
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
from convmem.events import (
    ConversationTurn,
    Event,
    MemoryKey,
    SessionStarted,
    ShortTermMemoryConfig,
    Strategy,
    SummaryProduced,
    TurnAdded,
)

__all__ = ["run"]

_WORKER = Path(__file__).resolve().parent / "_history_worker.py"
_ROOT = Path(__file__).resolve().parent.parent
_FIGURES = ("snapshot_bytes", "activation_ms", "add_turn_p99_ms", "rss_mb")


def _fill(log: JetStreamEventLog, key: MemoryKey, turns: int, strategy: Strategy) -> None:
    """The session's history written straight into the log, 500 events a batch.

    With ``rolling_summary``, a summary of all but the last 5 turns follows every 10th
    turn, as a healthy summarizer leaves the log.
    """
    config = ShortTermMemoryConfig(strategy=strategy)
    at = 1_700_000_000.0
    started = SessionStarted(seq=1, event_id=f"{key.session_id}-s", at=at, key=key, config=config)
    log.append(key, [started], expected_seq=0)
    answer = "We said the invoice goes out on Monday and the meeting moves to Tuesday. " * 5
    seq, covered = 1, 0
    batch: list[Event] = []
    for n in range(1, turns + 1):
        turn = ConversationTurn(user_message=f"{n}: and the budget?", assistant_response=answer)
        event_id = f"{key.session_id}-{n}"
        batch.append(TurnAdded(seq=seq + len(batch) + 1, event_id=event_id, at=at + n, index=n, turn=turn))
        if config.summarizes and n % 10 == 0:
            batch.append(
                SummaryProduced(
                    seq=seq + len(batch) + 1,
                    event_id=f"{event_id}-summary",
                    at=at + n,
                    summary=f"{n - 5} turns about the budget and the meeting.",
                    covers_from=covered + 1,
                    covers_through=n - 5,
                )
            )
            covered = n - 5
        if len(batch) >= 500 or n == turns:
            log.append(key, batch, expected_seq=seq)
            seq += len(batch)
            batch = []


def _child(code: Path, url: str, key: MemoryKey, writes: int, strategy: Strategy) -> dict[str, object]:
    """Both phases of one run, each a process of its own; their figures together."""
    prepared = _phase("prepare", code, url, key, writes, strategy)
    return {**prepared, **_phase("measure", code, url, key, writes, strategy)}


def _phase(
    phase: str, code: Path, url: str, key: MemoryKey, writes: int, strategy: Strategy
) -> dict[str, object]:
    spec = {"url": url, "key": list(key.tokens()), "writes": writes, "strategy": strategy, "phase": phase}
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
    runs: dict[tuple[str, Strategy, int], list[dict[str, object]]] = {
        (c, s, t): [] for c in codes for s in sizes.hist_strategies for t in (short, long)
    }
    with nats_server(None) as server:
        log = JetStreamEventLog.connect(server.url, timeout=300.0)
        try:
            for round_ in range(sizes.hist_rounds):
                for strategy in sizes.hist_strategies:
                    for turns in (short, long):
                        for label, code in codes.items():
                            samples = runs[(label, strategy, turns)]
                            key = MemoryKey("bench", "history", f"{strategy}-{turns}-{label[:4]}-{round_}")
                            _fill(log, key, turns, strategy)
                            samples.append(_child(code, server.url, key, sizes.hist_writes, strategy))
        finally:
            log.close()
    medians = {
        run_key: {f: statistics.median(float(r[f]) for r in samples) for f in _FIGURES}  # type: ignore[arg-type]
        for run_key, samples in runs.items()
    }
    units = {"snapshot_bytes": "bytes", "activation_ms": "ms", "add_turn_p99_ms": "ms", "rss_mb": "MiB"}
    bounds = {"snapshot_bytes": 2.0, "activation_ms": 2.0, "add_turn_p99_ms": 1.5, "rss_mb": None}
    for strategy in sizes.hist_strategies:
        for label in codes:
            before = label != "this code"
            for figure in _FIGURES:
                bound = bounds[figure]
                result.add(
                    Figure(
                        f"{figure} at {long:,} turns, {strategy}"
                        + (", code before the change" if before else ""),
                        medians[(label, strategy, long)][figure],
                        units[figure],
                        reference=medians[(label, strategy, short)][figure],
                        reference_label=f"the same at {short:,} turns",
                        target=Target("ratio", "<=", bound) if bound is not None and not before else None,
                        note="RSS growth of the child from before activation to after the writes"
                        if figure == "rss_mb"
                        else "",
                    )
                )
    result.details = {
        "runs": {
            f"{label} / {strategy} / {turns} turns": samples
            for (label, strategy, turns), samples in runs.items()
        },
    }
    result.notes.append(
        f"{sizes.hist_rounds} alternating rounds of a {short}-turn and a {long:,}-turn session "
        f"({', '.join(sizes.hist_strategies)}; default live horizon), each in a child process: "
        f"snapshot size, activation from the snapshot (median of up to 21), {sizes.hist_writes} "
        "add_turn calls (p99), RSS growth; "
        "JetStream, server default flush"
        + ("; the code before the change alternates with this code" if base else "")
    )
    return result
