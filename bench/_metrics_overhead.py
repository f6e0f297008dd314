"""What Prometheus metrics cost a durable write: ``python -m bench._metrics_overhead [OUT.json]``.

One nats-server (``sync_interval: always``) serves two systems on streams of
their own, one plain and one with a `PrometheusMetrics` (no scrape during
the run). Each round writes `TURNS` durable ``add_turn``s from one thread to
each, in alternating order (plain first, then metrics first); the figure is
the median per-write latency over the rounds. Beside it: the sink's own
cost per write (one histogram observation and two counter increments, what
a stored turn does), against the runtime's internal `Metrics` alone.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from typing import Any

from bench._common import nats_server, sample_turn, write_json
from convmem.actors import Metrics
from convmem.adapters import PrometheusMetrics, connect
from convmem.events import MemoryKey, ShortTermMemoryConfig

ROUNDS = 6
TURNS = 300
CALLS = 100_000


def _per_write_us(system: Any, prefix: str) -> float:
    handle = system.session(MemoryKey("bench", "u", f"{prefix}-{uuid.uuid4().hex[:8]}"))
    handle.add_turn(sample_turn(0))  # opening the session is not measured
    started = time.perf_counter()
    for n in range(TURNS):
        handle.add_turn(sample_turn(n + 1), timeout=60)
    return (time.perf_counter() - started) / TURNS * 1e6


def _sink_us(metrics: Metrics) -> float:
    started = time.perf_counter()
    for _ in range(CALLS):
        metrics.observe_append(0.001)
        metrics.count("writes.AddTurn")
        metrics.count("turns")
    return (time.perf_counter() - started) / CALLS * 1e6


def main(out: str | None) -> dict[str, Any]:
    config = ShortTermMemoryConfig(strategy="truncation")
    plain_us: list[float] = []
    metered_us: list[float] = []
    with nats_server("always") as server:
        tag = uuid.uuid4().hex[:8]
        names = [(f"PLAIN_{tag}", f"p{tag}.ev", f"PS_{tag}"), (f"METER_{tag}", f"m{tag}.ev", f"MS_{tag}")]
        plain = connect(server.url, stream=names[0][0], prefix=names[0][1], bucket=names[0][2], config=config)
        metered = connect(
            server.url,
            stream=names[1][0],
            prefix=names[1][1],
            bucket=names[1][2],
            config=config,
            metrics=PrometheusMetrics(),
        )
        try:
            for r in range(ROUNDS):
                order = [(plain, plain_us, "p"), (metered, metered_us, "m")]
                for system, out_list, prefix in order if r % 2 == 0 else order[::-1]:
                    out_list.append(_per_write_us(system, prefix))
        finally:
            plain.close()
            metered.close()
    sink_plain = [_sink_us(Metrics()) for _ in range(3)]
    sink_metered = [_sink_us(Metrics(sink=PrometheusMetrics())) for _ in range(3)]
    result = {
        "what": "durable add_turn latency (one thread, sync_interval always) without and with "
        "PrometheusMetrics, alternating rounds; and the per-write cost of the runtime's counters "
        "without and with the sink",
        "command": "python -m bench._metrics_overhead bench/metrics-overhead.json",
        "rounds": ROUNDS,
        "turns_per_round": TURNS,
        "write_us": {"plain": plain_us, "metrics": metered_us},
        "write_us_median": {"plain": statistics.median(plain_us), "metrics": statistics.median(metered_us)},
        "counters_us_per_write": {"plain": sink_plain, "metrics": sink_metered},
        "counters_us_per_write_median": {
            "plain": statistics.median(sink_plain),
            "metrics": statistics.median(sink_metered),
        },
    }
    write_json(out, result)
    return result


if __name__ == "__main__":
    figures = main(sys.argv[1] if len(sys.argv) > 1 else None)
    print(json.dumps({k: v for k, v in figures.items() if k.endswith("median")}, indent=2))
