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
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from convmem.actors._callbacks import Callback, callbacks_of
from convmem.actors._pool import SummarizerPool
from convmem.actors._ports import Summarizer
from convmem.actors._tokens import encoding_counter
from convmem.errors import InvalidConfig, InvalidInput
from convmem.events import MemoryKey, ShortTermMemoryConfig
from convmem.projections import SummaryRequest, TokenEstimator

__all__ = ["ServiceRegistry", "SessionServices"]


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
        self.callbacks = callbacks_of(on_turn_added, on_summary_updated, on_health_changed)

    def __repr__(self) -> str:
        given = [name for name in ("config", "summarizer", "token_estimator") if getattr(self, name)]
        given += [f"on_{kind}" for kind, callback in self.callbacks.items() if callback is not None]
        return f"SessionServices({', '.join(given) or 'nothing'})"


class ServiceRegistry:
    """What each session runs with: its configuration, estimator and summarizer, its own or the system's.

    Registrations (`register`) hold a session's starting configuration and
    its `SessionServices` (weakly); the summarizer pool starts with the
    first summary asked of a system without a summarizer of its own.
    """

    def __init__(
        self,
        config: ShortTermMemoryConfig,
        estimator: TokenEstimator,
        summarizer: Summarizer | None,
        *,
        workers: int,
        queue_limit: int,
        max_abandoned: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.estimator = estimator
        self.summarizer = summarizer
        self.check(config, summarizer)
        self._pool_settings = (workers, queue_limit, max_abandoned)
        self._loop = loop
        self._lock = threading.Lock()
        self._closed = False
        self._configs: dict[MemoryKey, ShortTermMemoryConfig] = {}
        self._services: weakref.WeakValueDictionary[MemoryKey, SessionServices] = (
            weakref.WeakValueDictionary()
        )
        self._registered = False
        """Some session registered its own services (until then nothing is looked up: a weak
        dictionary's `get` is a Python call, and every write asks it three times)."""
        self.pool: SummarizerPool | None = self._new_pool() if summarizer is not None else None

    @staticmethod
    def check(config: ShortTermMemoryConfig, summarizer: Summarizer | None) -> None:
        """`InvalidConfig` when `config` needs a summarizer that is None, or an encoding not loadable."""
        if config.token_counter is not None:
            encoding_counter(config.token_counter)  # fail at configuration, not at the first view
        if config.summarizes and summarizer is None:
            raise InvalidConfig(
                "summarizer",
                "strategy 'rolling_summary' needs a summarizer "
                "(e.g. convmem.adapters.ExtractiveSummarizer())",
            )

    def register(
        self, key: MemoryKey, config: ShortTermMemoryConfig | None, services: SessionServices | None
    ) -> None:
        """`key` starts with `config` and runs with `services` (the latest registration wins)."""
        if services is not None and not isinstance(services, SessionServices):
            raise InvalidInput("services", f"must be SessionServices, got {type(services).__name__}")
        summarizer = self.summarizer_for(key) if services is None else services.summarizer or self.summarizer
        for given in (config, services.config if services is not None else None):
            if given is not None:
                self.check(given, summarizer)
        with self._lock:
            if config is not None:
                self._configs[key] = config
            if services is not None:
                self._services[key] = services
                self._registered = True

    def config_for(self, key: MemoryKey) -> ShortTermMemoryConfig:
        """The configuration a new session `key` starts with."""
        services = self._services.get(key) if self._registered else None
        if services is not None and services.config is not None:
            return services.config
        with self._lock:
            return self._configs.get(key, self.config)

    def estimator_for(self, key: MemoryKey, config: ShortTermMemoryConfig | None = None) -> TokenEstimator:
        """The token counter of session `key` running with `config` (its starting one when None).

        The encoding its configuration names (recorded with the session), else its own
        callable, else the system's.
        """
        named = (config if config is not None else self.config_for(key)).token_counter
        if named is not None:
            return encoding_counter(named)
        services = self._services.get(key) if self._registered else None
        if services is not None and services.token_estimator is not None:
            return services.token_estimator
        return self.estimator

    def summarizer_for(self, key: MemoryKey) -> Summarizer | None:
        """The summarizer of session `key` (its own, else the system's)."""
        services = self._services.get(key) if self._registered else None
        if services is not None and services.summarizer is not None:
            return services.summarizer
        return self.summarizer

    def callbacks_for(self, key: MemoryKey) -> Mapping[str, Callback | None] | None:
        """The session's own callbacks, if it registered services."""
        services = self._services.get(key) if self._registered else None
        return services.callbacks if services is not None else None

    def summarize(
        self, key: MemoryKey, request: SummaryRequest, reply: Callable[[Any], object]
    ) -> str | None:
        """Queue `request` for the session's summarizer; why not, when it could not be queued."""
        summarizer = self.summarizer_for(key)
        if summarizer is None:
            return "no summarizer configured"
        with self._lock:
            if self._closed:
                return "the memory system is closed"
            if self.pool is None:
                self.pool = self._new_pool()
            pool = self.pool
        if not pool.submit(request, reply, summarizer=summarizer):
            return "summarizer queue is full"
        return None

    def _new_pool(self) -> SummarizerPool:
        workers, queue, max_abandoned = self._pool_settings
        return SummarizerPool(
            self.summarizer,
            workers=workers,
            queue_limit=queue,
            call_timeout=self.config.health.summarize_timeout_seconds * 2,
            max_abandoned=max_abandoned,
            loop=self._loop,
        )

    def close(self) -> None:
        """Answer every summary still asked and stop the pool."""
        with self._lock:
            self._closed = True
            pool = self.pool
        if pool is not None:
            pool.close()
