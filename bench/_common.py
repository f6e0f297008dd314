"""What every measure shares: figures, sizes, servers, payloads and statistics.

A measure is a module with ``run(sizes) -> Result``. It measures convmem and
its reference in the same run, so a busy machine slows both alike, and returns
`Figure`s: a value, the reference it is compared with, their ratio and the
target the ratio (or the value) must meet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from convmem.adapters import EmbeddedNatsServer, JetStreamBackend
from convmem.events import ConversationTurn, MemoryKey, Strategy

__all__ = [
    "Batch",
    "Figure",
    "Result",
    "Sizes",
    "Target",
    "async_batch",
    "compare",
    "embedded_backend",
    "in_threads",
    "memory_store_root",
    "nats_server",
    "percentile",
    "sample_turn",
    "session_keys",
    "sync_batch",
    "time_per_call",
]

Comparison = Literal[">=", "<="]


@dataclass(frozen=True)
class Target:
    """`what` (``value`` or ``ratio``) must be `op` `bound`."""

    what: Literal["value", "ratio"]
    op: Comparison
    bound: float

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        subject = value if self.what == "value" else ratio
        if subject is None or math.isnan(subject):
            return None
        return subject >= self.bound if self.op == ">=" else subject <= self.bound

    def __str__(self) -> str:
        return f"{self.what} {self.op} {self.bound:g}"


@dataclass
class Figure:
    """One number of the run, beside its reference."""

    name: str
    value: float
    unit: str
    reference: float | None = None
    reference_label: str = ""
    target: Target | None = None
    note: str = ""
    ratio: float | None = field(default=None, init=False)
    met: bool | None = field(default=None, init=False)
    ratio_is: str = ""
    """How the ratio is formed (``value/reference`` unless said otherwise)."""

    def __post_init__(self) -> None:
        self.ratio = None
        if self.reference is not None and self.reference != 0:
            if self.ratio_is == "reference/value":
                self.ratio = self.reference / self.value if self.value else math.inf
            else:
                self.ratio_is = "value/reference"
                self.ratio = self.value / self.reference
        self.met = self.target.met(self.value, self.ratio) if self.target is not None else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["target"] = str(self.target) if self.target is not None else None
        return out


@dataclass
class Result:
    """A measure's figures, with notes on how it was measured (and profiles, when taken)."""

    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure


@dataclass(frozen=True)
class Sizes:
    """How big each measure runs: `FULL` for the record, `SMOKE` for CI (seconds)."""

    smoke: bool
    # throughput
    tp_sessions: int
    tp_callers: int
    tp_turns: int
    # latency
    lat_sessions: int
    lat_rates: tuple[int, ...]
    lat_seconds: tuple[float, ...]
    # context
    ctx_windows: tuple[int, ...]
    ctx_seconds: float
    # replay
    rp_sessions: int
    rp_events_per_session: int
    # activation
    act_sessions: int
    act_turns: int
    act_snapshot_every: int
    # scale
    sc_checkpoints: tuple[int, ...]
    sc_callers: int
    sc_disk_sessions: int
    churn_sessions: int
    churn_live: int
    churn_turns: int
    # quality
    q_dialogues: int | None
    q_sessions: int | None
    q_budgets: tuple[int, ...]
    out_dir: str = ""
    profile: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    # peers: convmem and the memories a planner would pick instead, on one workload
    peer_sessions: tuple[int, ...] = (1000, 10_000)
    peer_turns: int = 20
    peer_rounds: int = 3
    peer_callers: int = 64
    peer_read_seconds: float = 4.0
    # history: a long session against a short one
    hist_turns: tuple[int, int] = (100, 100_000)
    hist_rounds: int = 3
    hist_writes: int = 300
    hist_strategies: tuple[Strategy, ...] = ("truncation", "rolling_summary")


FULL = Sizes(
    smoke=False,
    tp_sessions=1000,
    tp_callers=64,
    tp_turns=12_000,
    lat_sessions=200,
    lat_rates=(100, 1000, 5000),
    lat_seconds=(5.0, 8.0, 1.0),
    ctx_windows=(5, 50, 500),
    ctx_seconds=0.12,
    rp_sessions=1000,
    rp_events_per_session=100,
    act_sessions=300,
    act_turns=27,
    act_snapshot_every=10,
    sc_checkpoints=(1000, 10_000, 100_000),
    sc_callers=16,
    sc_disk_sessions=300,
    churn_sessions=1000,
    churn_live=64,
    churn_turns=6000,
    q_dialogues=None,
    q_sessions=None,
    q_budgets=(1000, 2000, 4000),
)

SMOKE = Sizes(
    smoke=True,
    tp_sessions=40,
    tp_callers=8,
    tp_turns=240,
    lat_sessions=8,
    lat_rates=(100, 1000, 5000),
    lat_seconds=(0.3, 0.15, 0.06),
    ctx_windows=(5, 20, 100),
    ctx_seconds=0.02,
    rp_sessions=20,
    rp_events_per_session=20,
    act_sessions=15,
    act_turns=7,
    act_snapshot_every=3,
    sc_checkpoints=(50, 100, 200),
    sc_callers=4,
    sc_disk_sessions=20,
    churn_sessions=40,
    churn_live=8,
    churn_turns=120,
    q_dialogues=1,
    q_sessions=2,
    q_budgets=(1000, 2000, 4000),
    profile=False,
    peer_sessions=(16, 40),
    peer_turns=4,
    peer_callers=8,
    peer_read_seconds=0.02,
    hist_turns=(100, 400),
    hist_rounds=1,
    hist_writes=20,
)


# Payloads ----------------------------------------------------------------------------

