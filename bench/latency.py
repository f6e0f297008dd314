"""2. `add_turn` latency under open-loop load, with a healthy and with a hung summarizer.

Open loop: one asyncio scheduler issues request *i* at ``t0 + i / rate``
whatever happened to the requests before it, each through the awaitable
`AsyncSessionHandle.add_turn`, and a request's latency runs from its
*scheduled* time to its acknowledgement. A system that falls behind therefore
shows its queueing delay instead of hiding it (no coordinated omission).

Sessions use ``rolling_summary`` (full zone 5, so every turn past the fifth
asks for a summary) on a JetStream log. Healthy: the summarizer answers at
once with a short summary (its `SummaryProduced` appends share the log with
the turns). Hung: the summarizer blocks on an `Event` until the run ends, so
every summarizer worker and the queue fill up. A third run with
``truncation`` (no summarizer) is the fairer reference for the hung one: a
healthy summarizer adds a `SummaryProduced` append per turn, a hung one adds
none. A fourth system runs `convmem.recommended(total_tokens=4000)` with its
real `ExtractiveSummarizer` (full zone 3: every turn past the third is
summarized in the background, competing for the interpreter with the writes),
and a fifth the same with the summarizer in a warm worker process of its own
(`ProcessSummarizer`: issue 15's fix for that contention). Beside them, the floor: a raw
nats-py JetStream publish of a turn-sized message to a stream of its own on the same server,
driven by the same open loop on a connection of its own (no convmem code), so that a durable
`add_turn`'s tail reads against what the server and its disk take for one acknowledged
append (issue 28: with ``sync_interval: always``, p99 within 1.5x of the raw publish's).
The five systems share one server (each on sessions of its own) and run side
by side, each rate in four bursts per system taken in turn, so a slow moment
of the machine falls on all of them; once with the server's
default flush and once with ``sync_interval: always``. The garbage
collector's pauses during the runs are recorded beside the figures: a full
collection stops every thread for tens of milliseconds, and the burst it
lands in takes the p99 with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import nats
from nats.js.api import StorageType, StreamConfig

from bench._common import (
    Figure,
    Result,
    Sizes,
    Target,
    embedded_backend,
    percentile,
    sample_turn,
    session_keys,
    sync_label,
)
from bench._profile import py_spy
from convmem.actors import MemorySystem
from convmem.adapters import ExtractiveSummarizer, JetStreamBackend, recommended
from convmem.adapters.backends.summarizers._process import ProcessSummarizer
from convmem.events import ConversationTurn, ShortTermMemoryConfig

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["run"]

_EXTRACTIVE = "convmem.adapters.backends.summarizers:ExtractiveSummarizer"

_SUMMARY = "<session_summary>\nThe user asked about budgets and orders.\n</session_summary>"

Latencies = dict[int, tuple[list[float], float, int]]
"""Per offered rate: latencies (s), the rate the scheduler achieved, failed requests."""


_RAW_STREAM = "BENCH_RAW_PUBLISH"
_RAW_SUBJECT = "bench.raw.publish"


class _RawPublish:
    """A raw nats-py JetStream publish standing where a session handle would: the floor of a durable
    append on this server (a turn's JSON as the message, one subject per "session")."""

    def __init__(self, client: Client, index: int) -> None:
        self._js = client.jetstream()
        self._subject = f"{_RAW_SUBJECT}.{index}"

    async def add_turn(self, turn: ConversationTurn, *, timeout: float) -> None:
        payload = msgspec.json.encode(turn)
        await self._js.publish(self._subject, payload, timeout=timeout)


async def _raw_publishers(url: str, count: int) -> tuple[Client, list[_RawPublish]]:
    """A connection of its own to the server at `url`, a file stream of its own, `count` publishers."""
    client = await nats.connect(url)
    await client.jetstream().add_stream(
        StreamConfig(name=_RAW_STREAM, subjects=[f"{_RAW_SUBJECT}.>"], storage=StorageType.FILE)
    )
    return client, [_RawPublish(client, i) for i in range(count)]


class _Summarizer:
    """Answers at once, or (hung) blocks until `release`."""

    def __init__(self, *, hung: bool) -> None:
        self.hung = hung
        self._gate = threading.Event()
        self.calls = 0

    def __call__(self, request: Mapping[str, Any], /) -> dict[str, str]:
        self.calls += 1
        if self.hung:
            self._gate.wait(timeout=600)
        return {"summary": _SUMMARY}

    def release(self) -> None:
        self._gate.set()


async def _open_loop(
    handles: list[Any], turns: list[ConversationTurn], rate: float, seconds: float
) -> tuple[list[float], float, int]:
    """Latencies (s) from scheduled time to acknowledgement; achieved rate; failures.

    A request's task is let go as soon as it is answered, as a planner lets go of a request it
    served: kept until the burst's end (a ``gather`` over all of them), a 2 s burst at 1,000/s
    held 2,000 finished tasks (about 20,000 tracked objects), which the collector then walked
    in young passes of up to 55 ms and promoted into full ones (issue 28).
    """
    loop = asyncio.get_running_loop()
    count = max(1, int(rate * seconds))
    latencies: list[float] = [0.0] * count
    failures = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        nonlocal failures
        try:
            await handles[i % len(handles)].add_turn(turns[i % len(turns)], timeout=120)
        except Exception:
            failures += 1
        latencies[i] = loop.time() - scheduled

    start = loop.time() + 0.02
    for i in range(count):
        scheduled = start + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(i, scheduled))
        pending.add(task)
        task.add_done_callback(pending.discard)
    issued = loop.time() - start
    if pending:  # the tasks still unanswered (each answered one left the set)
        await asyncio.wait(set(pending))
    return latencies, count / max(issued, 1e-9), failures


