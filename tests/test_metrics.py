"""Prometheus metrics: a system and its service scraped over HTTP on loopback, on a real nats-server.

Each figure is read from the exposition with prometheus_client's own parser,
before and after what should move it.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from runtime_helpers import WAIT, PlannedSummarizer, summarizing_config, turn
from test_serve import Serve

import convmem
from convmem.actors import ErasureRequest
from convmem.adapters import (
    AsyncRemoteSession,
    EmbeddedNatsServer,
    MemoryService,
    PrometheusMetrics,
    Quotas,
    RemoteMemory,
    TenantLimits,
)
from convmem.adapters.backends._prometheus import OTHER
from convmem.errors import Busy, InvalidConfig, LogUnavailable, MemoryBudgetExceeded, QuotaExceeded
from convmem.events import MemoryKey, ShortTermMemoryConfig

README = Path(__file__).resolve().parent.parent / "README.md"

Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def config() -> ShortTermMemoryConfig:
    """Summaries as soon as a turn is pending, a quick retry, and a refusal past 2,000 tokens."""
    base = summarizing_config(backoff=(0.01,), total_max_tokens=2_000)
    return msgspec.structs.replace(base, budget=msgspec.structs.replace(base.budget, overflow_policy="error"))


def scrape(port: int) -> Figures:
    """Every sample at ``http://127.0.0.1:port/metrics``, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as answer:
        text = answer.read().decode()
    figures: Figures = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            figures[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return figures


def figure(figures: Figures, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a labelled counter appears with its first count)."""
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


def connect(url: str, names: Any, metrics: PrometheusMetrics, **options: Any) -> convmem.MemorySystem:
    """A system on the test's stream, prefix and bucket, with `config` and `metrics` (and `options`)."""
    return convmem.connect(
        url,
        stream=names.stream,
        prefix=names.prefix,
        bucket=names.bucket,
        config=config(),
        metrics=metrics,
        **options,
    )


@pytest.fixture
def url(nats_server_shared: EmbeddedNatsServer) -> str:
    return nats_server_shared.url


class Observed(PrometheusMetrics):
    """The registry as served, and a refusal a test can wait for: counted, then announced (no polling)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._counted = threading.Condition()
        self._refusals: Counter[tuple[str, str]] = Counter()

    def refused(self, token: str, reason: str) -> None:
        super().refused(token, reason)
        with self._counted:
            self._refusals[token, reason] += 1
            self._counted.notify_all()

    def wait_refused(self, token: str, reason: str, timeout: float = WAIT) -> None:
        """Until a refusal of `token` for `reason` is counted (and so in the next scrape)."""
        with self._counted:
            counted = self._counted.wait_for(lambda: self._refusals[token, reason] > 0, timeout)
        assert counted, f"no {reason} refusal of {token} counted within {timeout:g}s"


@pytest.fixture
def exposed() -> Iterator[tuple[PrometheusMetrics, int]]:
    metrics = Observed(max_tenants=2)
    server, _thread = metrics.serve(0)  # a free port on loopback
    try:
        yield metrics, server.server_port
    finally:
        server.shutdown()
        server.server_close()


def test_writes_errors_summaries_sessions_and_erasures_move_their_figures(
    url: str, jetstream_names: Any, exposed: tuple[PrometheusMetrics, int]
) -> None:
    metrics, port = exposed
    summarizer = PlannedSummarizer("fail", default="ok")
    system = connect(url, jetstream_names, metrics, summarizer=summarizer)
    try:
        before = scrape(port)
        assert figure(before, "convmem_write_seconds_count") == 0
        assert figure(before, "convmem_live_sessions") == 0
        assert figure(before, "convmem_erasures_pending") == 0

        session = system.session(MemoryKey("acme", "u1", "s1"))
        for n in range(3):
            session.add_turn(turn(f"t{n}"))
        session.flush(timeout=WAIT)  # the planned failure, then a summary that succeeds
        with pytest.raises(MemoryBudgetExceeded):
            session.add_turn(turn("w " * 20_000))

        after = scrape(port)
        appends = figure(after, "convmem_write_seconds_count")
        assert appends >= 3  # each turn is one durable append at least (summaries are more)
        assert figure(after, "convmem_write_seconds_bucket", le="+Inf") == appends
        assert figure(after, "convmem_writes_total", command="AddTurn") == 3
        assert figure(after, "convmem_write_errors_total", error="MemoryBudgetExceeded") == 1
        assert figure(after, "convmem_turns_total") == 3
        assert figure(after, "convmem_summarizer_calls_total") == len(summarizer.calls) >= 2
        assert figure(after, "convmem_summarizer_failures_total") == 1
        assert figure(after, "convmem_summaries_total") >= 1
        assert figure(after, "convmem_live_sessions") == 1
        assert figure(after, "convmem_live_sessions_by_health", state="healthy") == 1
        assert figure(after, "convmem_idle_cached_sessions") == 0

        # An erasure recorded by a process that died before finishing it is pending until finished.
        assert system.journal is not None
        system.journal.record(ErasureRequest.of("acme", "u1", "s1", by="ops", at=system.clock.now()))
        assert figure(scrape(port), "convmem_erasures_pending") == 1
        system.finish_erasures()
        done = scrape(port)
        assert figure(done, "convmem_erasures_pending") == 0
        assert figure(done, "convmem_live_sessions") == 0  # the erased session was dropped
    finally:
        system.close()
    assert figure(scrape(port), "convmem_live_sessions") == 0  # a closed system is no longer read


def test_each_tenants_requests_errors_and_refusals_are_counted_under_its_token(
    url: str, jetstream_names: Any, exposed: tuple[PrometheusMetrics, int]
) -> None:
    metrics, port = exposed
    api_prefix = f"t{uuid.uuid4().hex[:10]}.api"
    system = connect(url, jetstream_names, metrics)
    quotas = Quotas(tenants={"acme": TenantLimits(max_bytes=1)})
    try:
        with (
            MemoryService(system, url, api_prefix=api_prefix, quotas=quotas, metrics=metrics),
            RemoteMemory(url, api_prefix=api_prefix, timeout=WAIT) as remote,
        ):
            globex = remote.session(MemoryKey("globex", "v", "s"))
            assert [globex.add_turn(turn(f"g{n}")) for n in range(2)] == [1, 2]
            with pytest.raises(MemoryBudgetExceeded):
                globex.add_turn(turn("w " * 20_000))
            acme = remote.session(MemoryKey("acme", "u", "s"))
            acme.add_turn(turn("first"))  # under the quota until counted
            with pytest.raises(QuotaExceeded):  # the first write counted the tenant's bytes: over 1
                acme.add_turn(turn("second"))
            remote.session(MemoryKey("a.b", "u", "s")).add_turn(turn("third tenant"))
            figures = scrape(port)
    finally:
        system.close()
    assert figure(figures, "convmem_service_requests_total", tenant="globex", op="add_turn") == 3
    assert figure(figures, "convmem_service_errors_total", tenant="globex", error="MemoryBudgetExceeded") == 1
    assert figure(figures, "convmem_service_refusals_total", tenant="acme", reason="QuotaExceeded") == 1
    assert figure(figures, "convmem_service_errors_total", tenant="acme", error="QuotaExceeded") == 1
    # Past max_tenants (2 here) the rest share one label value: the label set stays bounded.
    assert figure(figures, "convmem_service_requests_total", tenant=OTHER, op="add_turn") == 1
    tenants = {dict(labels).get("tenant") for name, labels in figures if name.startswith("convmem_service")}
    assert tenants == {"globex", "acme", OTHER}


def test_busy_and_hostile_reply_subjects_are_counted_as_refusals_by_reason(
    url: str, jetstream_names: Any, exposed: tuple[PrometheusMetrics, int]
) -> None:
    """acme's second request while its one place is held: Busy; a reply subject of globex's: refused."""
    metrics, port = exposed
    api_prefix = f"t{uuid.uuid4().hex[:10]}.api"
    summarizer = PlannedSummarizer(default="hang")  # the flush waits on it: acme's one place stays held
    system = connect(url, jetstream_names, metrics, summarizer=summarizer)
    quotas = Quotas(default=TenantLimits(max_in_flight=1, max_running=1))
    key = MemoryKey("acme", "u", "held")
    try:
        with MemoryService(system, url, api_prefix=api_prefix, quotas=quotas, metrics=metrics) as service:

            async def scenario() -> None:
                async with AsyncRemoteSession(url, key, api_prefix=api_prefix, timeout=WAIT) as acme:
                    for n in range(3):  # past the full zone of 2: a summary is asked for
                        await acme.add_turn(turn(f"a{n}"))
                    await asyncio.to_thread(summarizer.wait_calls, 1)
                    held = asyncio.ensure_future(acme.flush())
                    admitted = await asyncio.to_thread(service.wait_for, lambda: service.in_flight >= 1, WAIT)
                    assert admitted, f"the held flush not admitted within {WAIT:g}s"
                    with pytest.raises(Busy):
                        await acme.flush()
                    nc = await nats.connect(url)
                    try:
                        await nc.publish(f"{api_prefix}.v1.acme.health", b"{}", reply="_INBOX_globex.AbC.1")
                        await nc.flush()
                    finally:
                        await nc.close()
                    assert isinstance(metrics, Observed)
                    await asyncio.to_thread(metrics.wait_refused, "acme", "reply_subject")
                    summarizer.release()
                    await held

            asyncio.run(scenario())
            figures = scrape(port)
    finally:
        summarizer.release()
        system.close()
    assert figure(figures, "convmem_service_refusals_total", tenant="acme", reason="Busy") == 1
    assert figure(figures, "convmem_service_refusals_total", tenant="acme", reason="reply_subject") == 1
    assert figure(figures, "convmem_service_requests_total", tenant="acme", op="flush") == 1  # the held one


def test_a_port_in_use_is_a_config_error_naming_it(exposed: tuple[PrometheusMetrics, int]) -> None:
    _metrics, port = exposed
    with pytest.raises(InvalidConfig, match=f"metrics_port.*127.0.0.1:{port}"):
        PrometheusMetrics().serve(port)
    with pytest.raises(InvalidConfig, match="max_tenants"):
        PrometheusMetrics(max_tenants=0)


def two_free_ports() -> int:
    """A free loopback port whose next one is free too (the two workers' metrics ports)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two consecutive free ports on loopback")


def test_serve_exposes_each_workers_metrics_on_its_own_port(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    """``serve --workers 2 --metrics-port P``: worker i on P + i; the worker that took the turn counts it."""
    port = two_free_ports()
    process = Serve(nats_server.url, tmp_path, "--workers", "2", "--metrics-port", str(port))
    try:
        with RemoteMemory(nats_server.url, timeout=WAIT) as remote:
            remote.session(MemoryKey("acme", "alice", "s")).add_turn(turn("hi"))
        both = [scrape(port), scrape(port + 1)]
        assert f"metrics at http://127.0.0.1:{port}/metrics, http://127.0.0.1:{port + 1}/metrics" in (
            process.stderr()
        )
    finally:
        process.stop()
    assert sum(figure(f, "convmem_writes_total", command="AddTurn") for f in both) == 1
    assert sum(figure(f, "convmem_service_requests_total", tenant="acme", op="add_turn") for f in both) == 1
    assert all(("convmem_live_sessions", ()) in f for f in both)


def test_the_readme_scrape_config_is_valid_yaml_naming_one_target_per_worker() -> None:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(scrape_configs:.*?)```", text, re.S)
    assert block is not None, "README has no scrape_configs block"
    config = yaml.safe_load(block.group(1))
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    targets = job["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:9464", "127.0.0.1:9465"]


class _UnansweringJournal:
    """A system whose figures are there but whose erasure journal does not answer."""

    closed = False

    def live_sessions(self) -> int:
        return 2

    def cached_sessions(self) -> tuple[int, int]:
        return 1, 10

    def live_health(self) -> dict[str, int]:
        return {"healthy": 2}

    def pending_erasures(self) -> list[Any]:
        raise LogUnavailable("the journal's bucket did not answer")


def test_a_journal_that_does_not_answer_leaves_the_erasure_figure_out_not_zero(
    exposed: tuple[PrometheusMetrics, int],
) -> None:
    metrics, port = exposed
    system = _UnansweringJournal()  # held here: a system is watched only while it lives
    metrics.watch(system)
    figures = scrape(port)
    assert figure(figures, "convmem_live_sessions") == 2
    assert figure(figures, "convmem_idle_cache_bytes") == 10
    assert ("convmem_erasures_pending", ()) not in figures