_WORDS = [
    "budget",
    "invoice",
    "meeting",
    "tomorrow",
    "Lyon",
    "bakery",
    "teal",
    "customer",
    "order",
    "shipping",
    "refund",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "for",
    "with",
    "on",
    "is",
    "was",
    "will",
    "can",
    "should",
    "would",
    "please",
    "thanks",
    "Alice",
    "Bob",
    "project",
    "deadline",
    "March",
    "report",
    "numbers",
    "revenue",
    "42",
    "percent",
    "plan",
    "schedule",
    "call",
    "review",
    "draft",
    "contract",
    "price",
    "discount",
    "account",
    "password",
    "email",
]


def sample_turn(n: int, *, user_words: int = 24, assistant_words: int = 60) -> ConversationTurn:
    """A deterministic turn of about 150 + 380 characters (what a chat turn looks like)."""
    rng = random.Random(n)
    user = " ".join(rng.choice(_WORDS) for _ in range(user_words))
    assistant = " ".join(rng.choice(_WORDS) for _ in range(assistant_words))
    return ConversationTurn(user_message=f"{n}: {user}?", assistant_response=f"{assistant}.")


def session_keys(count: int, *, tenant: str = "bench", user: str = "user") -> list[MemoryKey]:
    return [MemoryKey(tenant, f"{user}-{i % 97}", f"session-{i}") for i in range(count)]


def write_json(out: str | os.PathLike[str] | None, result: dict[str, Any]) -> None:
    """Write a side run's `result` to `out` (indented, one newline at the end); nothing when `out` is None."""
    if out is not None:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


# Servers -----------------------------------------------------------------------------


def memory_store_root(min_free: int = 4 << 30) -> str | None:
    """A tmpfs folder (``/dev/shm``) with room to spare, for stores whose disk speed is not measured."""
    root = "/dev/shm"
    try:
        if os.path.isdir(root) and os.access(root, os.W_OK) and shutil.disk_usage(root).free >= min_free:
            return root
    except OSError:
        return None
    return None


@contextlib.contextmanager
def nats_server(sync_interval: str | None, *, store_root: str | None = None) -> Iterator[EmbeddedNatsServer]:
    """A private nats-server on loopback with a temporary store, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="convmem-bench-", dir=store_root) as store:
        server = EmbeddedNatsServer(store, sync_interval=sync_interval)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def embedded_backend(
    sync_interval: str | None, *, store_root: str | None = None
) -> Iterator[JetStreamBackend]:
    """`JetStreamBackend.embedded` on a temporary store (the server stops with the backend)."""
    with tempfile.TemporaryDirectory(prefix="convmem-bench-", dir=store_root) as store:
        backend = JetStreamBackend.embedded(store, sync_interval=sync_interval)
        try:
            yield backend
        finally:
            backend.close()


def sync_label(sync_interval: str | None) -> str:
    return "sync=always" if sync_interval == "always" else "sync=default"


def in_threads(work: Callable[[int], None], count: int, *, timeout: float) -> float:
    """Run `work(0)` ... `work(count - 1)` on as many threads at once; seconds from start to last join.

    The first error a thread raised is raised here, after all have ended (or `timeout` each).
    """
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


# Statistics --------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The `p`-th percentile (0-100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def time_per_call(fn: Callable[[], object], *, seconds: float, rounds: int = 5) -> float:
    """Best seconds per call of `fn` over `rounds` rounds of about `seconds` each."""
    return compare({"fn": sync_batch(fn)}, seconds=seconds, rounds=rounds)["fn"]


Batch = Callable[[int], float]
"""Runs the thing measured `n` times and returns the seconds it took."""


def sync_batch(fn: Callable[[], object]) -> Batch:
    def batch(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - start

    return batch


def async_batch(loop: asyncio.AbstractEventLoop, fn: Callable[[], Awaitable[object]]) -> Batch:
    """A coroutine function timed inside `loop`, `n` awaits per batch (no loop start-up per call)."""

    async def many(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            await fn()
        return time.perf_counter() - start

    def batch(n: int) -> float:
        return loop.run_until_complete(many(n))

    return batch


def compare(batches: dict[str, Batch], *, seconds: float, rounds: int = 7) -> dict[str, float]:
    """Best seconds per call of each, its rounds interleaved with the others' (A B C A B C ...).

    Interleaving spreads a busy moment of the machine over all of them, and
    the best round is the one least disturbed by other processes.
    """
    sizes: dict[str, int] = {}
    for name, batch in batches.items():
        batch(2)
        n, spent = 4, batch(4)
        while spent < seconds / 20 and n < 10_000_000:
            n *= 4
            spent = batch(n)
        sizes[name] = max(3, int(n * seconds / max(spent, 1e-9)))
    best = dict.fromkeys(batches, math.inf)
    for _ in range(rounds):
        for name, batch in batches.items():
            best[name] = min(best[name], batch(sizes[name]) / sizes[name])
    return best


def exit_on_sigterm() -> None:
    """Take SIGTERM (`timeout`, `bench/device.sh`'s limits, a parent's stop) as an exit of this process:
    its `finally` blocks, context managers and exit handlers then stop the servers, stores and
    processes it started. Python's default for SIGTERM ends the process at once and leaves every
    one of them behind (`timeout` signals the bench's whole process group, its store processes too)."""

    def stopped(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)


class LoadProcess:
    """A load generator in a process of its own (`python -m MODULE ARGS...`): started, it says
    ``{"phase": PHASE}`` on its first line once it is under way; `stop` tells it to stop and returns
    its last line, its counts."""

    def __init__(self, module: str, args: list[str], *, phase: str, wait: float = 120.0) -> None:
        self._wait = wait
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line or json.loads(line).get("phase") != phase:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{module} did not start ({phase}): {line!r}")

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        done: dict[str, Any] = json.loads(self.proc.stdout.readline())
        self.proc.wait(self._wait)
        return done
