"""The process-wide `MemorySystem` behind every `DefaultShortTermMemory`: opened lazily, closed at exit.

The first memory opens it, on (in order of precedence) what `configure()`
was given, the ``CONVMEM_*`` environment (the names `convmem serve` reads),
or the embedded default: a private nats-server on loopback with its data in
``CONVMEM_DATA_DIR`` or the per-user folder. `configure(system=...)` hands
in a system of your own instead (convmem neither opens nor closes it).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from convmem.actors import MemorySystem
from convmem.actors._bounds import MAX_ACTOR_THREADS, MAX_LIVE_SESSIONS, MAX_REPLICAS, check_count
from convmem.adapters.frontends._connect import open_backend
from convmem.errors import InvalidConfig

__all__ = ["ENVIRONMENT", "close", "configure", "current_system"]

_log = logging.getLogger("convmem.penguiflow")

ENVIRONMENT = {
    "CONVMEM_NATS_URL": "url",
    "CONVMEM_DATA_DIR": "data_dir",
    "CONVMEM_STREAM": "stream",
    "CONVMEM_PREFIX": "prefix",
    "CONVMEM_BUCKET": "bucket",
    "CONVMEM_REPLICAS": "replicas",
    "CONVMEM_MAX_LIVE_SESSIONS": "max_live_sessions",
    "CONVMEM_ACTOR_THREADS": "actor_threads",
    "CONVMEM_SUMMARIZER_WORKERS": "summarizer_workers",
}
"""Environment names read when `configure()` did not set the setting, and the setting each gives."""

_INTEGERS = {
    "replicas": MAX_REPLICAS,
    "max_live_sessions": MAX_LIVE_SESSIONS,
    "actor_threads": MAX_ACTOR_THREADS,
    "summarizer_workers": MAX_ACTOR_THREADS,
}
"""The whole-number settings and the most each takes (as `convmem serve` and `connect()` bound them)."""
_BACKEND = ("url", "data_dir", "stream", "prefix", "bucket", "replicas", "sync_interval", "timeout")


class _Runtime:
    """What `configure()` set and the system it opened (one per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settings: dict[str, Any] = {}
        self.given: MemorySystem | None = None
        self.system: MemorySystem | None = None


_runtime = _Runtime()


def configure(
    url: str | None = None,
    *,
    system: MemorySystem | None = None,
    **settings: Any,
) -> None:
    """Where the PenguiFlow memories keep their sessions (call before the first memory is made).

    `url` and the keywords are `convmem.connect()`'s (``data_dir``, ``stream``,
    ``prefix``, ``bucket``, ``replicas``, ``sync_interval``, ``timeout``, and
    `MemorySystem` options such as ``max_live_sessions``); a setting left out
    comes from the environment, then from the defaults. `system` uses a
    `MemorySystem` you opened (and close) yourself. A system this module
    opened earlier is closed first; memories made before then go on with
    the new one.
    """
    if system is not None and (url is not None or settings):
        raise InvalidConfig("system", "give either a MemorySystem or the settings to open one, not both")
    if system is not None and not isinstance(system, MemorySystem):
        raise InvalidConfig("system", f"must be a MemorySystem, got {type(system).__name__}")
    close()
    with _runtime.lock:
        _runtime.given = system
        _runtime.settings = {"url": url, **settings} if url is not None else dict(settings)


def _from_environment() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, setting in ENVIRONMENT.items():
        value = os.environ.get(name)
        if not value:
            continue
        if setting in _INTEGERS:
            try:
                number = int(value)
            except ValueError:
                raise InvalidConfig(name, f"must be an integer, got {value[:40]!r}") from None
            found[setting] = check_count(name, number, most=_INTEGERS[setting])
        else:
            found[setting] = value
    return found


def current_system() -> MemorySystem:
    """The process-wide system, opened on first use."""
    system = _runtime.given or _runtime.system
    if system is not None and not system.closed:
        return system
    with _runtime.lock:
        if _runtime.given is not None:
            return _runtime.given
        if _runtime.system is None or _runtime.system.closed:
            _runtime.system = _open(_runtime.settings)
        return _runtime.system


def _open(given: dict[str, Any]) -> MemorySystem:
    settings = {**_from_environment(), **given}
    backend_settings = {k: settings.pop(k) for k in _BACKEND if k in settings}
    backend = open_backend(**backend_settings)
    try:
        system = MemorySystem(
            log=backend.log,
            snapshots=backend.snapshots,
            journal=backend.journal,
            on_close=backend.close,
            **settings,
        )
    except BaseException:
        backend.close()
        raise
    _log.info("convmem memory for PenguiFlow opened (%s)", backend_settings.get("url") or "embedded server")
    return system


def close() -> None:
    """Close the system this module opened (the next memory opens a new one)."""
    with _runtime.lock:
        system, _runtime.system = _runtime.system, None
    if system is not None:
        system.close()


atexit.register(close)
