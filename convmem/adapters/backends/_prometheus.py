"""Prometheus metrics of memory systems and services, with `prometheus_client` (no hand-made exposition).

`PrometheusMetrics` is a `MetricsSink`: give it to a system
(``MemorySystem(..., metrics=pm)``) and it counts that system's writes, errors,
summaries and health changes as they happen, and reads its gauges (live and
idle-cached sessions, live sessions by health, erasures pending) at each
scrape; give it to a `MemoryService` (``metrics=pm``) and it counts each
tenant's requests, errors and refusals. `serve` exposes it over HTTP
(`PrometheusMetrics.serve`, loopback by default).

Label values are bounded: a tenant is named by its subject token (already
escaped, never the raw id), and past `max_tenants` distinct tenants the rest
share the label ``_other``; every other label (op, error type, command,
health state, runtime event) is a name from the code, capped at
`MAX_NAMES` values per label name the same way.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from convmem.actors._bounds import MAX_LIVE_SESSIONS, check_count
from convmem.errors import ConvmemError, InvalidConfig

__all__ = ["DEFAULT_MAX_TENANTS", "MAX_NAMES", "OTHER", "PrometheusMetrics"]

_log = logging.getLogger("convmem.metrics")

DEFAULT_MAX_TENANTS = 100
"""Distinct tenant label values of one `PrometheusMetrics`; the rest are counted as `OTHER`."""
MAX_NAMES = 64
"""Distinct values of any other label name (``error``, ``op``...); the rest are counted as `OTHER`."""
_REQUEST_INCS = 4096
"""Request counter increments kept (tenant tokens x ops; cleared when full, then found again)."""
OTHER = "_other"
"""The label value of whatever is past a label's bound (no tenant token can be it: tokens are escaped)."""

WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: a durable append on a local server takes about a millisecond, a replicated one more."""


class _Bounded:
    """The label value to use for `value`: itself among the first `limit` seen, else `OTHER`."""

    __slots__ = ("_limit", "_lock", "_seen")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:  # the common case: no lock (a set's membership test is atomic)
            return value
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) >= self._limit:
                return OTHER
            self._seen.add(value)
            return value


class PrometheusMetrics:
    """A registry of convmem's metrics, fed by the systems and services given it (thread-safe).

    `registry`: where the metrics are registered (default: a registry of this
    object's own, not prometheus_client's global one, so two can live in one
    process). `max_tenants`: the bound on distinct tenant label values.
    """

    def __init__(
        self, *, registry: CollectorRegistry | None = None, max_tenants: int = DEFAULT_MAX_TENANTS
    ) -> None:
        check_count("max_tenants", max_tenants, most=MAX_LIVE_SESSIONS)  # each a label set held in memory
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_tenants = max_tenants
        r = self.registry
        self.write_seconds = Histogram(
            "convmem_write_seconds",
            "Durable appends: seconds from the append's start to the log's acknowledgement.",
            buckets=WRITE_BUCKETS,
            registry=r,
        )
        self.writes = Counter(
            "convmem_writes", "Writes that ended stored, by command.", ["command"], registry=r
        )
        self.write_errors = Counter(
            "convmem_write_errors", "Writes that ended in an error, by error type.", ["error"], registry=r
        )
        self.turns = Counter("convmem_turns", "Turns added (TurnAdded events).", registry=r)
        self.summarizer_calls = Counter(
            "convmem_summarizer_calls", "Summaries asked of the summarizer.", registry=r
        )
        self.summaries = Counter(
            "convmem_summaries", "Summaries produced and stored (SummaryProduced events).", registry=r
        )
        self.summarizer_failures = Counter(
            "convmem_summarizer_failures",
            "Summaries that failed (the summarizer's error, a timeout or a refusal).",
            registry=r,
        )
        self.health_changes = Counter(
            "convmem_health_changes", "Sessions' health changes, by the new state.", ["state"], registry=r
        )
        self.runtime_events = Counter(
            "convmem_runtime_events",
            "Other runtime counts: conflicts, activations, passivations, idle_cache_hits, idle_cache_misses, "
            "poison_events, erasures_seen.",
            ["event"],
            registry=r,
        )
        self.requests = Counter(
            "convmem_service_requests",
            "Service requests answered, by tenant token and op.",
            ["tenant", "op"],
            registry=r,
        )
        self.request_errors = Counter(
            "convmem_service_errors",
            "Service requests answered with an error, by tenant token and error type.",
            ["tenant", "error"],
            registry=r,
        )
        self.refusals = Counter(
            "convmem_service_refusals",
            "Service requests refused, by tenant token and reason (Busy, QuotaExceeded, reply_subject).",
            ["tenant", "reason"],
            registry=r,
        )
        self._tenant = _Bounded(max_tenants)
        self._names: dict[str, _Bounded] = {}
        self._names_lock = threading.Lock()
        self._incs: dict[str, Callable[[float], None]] = {}
        """Each count name's counter increment, found once (the names are the runtime's: few)."""
        self._request_incs: dict[tuple[str, str], Callable[[float], None]] = {}
        """Each (tenant token, op)'s request counter increment (a tenant past the bound counts as others)."""
        self._systems: weakref.WeakSet[Any] = weakref.WeakSet()
        r.register(_SystemGauges(self._systems))

    # A MetricsSink ------------------------------------------------------------------------

    def count(self, name: str, n: int = 1) -> None:
        """One of a system's counts grew (see `convmem.actors.Metrics`)."""
        inc = self._incs.get(name)
        if inc is None:  # once per name: the counter (and label child) it goes to, kept
            inc = self._incs[name] = self._counter_of(name)
        inc(n)

    def _counter_of(self, name: str) -> Callable[[float], None]:
        kind, _, detail = name.partition(".")
        if kind == "writes" and detail:
            return self.writes.labels(self._name("command", detail)).inc
        if kind == "write_errors" and detail:
            return self.write_errors.labels(self._name("error", detail)).inc
        if kind == "health" and detail:
            return self.health_changes.labels(self._name("state", detail)).inc
        plain = {
            "turns": self.turns,
            "summary_calls": self.summarizer_calls,
            "summaries": self.summaries,
            "summary_failures": self.summarizer_failures,
        }
        if name in plain:
            return plain[name].inc
        return self.runtime_events.labels(self._name("event", name)).inc

    def observe_append(self, seconds: float) -> None:
        """One durable append's latency."""
        self.write_seconds.observe(seconds)

    def watch(self, system: Any) -> None:
        """Read `system`'s gauges at each scrape, until it closes (or is collected)."""
        self._systems.add(system)

    # The service's counts ----------------------------------------------------------------

    def request(self, token: str, op: str, error: str | None) -> None:
        """A request of the tenant whose subject token is `token` was answered (`error`: its error type)."""
        inc = self._request_incs.get((token, op))
        if inc is None:  # once per tenant token and op: the label child it goes to, kept
            inc = self.requests.labels(self._tenant(token), self._name("op", op)).inc
            if len(self._request_incs) >= _REQUEST_INCS:
                self._request_incs.clear()
            self._request_incs[token, op] = inc
        inc(1)
        if error is not None:
            self.request_errors.labels(self._tenant(token), self._name("error", error)).inc()

    def refused(self, token: str, reason: str) -> None:
        """A request of `token`'s tenant was refused for `reason`.

        The reasons: ``Busy``, ``QuotaExceeded``, ``reply_subject``.
        """
        self.refusals.labels(self._tenant(token), self._name("reason", reason)).inc()

    def _name(self, label: str, value: str) -> str:
        bounded = self._names.get(label)
        if bounded is None:
            with self._names_lock:
                bounded = self._names.setdefault(label, _Bounded(MAX_NAMES))
        return bounded(value)

    # Exposition ---------------------------------------------------------------------------

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
        """Expose the registry at ``http://host:port/metrics`` (a daemon thread); (server, thread).

        Stop it with ``server.shutdown(); server.server_close()``. A port that
        cannot be bound is an `InvalidConfig` naming it (0: any free one).
        """
        check_count("metrics_port", port, least=0, most=65535)  # 10**6 was a bare OverflowError
        try:
            return start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InvalidConfig(
                "metrics_port", f"cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None


class _SystemGauges(Collector):
    """The watched systems' gauges, read at each scrape (summed over the systems still open)."""

    def __init__(self, systems: Iterable[Any]) -> None:
        self._systems = systems

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # read at each scrape: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = GaugeMetricFamily("convmem_live_sessions", "Sessions with a live actor.")
        cached = GaugeMetricFamily("convmem_idle_cached_sessions", "Sessions in the idle cache (no actor).")
        cached_bytes = GaugeMetricFamily(
            "convmem_idle_cache_bytes", "The bytes the idle-cached sessions are estimated to hold."
        )
        health = GaugeMetricFamily(
            "convmem_live_sessions_by_health", "Live sessions by health state.", labels=["state"]
        )
        pending = GaugeMetricFamily(
            "convmem_erasures_pending", "Erasures recorded in the journal and not finished yet."
        )
        totals = {"live": 0, "cached": 0, "bytes": 0}
        by_health: dict[str, int] = {}
        erasures: int | None = 0
        for system in list(self._systems):
            if system.closed:
                continue
            totals["live"] += system.live_sessions()
            n, size = system.cached_sessions()
            totals["cached"] += n
            totals["bytes"] += size
            for state, count in system.live_health().items():
                by_health[state] = by_health.get(state, 0) + count
            if erasures is not None:
                try:
                    erasures += len(system.pending_erasures())
                except ConvmemError as exc:  # the journal did not answer: no figure rather than a false 0
                    _log.warning("convmem metrics: the erasure journal did not answer: %s", exc)
                    erasures = None
        live.add_metric([], totals["live"])
        cached.add_metric([], totals["cached"])
        cached_bytes.add_metric([], totals["bytes"])
        for state in sorted(by_health):
            health.add_metric([state], by_health[state])
        yield from (live, cached, cached_bytes, health)
        if erasures is not None:
            pending.add_metric([], erasures)
            yield pending
