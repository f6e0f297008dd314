"""Chaos: the faults of the chaos suite, larger, with the table of what each did to acknowledged turns.

Runs the cases of ``tests/chaos.py`` and ``tests/chaos_procs.py`` (the same
code the ``chaos`` tests run small): kill -9 of nats-server in both fsync
modes under thread and asyncio writers, kill -9 and restart of a writing
process continuing its sessions, ``convmem serve`` killed (frozen first) and
stopped by SIGTERM beside a second one, and the R3 stream leader (several
rounds: its error window is the README's figure) and a follower killed in a
three-node cluster. Writers retry every failed write with the same
`idempotency_key` until it is acknowledged.

Each case's row: turns acknowledged, turns stored (every TurnAdded in the
log, a turn stored twice counted twice), acknowledged turns lost, turns
stored more than once, sessions out of order, the longest stall between two
acknowledgements and the error window (from a fault to the last write that
failed after it). The figure per case is lost + duplicated, target 0; the
cases of bad input and exhausted limits (an oversized turn, retries after a
1 s duplicate window, foreign messages in a session, a full store: an 8 MiB
tmpfs where it can be mounted, and a tiny ``max_file_store``) add a figure
for their own promises (`BROKEN`), target 0. Not
part of the default run (it takes minutes and kills processes): run it with
``python -m bench --only chaos``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import Figure, Result, Sizes, Target

TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:  # the cases and the cluster helper live beside the tests that run them
    sys.path.insert(0, str(TESTS))

from chaos import Tally, server_kill  # noqa: E402
from chaos_faults import duplicate_window_retries, foreign_messages, oversized_turns  # noqa: E402
from chaos_procs import process_restart, r3_kill, serve_stop  # noqa: E402
from chaos_store import full_store  # noqa: E402

__all__ = ["markdown", "run"]

COLUMNS = (
    "case",
    "acknowledged",
    "stored",
    "lost",
    "duplicated",
    "longest_stall_s",
    "error_window_s",
    "broken",
)


def _cases(sizes: Sizes) -> list[tuple[str, Callable[[Path], Any]]]:
    small = sizes.smoke
    cycles = 2 if small else 10
    kill_turns = 10 if small else 100
    leader_rounds = 1 if small else 3
    cases: list[tuple[str, Callable[[Path], Any]]] = []
    for sync in ("always", "default"):
        for writers in ("threads", "asyncio"):
            cases.append(
                (
                    f"server-{sync}-{writers}",
                    lambda tmp, sync=sync, writers=writers: server_kill(
                        tmp / "nats", sync=sync, writers=writers, sessions=40, turns=kill_turns, cycles=cycles
                    ),
                )
            )
    cases.append(
        (
            "process",
            lambda tmp: process_restart(
                tmp, sessions=12, turns=20 if small else 200, cycles=2 if small else 5
            ),
        )
    )
    for how in ("kill -9", "SIGTERM"):
        cases.append(
            (
                f"serve-{how}",
                lambda tmp, how=how: serve_stop(tmp, how=how, sessions=40, turns=10 if small else 50),
            )
        )
    for n in range(leader_rounds):
        cases.append(
            (
                f"r3-leader-{n}",
                lambda tmp: r3_kill(tmp, role="leader", sessions=20, turns=30 if small else 150),
            )
        )
    cases.append(
        ("r3-follower", lambda tmp: r3_kill(tmp, role="follower", sessions=20, turns=30 if small else 150))
    )
    cases.append(
        (
            "oversized",
            lambda tmp: oversized_turns(tmp, sessions=8 if small else 16, turns=10 if small else 50),
        )
    )
    cases.append(
        (
            "dup-window",
            lambda tmp: duplicate_window_retries(tmp, sessions=6 if small else 20, turns=5 if small else 20),
        )
    )
    cases.append(
        ("foreign", lambda tmp: foreign_messages(tmp, sessions=8 if small else 10, turns=10 if small else 40))
    )
    for disk in ("tmpfs", "max_file_store"):
        cases.append((f"full-{disk}", lambda tmp, disk=disk: full_store(tmp, disk=disk, sessions=8)))
    return cases


BROKEN = {
    "misreported": "oversized turns not refused as InvalidTurn",
    "oversized_stored": "oversized turns stored",
    "unreported": "foreign messages not reported at their position",
    "hidden_from_replay": "acknowledged turns a replay does not show",
    "reported_as_outage": "full-store errors reported as a server outage",
}
"""A case's own promises beyond lost and duplicated (a row's note key: what breaking it means)."""


def broken_promises(row: dict[str, Any]) -> dict[str, int]:
    """How many times each of the case's own promises was broken (see `BROKEN`)."""
    out = {}
    for key in BROKEN:
        value = row.get(key)
        count = len(value) if isinstance(value, list | dict) else int(value or 0)
        if count:
            out[key] = count
    return out


def _cell(value: Any) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{BROKEN.get(k, k)}: {v:,}" for k, v in value.items()) or "none"
    return str(value)


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The table as markdown lines (for RESULTS.md)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |")
    return lines


def run(sizes: Sizes) -> Result:
    result = Result()
    rows: list[dict[str, Any]] = []
    for name, case in _cases(sizes):
        with tempfile.TemporaryDirectory(prefix=f"convmem-chaos-{name.replace(' ', '')}-") as tmp:
            try:
                tally: Tally = case(Path(tmp))
            except Exception as exc:  # the case could not finish: a failed row, the run goes on
                result.notes.append(f"{name} failed: {type(exc).__name__}: {str(exc)[:300]}")
                result.add(Figure(f"{name}: the case finished", 0, "", target=Target("value", ">=", 1)))
                continue
        row = tally.row()
        row["broken"] = broken_promises(row)
        rows.append(row)
        result.add(
            Figure(
                f"{row['case']}: acknowledged turns lost or duplicated",
                row["lost"] + row["duplicated"],
                "turns",
                target=Target("value", "<=", 0),
                note=f"{row['acknowledged']:,} acknowledged, {row['stored']:,} stored, "
                f"longest stall {row['longest_stall_s']:.2f} s, error window {row['error_window_s']:.2f} s",
            )
        )
        if row["broken"] or any(key in row for key in BROKEN):
            result.add(
                Figure(
                    f"{row['case']}: its own promises broken",
                    sum(row["broken"].values()),
                    "times",
                    target=Target("value", "<=", 0),
                    note="; ".join(f"{BROKEN[k]}: {n}" for k, n in row["broken"].items()) or "none",
                )
            )
    leader = [r for r in rows if "leader" in r["case"]]
    if leader:
        windows = [r["error_window_s"] for r in leader]
        stalls = [r["longest_stall_s"] for r in leader]
        result.add(
            Figure(
                "R3 stream leader kill -9: error window, worst round",
                max(windows),
                "s",
                note=f"rounds {', '.join(f'{w:.2f}' for w in windows)} s; longest stall in acknowledgements "
                f"{', '.join(f'{s:.2f}' for s in stalls)} s",
            )
        )
    result.details = {"table": rows}
    result.notes.extend(markdown(rows))
    return result
