"""`SystemSettings`: `MemorySystem`'s settings as one value, which `convmem.connect` takes as they are.

A `TypedDict`, so the settings are plain keywords (``MemorySystem(config,
log=log, max_live_sessions=1000)``) and also one value a caller builds once
and passes to either entry point (``MemorySystem(config, log=log,
**settings)``, ``convmem.connect(url, **settings)``); the type checker knows
each key's type in both. `SystemOptions` adds what only `MemorySystem` takes
(the parts a backend gives `connect`: snapshots, journal, closing, and the
call timeout, which `connect` reads as the connection's). Each default is
`MemorySystem`'s, named in the key's docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict

from convmem.actors._eraser import ExportRegistry
from convmem.actors._journal import ErasureJournal
from convmem.actors._metrics import MetricsSink
from convmem.actors._ports import Clock, SnapshotStore, Summarizer
from convmem.actors._tokens import TokenCounter
from convmem.events import RetentionPolicies
from convmem.projections import TokenEstimator

__all__ = ["SystemOptions", "SystemSettings"]


class SystemSettings(TypedDict, total=False):
    """How a memory system runs: every key optional, the same for `MemorySystem` and `connect`."""

    summarizer: Summarizer | None
    """Makes `rolling_summary` summaries (None: `connect` gives the offline `ExtractiveSummarizer`)."""
    clock: Clock | None
    """The time sessions and timers read (None: the system clock)."""
    token_estimator: TokenEstimator | None
    """Counts a text's tokens for the budgets (None: the default estimator)."""
    token_counter: TokenCounter | None
    """A tokenizer's encoding name (``"cl100k_base"``) or a counting callable (not with `token_estimator`)."""
    on_turn_added: Callable[..., Any] | None
    """Called after each stored turn, off the write path."""
    on_summary_updated: Callable[..., Any] | None
    """Called after each stored summary."""
    on_health_changed: Callable[..., Any] | None
    """Called when a session's summary health changes."""
    max_live_sessions: int
    """Session actors kept live at once (default 256); the least recently used leave first."""
    idle_seconds: float
    """A live session idle this long is passivated (default 300)."""
    idle_cache_bytes: int
    """Bytes of passivated sessions' states kept in memory (default 512 MiB; 0: none)."""
    snapshot_every: int
    """A snapshot every this many events of a session (default 50)."""
    summarizer_workers: int
    """Summarizer worker actors (default 4)."""
    summarizer_queue: int
    """Summary jobs queued at most (default 1000)."""
    summarizer_abandoned: int | None
    """Call threads left to hanging summarizer calls at most (None: as many as the workers)."""
    summarizer_loop: asyncio.AbstractEventLoop | None
    """Where an async summarizer runs (None: the creating coroutine's loop, else the pool's own)."""
    actor_threads: int
    """Threads the session actors run on (default 64)."""
    on_poison: Literal["skip", "stop"]
    """An event this version cannot read: skip it (default) or stop the session."""
    retention: RetentionPolicies | Mapping[str, object] | None
    """Retention policies to sweep with (None: keep everything)."""
    exports: ExportRegistry | None
    """Where exported copies are registered, for erasure to find (`connect`: the default file registry)."""
    erasure_hook: Callable[[str], object] | None
    """Called with each erasure's digest once it is done."""
    metrics: MetricsSink | None
    """Counts writes, errors and sessions (e.g. `PrometheusMetrics`)."""


class SystemOptions(SystemSettings, total=False):
    """`MemorySystem`'s keywords: the settings, and the parts a backend gives `connect`."""

    snapshots: SnapshotStore | None
    """The snapshot store (None: sessions replay their whole log)."""
    journal: ErasureJournal | None
    """Where erasures are recorded before anything is deleted (None: the log's own, if it keeps one)."""
    on_close: Callable[[], object] | None
    """Called once the system closed (`connect`: closes the backend)."""
    timeout: float
    """Seconds a blocking call waits (default 30)."""
