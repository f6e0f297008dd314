"""What one session may bring of its own: a summarizer, a token estimator, callbacks, a configuration.

A `MemorySystem` has one of each for every session. An integration that
hands each session its caller's own (PenguiFlow builds one memory per key,
each with the planner's summarizer and the config's callables) registers a
`SessionServices` for the key (``system.async_session(key, services=...)``).
The system holds it weakly: it lasts as long as whoever registered it keeps
it, so the registry never outgrows the objects that use it, and a session
whose services are gone falls back to the system's own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from convmem.actors._ports import Summarizer
from convmem.errors import InvalidConfig
from convmem.events import MemoryKey, ShortTermMemoryConfig
from convmem.projections import TokenEstimator

__all__ = ["Callback", "SessionServices"]

_log = logging.getLogger("convmem.system")


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


class SessionServices:
    """A session's own summarizer, token estimator, callbacks and starting configuration.

    Every one is optional; what is None comes from the system. Callbacks run
    on the system's callback threads like the system's own (a coroutine
    function's result is run to completion there).
    """

    __slots__ = (
        "__weakref__",
        "callbacks",
        "config",
        "summarizer",
        "token_estimator",
    )

    def __init__(
        self,
        *,
        config: ShortTermMemoryConfig | None = None,
        summarizer: Summarizer | None = None,
        token_estimator: TokenEstimator | None = None,
        on_turn_added: Callable[..., Any] | None = None,
        on_summary_updated: Callable[..., Any] | None = None,
        on_health_changed: Callable[..., Any] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, ShortTermMemoryConfig):
            raise InvalidConfig("config", f"must be a ShortTermMemoryConfig, got {type(config).__name__}")
        if summarizer is not None and not callable(summarizer):
            raise InvalidConfig("summarizer", f"must be callable, got {type(summarizer).__name__}")
        if token_estimator is not None and not callable(token_estimator):
            raise InvalidConfig("token_estimator", f"must be callable, got {type(token_estimator).__name__}")
        self.config = config
        self.summarizer = summarizer
        self.token_estimator = token_estimator
        self.callbacks: dict[str, Callback | None] = {
            "turn": Callback.wrap(on_turn_added, "on_turn_added"),
            "summary": Callback.wrap(on_summary_updated, "on_summary_updated"),
            "health": Callback.wrap(on_health_changed, "on_health_changed"),
        }

    def __repr__(self) -> str:
        given = [name for name in ("config", "summarizer", "token_estimator") if getattr(self, name)]
        given += [f"on_{kind}" for kind, callback in self.callbacks.items() if callback is not None]
        return f"SessionServices({', '.join(given) or 'nothing'})"
