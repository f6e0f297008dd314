"""13. Fair shares: another tenant's writes while one tenant floods the service (issue 23, item 2).

One nats-server (default flush, its store on tmpfs when there is room) and
one `convmem serve --workers 1` with the default quotas (each tenant at most
32 requests in flight, 8 running, in one worker). The victim, tenant
``victim`` in this process, writes turns one after another through a
`RemoteSession` (each acknowledged by JetStream) and times each. The flood
is tenant ``flood`` in a process of its own (`bench._flood`): a plain nats-py
client keeping WINDOW cheap requests (``context``) in flight at all times, so
it sends as fast as the service answers, far past its share: most of its
requests are refused with `Busy` at once. WINDOW is 128: the flood's rate
peaks there (512 in flight gave fewer replies a second on this machine, and
only a longer queue in front of the service).

Rounds alternate: the victim's writes without the flood; the same number
under the flood (started and seen answered before the victim's first write,
stopped after its last); and, as a control, under the same flood aimed at a
trivial responder process instead of the service (`bench._flood echo`): what
the flooding process costs the machine (its cores, nats-server) whatever the
service does. The figures: the victim's write p99 under the flood against
its p99 without (pooled over the rounds; target within 3x), the victim's
writes that failed (target 0), and the control's p99. The details hold each
round's p50/p99, the flood's replies per second and their kinds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    Figure,
    LoadProcess,
    Result,
    Sizes,
    Target,
    memory_store_root,
    nats_server,
    percentile,
    sample_turn,
)
from bench.workers import _Serve
from convmem.adapters import RemoteMemory
from convmem.events import MemoryKey

__all__ = ["run"]

_WINDOW = 128
"""The flood's requests in flight: 4 times the default max_in_flight, where its rate peaks."""
_CONTROL_PREFIX = "control.api"
"""Where the control flood goes: the trivial responder's subjects, never the service's."""


class _Flood(LoadProcess):
    """The flooding tenant's process: floods from `start` until `stop`, which returns its counts."""

    def __init__(self, url: str, prefix: str | None = None) -> None:
        args = [url, "flood", str(_WINDOW), *([prefix] if prefix else [])]
        super().__init__("bench._flood", args, phase="flooding", wait=60.0)


def _writes(remote: RemoteMemory, key: MemoryKey, count: int, first: int) -> tuple[list[float], list[str]]:
    """Seconds of each of `count` writes to `key`, and the errors of those that failed."""
    session = remote.session(key)
    took: list[float] = []
    failed: list[str] = []
    for n in range(first, first + count):
        began = time.perf_counter()
        try:
            session.add_turn(sample_turn(n))
        except Exception as exc:  # a failed write is a figure here, not a crash
            failed.append(type(exc).__name__)
            continue
        took.append(time.perf_counter() - began)
    return took, failed


def _stats(took: list[float], lost: list[str], counts: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "p50_ms": round(percentile(took, 50) * 1000, 3),
        "p99_ms": round(percentile(took, 99) * 1000, 3),
        "failed": lost,
    }
    if counts is not None:
        out["flood_replies_per_s"] = round(counts["per_s"])
        out["flood_replies"] = counts["counts"]
    return out


def _figures(
    result: Result, took: dict[str, list[float]], failed: list[str], per_round: list[dict[str, Any]], how: str
) -> None:
    """The measure's figures, from the write times of every phase."""
    ms = {phase: percentile(values, 99) * 1000 for phase, values in took.items()}
    p50 = {phase: percentile(values, 50) * 1000 for phase, values in took.items()}
    flood_rows = [r["flood"] for r in per_round]
    busy = sum(r["flood_replies"].get("Busy", 0) for r in flood_rows)
    replies = sum(sum(r["flood_replies"].values()) for r in flood_rows)
    rate = sum(r["flood_replies_per_s"] for r in flood_rows) / len(flood_rows)
    result.add(
        Figure(
            "victim add_turn p99 under one tenant's flood vs without",
            ms["flood"],
            "ms",
            reference=ms["quiet"],
            reference_label="p99 without the flood",
            target=Target("ratio", "<=", 3.0),
            note=f"{how}; p50 {p50['flood']:.2f} vs {p50['quiet']:.2f} ms",
        )
    )
    result.add(
        Figure(
            "victim writes failed under the flood",
            len(failed),
            "writes",
            target=Target("value", "<=", 0),
            note=f"of {len(took['flood']) + len(failed)}; the flood: {rate:,.0f} replies/s, "
            f"{busy / max(replies, 1):.0%} Busy, {_WINDOW} requests in flight",
        )
    )
    result.add(
        Figure(
            "control: victim add_turn p99 while the same flood hits a trivial responder",
            ms["control"],
            "ms",
            reference=ms["quiet"],
            reference_label="p99 without the flood",
            note="what the flooding process costs the machine alone (cores, nats-server), "
            f"p50 {p50['control']:.2f} ms",
        )
    )


def run(sizes: Sizes) -> Result:
    result = Result()
    rounds, writes, warm = (1, 10, 3) if sizes.smoke else (4, 250, 20)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    took: dict[str, list[float]] = {"quiet": [], "flood": [], "control": []}
    failed: list[str] = []
    per_round: list[dict[str, Any]] = []
    with (
        nats_server(None, store_root=memory_store_root()) as server,
        tempfile.TemporaryDirectory(prefix="convmem-fairness-") as folder,
    ):
        quotas = json.loads(os.environ.get("CONVMEM_FAIRNESS_QUOTAS", "null"))  # exploring other limits
        echo = subprocess.Popen(  # starting while the serve starts
            [sys.executable, "-m", "bench._flood", "echo", server.url, _CONTROL_PREFIX],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            serve = _Serve(server.url, 1, Path(folder), quotas=quotas)
        except BaseException:
            echo.kill()
            echo.wait(30)
            raise
        try:
            assert echo.stdout is not None
            echo.stdout.readline()  # echoing
            with RemoteMemory(server.url, timeout=30.0) as remote:
                key = MemoryKey("victim", "u", "chat")
                done = warm
                _writes(remote, key, done, 0)  # warm-up: the session live, the connections made
                for r in range(rounds):
                    row: dict[str, Any] = {"round": r}
                    for phase in ("quiet", "flood", "control"):
                        flood = (
                            None
                            if phase == "quiet"
                            else _Flood(server.url, _CONTROL_PREFIX if phase == "control" else None)
                        )
                        try:
                            times, lost = _writes(remote, key, writes, done)
                        finally:
                            counts = flood.stop() if flood is not None else None
                        done += writes
                        took[phase] += times
                        if phase == "flood":
                            failed += lost
                        row[phase] = _stats(times, lost, counts)
                    per_round.append(row)
        finally:
            if echo.stdin is not None:
                echo.stdin.close()
            echo.wait(30)
            serve.stop()
    _figures(result, took, failed, per_round, f"{rounds} alternating rounds of {writes} writes each way")
    result.details = {
        "rounds": per_round,
        "failed": failed,
        "window": _WINDOW,
        "load_at_start": load_at_start,
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    result.notes.append(
        "victim: tenant 'victim', sequential RemoteSession.add_turn; flood: tenant 'flood', "
        f"{_WINDOW} context requests always in flight from another process; one serve worker, default quotas"
    )
    return result
