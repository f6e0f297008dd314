"""Counters and append latencies of a memory system, cheap enough for the write path.

A `MetricsSink` (`MemorySystem(metrics=...)`, e.g. `convmem.PrometheusMetrics`)
sees every count and every append latency too, after this object's lock is let go.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Protocol

__all__ = ["Metrics", "MetricsSink"]


class MetricsSink(Protocol):
    """Where a memory system's counts and latencies go besides its own `Metrics` (thread-safe, cheap)."""

    def count(self, name: str, n: int) -> None:
        """Counter `name` grew by `n` (``turns``, ``writes.AddTurn``, ``health.degraded``...)."""

    def observe_append(self, seconds: float) -> None:
        """One durable append took `seconds`, from its start to the log's acknowledgement."""

    def watch(self, system: Any) -> None:
        """`system` (a `MemorySystem`) reports here: read its gauges when asked for them."""


class Metrics:
    """Thread-safe counters plus the last `window` append latencies."""

    def __init__(self, window: int = 10_000, sink: MetricsSink | None = None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._latencies: deque[float] = deque(maxlen=window)

    def count(self, name: str, n: int = 1) -> None:
        """Add `n` to counter `name`."""
        with self._lock:
            self._counts[name] += n
        if self._sink is not None:
            self._sink.count(name, n)

    def observe_append(self, seconds: float) -> None:
        """Record one acknowledged append's latency."""
        with self._lock:
            self._latencies.append(seconds)
        if self._sink is not None:
            self._sink.observe_append(seconds)

    def wrote(self, name: str, seconds: float) -> None:
        """`count(name)` and `observe_append(seconds)` at once: a write that ended on its append's
        acknowledgement (one lock, not two)."""
        with self._lock:
            self._counts[name] += 1
            self._latencies.append(seconds)
        if self._sink is not None:
            self._sink.count(name, 1)
            self._sink.observe_append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """Counters and append latency percentiles (milliseconds)."""
        with self._lock:
            counts = dict(self._counts)
            latencies = sorted(self._latencies)
        out: dict[str, Any] = {"counts": counts}
        if latencies:

            def pct(p: float) -> float:
                return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)

            out["append_ms"] = {"p50": pct(0.50), "p99": pct(0.99), "max": pct(1.0), "n": len(latencies)}
        return out
