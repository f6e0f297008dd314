"""The user's callbacks (`on_turn_added`, `on_summary_updated`, `on_health_changed`), off the write path.

A write that stores events tells `Callbacks.notify`, which counts them in the
metrics and hands each callback to a small pool of threads: a slow or failing
callback never holds up a write, and never reaches it (failures are logged).
A session's own callbacks (`SessionServices`) stand in for the system's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from convmem.actors._metrics import Metrics
from convmem.errors import InvalidConfig
from convmem.events import AnyEvent, HealthChanged, MemoryKey, SummaryProduced, TurnAdded
from convmem.projections import SessionState

__all__ = ["Callback", "Callbacks", "callbacks_of"]

_log = logging.getLogger("convmem.system")

Kinds = dict[str, "Callback | None"]
"""A set of callbacks by kind: "turn", "summary", "health"."""


class Callback:
    """A user callback (sync or async; with or without a `key` keyword), run best-effort."""

    __slots__ = ("_fn", "_wants_key")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self._wants_key = "key" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())

    @classmethod
    def wrap(cls, fn: Callable[..., Any] | None, field: str = "callback") -> Callback | None:
        if fn is None:
            return None
        if not callable(fn):
            raise InvalidConfig(field, f"must be callable, got {type(fn).__name__}")
        return cls(fn)

    def run(self, key: MemoryKey, *args: Any) -> None:
        try:
            result = self._fn(*args, key=key) if self._wants_key else self._fn(*args)
            if inspect.isawaitable(result):
                asyncio.run(_await(result))
        except Exception:
            _log.exception("memory callback %r failed (ignored)", self._fn)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def callbacks_of(
    on_turn_added: Callable[..., Any] | None,
    on_summary_updated: Callable[..., Any] | None,
    on_health_changed: Callable[..., Any] | None,
) -> Kinds:
    """The three callbacks by kind, each checked (`InvalidConfig` names the one that is not callable)."""
    return {
        "turn": Callback.wrap(on_turn_added, "on_turn_added"),
        "summary": Callback.wrap(on_summary_updated, "on_summary_updated"),
        "health": Callback.wrap(on_health_changed, "on_health_changed"),
    }


class Callbacks:
    """Counts what writes store and runs the callbacks for it on two threads of their own.

    `own(key)` gives a session's own callbacks when it has registered some;
    each kind it leaves None falls back to the system's.
    """

    def __init__(
        self,
        defaults: Kinds,
        metrics: Metrics,
        own: Callable[[MemoryKey], Mapping[str, Callback | None] | None],
    ) -> None:
        self._defaults = defaults
        self._metrics = metrics
        self._own = own
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="convmem-callback"
        )
        self._closed = False

    def notify(self, key: MemoryKey, old: SessionState, new: SessionState, events: list[AnyEvent]) -> None:
        """Count the events and fire the callbacks, off the write path."""
        for event in events:
            if isinstance(event, TurnAdded):
                self._metrics.count("turns")
                self._fire("turn", key, event.turn)
            elif isinstance(event, SummaryProduced):
                self._metrics.count("summaries")
                self._fire("summary", key, old.summary, event.summary)
            elif isinstance(event, HealthChanged):
                self._metrics.count(f"health.{event.new.value}")
                self._fire("health", key, event.old, event.new)

    def _fire(self, kind: str, key: MemoryKey, *args: Any) -> None:
        own = self._own(key)
        callback = own[kind] if own is not None else None
        if callback is None:
            callback = self._defaults[kind]
        if callback is None or self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the pool shuts down with the system
            self._pool.submit(callback.run, key, *args)

    def close(self) -> None:
        """Run the callbacks already handed over, then no more."""
        self._closed = True
        self._pool.shutdown(wait=True)