class _GcPauses:
    """Collector pauses while installed (wall time of each collection, by generation)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, float]:
        oldest = [s for generation, s in self.pauses if generation == 2]
        return {
            "collections": len(self.pauses),
            "gen2_collections": len(oldest),
            "gen2_max_ms": round(max(oldest, default=0.0) * 1000, 1),
            "max_ms": round(max((s for _, s in self.pauses), default=0.0) * 1000, 1),
            "total_ms": round(sum(s for _, s in self.pauses) * 1000, 1),
        }


def _merge(parts: list[tuple[list[float], float, int]]) -> tuple[list[float], float, int]:
    latencies = [x for part in parts for x in part[0]]
    return latencies, sum(p[1] for p in parts) / len(parts), sum(p[2] for p in parts)


async def _settle(name: str, handles: list[Any]) -> None:
    """After a burst, let its background summaries finish, so none of them falls into the next burst.

    A working summarizer is flushed (its sessions' summaries all made); a hung one never finishes, and
    its calls only wait, so its bursts are followed by a short pause alone.
    """
    if name == "raw":
        return
    if name == "hung":
        await asyncio.sleep(0.1)
        return
    await asyncio.gather(*(h.flush(timeout=120) for h in handles))


def _runs(sizes: Sizes, backend: JetStreamBackend, label: str, result: Result) -> dict[str, Latencies]:
    """The healthy, hung, summarizer-less and recommended systems side by side, bursts interleaved.

    Each rate runs in `rounds` bursts per system, in turn (healthy, hung,
    plain, recommended, healthy, ...), so a slow moment of the machine falls on all.
    """
    rounds = 1 if sizes.smoke else 4
    setup = recommended(total_tokens=4000)
    in_process = ExtractiveSummarizer(max_tokens=setup.config.budget.summary_max_tokens)
    summarizers: dict[str, Any] = {
        "healthy": _Summarizer(hung=False),
        "hung": _Summarizer(hung=True),
        "plain": None,
        "recommended": in_process,
        "recommended_process": ProcessSummarizer(
            _EXTRACTIVE, max_tokens=setup.config.budget.summary_max_tokens
        ),  # warm: its child is built before anything is timed
    }
    turns = [sample_turn(n) for n in range(64)]
    systems: dict[str, MemorySystem] = {}
    parts: dict[str, dict[int, list[tuple[list[float], float, int]]]] = {n: {} for n in [*summarizers, "raw"]}
    try:
        for name, summarizer in summarizers.items():
            config = ShortTermMemoryConfig(strategy="rolling_summary" if summarizer else "truncation")
            if name.startswith("recommended"):
                config = setup.config
            systems[name] = MemorySystem(
                config, log=backend.log, snapshots=backend.snapshots, summarizer=summarizer
            )
        handles: dict[str, list[Any]] = {
            name: [system.async_session(k) for k in session_keys(sizes.lat_sessions, user=f"lat-{name}")]
            for name, system in systems.items()
        }

        async def drive() -> None:
            client, handles["raw"] = await _raw_publishers(backend.url, sizes.lat_sessions)
            try:
                await bursts()
            finally:
                await client.close()

        async def bursts() -> None:
            for group in handles.values():  # start every session, fill its full zone, before timing
                for _ in range(6):
                    await asyncio.gather(*(h.add_turn(turns[0], timeout=120) for h in group))
            for rate, seconds in zip(sizes.lat_rates, sizes.lat_seconds, strict=True):
                for _ in range(rounds):
                    for name, group in handles.items():
                        burst = await _open_loop(group, turns, rate, seconds / rounds)
                        parts[name].setdefault(rate, []).append(burst)
                        await _settle(name, group)
            healthy_p99 = percentile(_merge(parts["healthy"].get(1000, [([], 0.0, 0)]))[0], 99.0)
            if sizes.profile and healthy_p99 > 0.005:
                with py_spy(sizes.out_dir, f"latency-{label}", result.details):
                    await _open_loop(handles["healthy"], turns, 1000, 3.0)

        with _GcPauses() as pauses:
            asyncio.run(drive())
        result.details[f"gc pauses [{label}]"] = pauses.summary()
    finally:
        for summarizer in summarizers.values():
            if isinstance(summarizer, _Summarizer):
                summarizer.release()
        for system in systems.values():
            system.close()
        for summarizer in summarizers.values():
            if isinstance(summarizer, ProcessSummarizer):
                summarizer.close()
    return {
        name: {rate: _merge(bursts) for rate, bursts in by_rate.items()} for name, by_rate in parts.items()
    }


def _summary(latencies: list[float], achieved: float, failures: int) -> dict[str, float]:
    ms = [x * 1000 for x in latencies]
    return {
        "n": len(ms),
        "offered_rate_achieved": round(achieved, 1),
        "failures": failures,
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "p999_ms": percentile(ms, 99.9),
        "max_ms": max(ms) if ms else float("nan"),
    }


def _figures(sizes: Sizes, label: str, runs: dict[str, Latencies], result: Result) -> None:
    for rate in sizes.lat_rates:
        ok, ok_rate, ok_failed = runs["healthy"][rate]
        bad, bad_rate, bad_failed = runs["hung"][rate]
        base, base_rate, base_failed = runs["plain"][rate]
        real, real_rate, real_failed = runs["recommended"][rate]
        apart, apart_rate, apart_failed = runs["recommended_process"][rate]
        raw, raw_rate, raw_failed = runs["raw"][rate]
        for p in (50.0, 99.0, 99.9):
            result.add(
                Figure(
                    f"p{p:g} @ {rate}/s healthy [{label}]",
                    percentile(ok, p) * 1000,
                    "ms",
                    target=Target("value", "<=", 5.0) if (rate == 1000 and p == 99.0) else None,
                )
            )
        for versus, reference, reference_label in (
            ("healthy", ok, "p99 with a healthy summarizer, same rate"),
            ("no summarizer", base, "p99 with strategy truncation (the same appends as the hung run)"),
        ):
            result.add(
                Figure(
                    f"p99 @ {rate}/s hung summarizer vs {versus} [{label}]",
                    percentile(bad, 99.0) * 1000,
                    "ms",
                    reference=percentile(reference, 99.0) * 1000,
                    reference_label=reference_label,
                    target=Target("ratio", "<=", 1.2) if rate == 1000 else None,
                )
            )
        result.add(
            Figure(
                f"p99 @ {rate}/s recommended, extractive summarizer [{label}]",
                percentile(real, 99.0) * 1000,
                "ms",
                reference=percentile(ok, 99.0) * 1000,
                reference_label="p99 with a summarizer that answers at once, same rate",
                target=Target("value", "<=", 5.0) if rate == 1000 else None,
            )
        )
        result.add(
            Figure(
                f"p99 @ {rate}/s recommended, extractive in a worker process [{label}]",
                percentile(apart, 99.0) * 1000,
                "ms",
                reference=percentile(real, 99.0) * 1000,
                reference_label="p99 with the extractive summarizer on the pool's threads, same rate",
                target=Target("ratio", "<=", 1.0) if rate == 1000 else None,
            )
        )
        result.add(
            Figure(
                f"p99 @ {rate}/s recommended in a worker process vs healthy [{label}]",
                percentile(apart, 99.0) * 1000,
                "ms",
                reference=percentile(ok, 99.0) * 1000,
                reference_label="p99 with a summarizer that answers at once, same rate",
                target=Target("ratio", "<=", 1.2) if rate == 1000 else None,
            )
        )
        for p in (99.0, 99.9):
            result.add(
                Figure(
                    f"p{p:g} @ {rate}/s healthy vs a raw nats-py JetStream publish [{label}]",
                    percentile(ok, p) * 1000,
                    "ms",
                    reference=percentile(raw, p) * 1000,
                    reference_label=f"p{p:g} of a raw nats-py JetStream publish, same server and rate",
                    target=(
                        Target("ratio", "<=", 1.5)
                        if (rate == 1000 and p == 99.0 and label == sync_label("always"))
                        else None
                    ),
                )
            )
        result.details[f"{label} {rate}/s"] = {
            "raw_publish": _summary(raw, raw_rate, raw_failed),
            "recommended_process": _summary(apart, apart_rate, apart_failed),
            "healthy": _summary(ok, ok_rate, ok_failed),
            "hung": _summary(bad, bad_rate, bad_failed),
            "no_summarizer": _summary(base, base_rate, base_failed),
            "recommended": _summary(real, real_rate, real_failed),
        }


def _rates(sizes: Sizes) -> Sizes:
    """`sizes`, or only the rates ``CONVMEM_BENCH_LATENCY_RATES`` names ("1000:8": 8 s at 1,000/s)."""
    asked = os.environ.get("CONVMEM_BENCH_LATENCY_RATES")
    if not asked:
        return sizes
    try:
        pairs = [
            (int(rate), float(seconds)) for rate, _, seconds in (p.partition(":") for p in asked.split(","))
        ]
    except ValueError:
        raise SystemExit(
            f"CONVMEM_BENCH_LATENCY_RATES={asked!r}: expected RATE:SECONDS[,RATE:SECONDS...]"
        ) from None
    if any(rate < 1 or seconds <= 0 for rate, seconds in pairs):
        raise SystemExit(f"CONVMEM_BENCH_LATENCY_RATES={asked!r}: rates and seconds must be positive")
    return dataclasses.replace(
        sizes, lat_rates=tuple(r for r, _ in pairs), lat_seconds=tuple(s for _, s in pairs)
    )


def run(sizes: Sizes) -> Result:
    result = Result()
    sizes = _rates(sizes)
    for sync_interval in (None, "always"):
        label = sync_label(sync_interval)
        with embedded_backend(sync_interval) as backend:
            runs = _runs(sizes, backend, label, result)
        _figures(sizes, label, runs, result)
    result.notes.append(
        "open loop: requests issued at fixed times by one asyncio scheduler through "
        "AsyncSessionHandle.add_turn, latency measured from the scheduled time (no coordinated omission); "
        f"{sizes.lat_sessions} sessions per system, rolling_summary, full zone 5; "
        "seconds per rate and system "
        f"{dict(zip(sizes.lat_rates, sizes.lat_seconds, strict=True))}"
    )
    return result
