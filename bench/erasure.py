"""8. Erasure: how long another process keeps serving an erased session, and what an erasure costs.

Two memory systems on one embedded server, each with its own connection
(two processes, in effect). The holder has a session live; the eraser
erases it through the log (`EventLog.erase`, which returns as soon as the
notice is sent: `MemorySystem.erase` deletes the snapshot after that, so it
returns later still); the figure is the time from that return to the holder
no longer having the session live (its erasure notice handled), over many
rounds: p50, p99 and the worst, against the target of one second on
loopback. Beside it, the time the log's erase takes for a session of 100
events (every message erased on disk, the notice sent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import convmem
from bench._common import Figure, Result, Sizes, Target, nats_server, percentile, sample_turn
from convmem.events import MemoryKey, ShortTermMemoryConfig

__all__ = ["run"]

_CONFIG = ShortTermMemoryConfig(strategy="truncation")


def _until(check: Callable[[], bool], timeout: float = 10.0) -> float:
    started = time.perf_counter()
    pause = threading.Event()  # never set: a short wait between checks
    while not check():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("the holder kept the erased session for 10 s")
        pause.wait(0.0005)
    return time.perf_counter() - started


def run(sizes: Sizes) -> Result:
    rounds = 5 if sizes.smoke else 100
    turns = 10 if sizes.smoke else 99  # with the SessionStarted: 100 events
    result = Result()
    drops: list[float] = []
    erases: list[float] = []
    with (
        nats_server("always") as server,
        convmem.connect(server.url, config=_CONFIG, snapshot_every=20) as eraser,
        convmem.connect(server.url, config=_CONFIG) as holder,
    ):
        for n in range(rounds):
            key = MemoryKey("bench", f"user-{n}", "chat")
            session = holder.session(key)
            for t in range(turns):
                session.add_turn(sample_turn(t))
            assert holder.is_live(key)
            began = time.perf_counter()
            eraser.log.erase(key, at=time.time())  # the log's part alone: it returns once the notice is out
            erases.append(time.perf_counter() - began)
            drops.append(_until(lambda key=key: not holder.is_live(key)))
    p99 = percentile(drops, 99)
    result.add(
        Figure(
            "erased session dropped by another process, p99",
            p99 * 1000,
            "ms",
            target=Target("value", "<=", 1000.0),
            note=f"p50 {percentile(drops, 50) * 1000:.1f} ms, worst {max(drops) * 1000:.1f} ms, "
            f"{rounds} rounds, loopback",
        )
    )
    result.add(
        Figure(
            f"log erase of a {turns + 1}-event session, p50",
            percentile(erases, 50) * 1000,
            "ms",
            note=f"p99 {percentile(erases, 99) * 1000:.1f} ms; every message erased on disk (fsync each)",
        )
    )
    result.details = {
        "drop_ms": [round(d * 1000, 3) for d in drops],
        "erase_ms": [round(e * 1000, 3) for e in erases],
    }
    result.notes.append(
        "drop time: from erase() returning in one process to the other process no longer holding the session"
    )
    return result
