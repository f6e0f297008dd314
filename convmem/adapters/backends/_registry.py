"""Backends (a log and a snapshot store, opened and closed together) and the one registry of URL schemes.

`open_backend(url)`, and so `connect(url)`, the CLI and the PenguiFlow
drop-in, find what to open by the URL's scheme, here:

=========================================  ====================================================
``memory://``                              `InMemoryBackend`: everything in this process
``nats://``, ``tls://``, ``ws://``,        `JetStreamBackend` on an existing server or cluster
``wss://``                                 (several URLs, comma-separated)
no URL                                     the default scheme's (``nats``): the embedded server
=========================================  ====================================================

A new backend implements `Backend`, and a `BackendOpener` that opens it
with its connection on a loop thread of its own (`open`) or on the running
event loop (`open_here`), and registers its scheme: ``register_backend("sqlite",
SqliteOpener())``. Every entry point then opens it from a ``sqlite://...`` URL.
"""

from __future__ import annotations

import os
from typing import Protocol, TypedDict, TypeVar

from convmem.actors import ErasureJournal, EventLog, SnapshotStore
from convmem.adapters._auth import NatsAuth, redact_url
from convmem.adapters.backends._in_memory import MEMORY_URL, InMemoryBackend
from convmem.adapters.backends.jetstream._backend import EmbeddedOptions, JetStreamBackend, JetStreamOptions
from convmem.adapters.backends.keys import Keyring, KeySettings
from convmem.errors import InvalidInput

__all__ = [
    "DEFAULT_SCHEME",
    "Backend",
    "BackendOpener",
    "BackendOptions",
    "backend_opener",
    "register_backend",
]

DEFAULT_SCHEME = "nats"
"""The scheme whose opener opens what no URL names (for NATS: the embedded server)."""


class Backend(Protocol):
    """A log, a snapshot store and an erasure journal, opened together and closed together.

    `snapshots` and `journal` may be None (a reader that found none); `url`
    says where the backend is, as a client would reach it (shown redacted).
    The journal records each erasure before anything is deleted (see
    `convmem.actors.ErasureJournal`); a backend keeps it as durable as its log.
    """

    @property
    def log(self) -> EventLog: ...

    @property
    def snapshots(self) -> SnapshotStore | None: ...

    @property
    def journal(self) -> ErasureJournal | None: ...

    @property
    def url(self) -> str: ...

    def close(self) -> None:
        """Close the log and the snapshot store (and whatever the backend started for them)."""
        ...


class BackendOptions(TypedDict, total=False):
    """How to open a backend; each key optional, each backend reads those that concern it."""

    data_dir: str | os.PathLike[str] | None
    """The embedded server's data folder (default: ``$XDG_DATA_HOME/convmem/nats``)."""
    stream: str | None
    """The events stream (None: the backend's default)."""
    prefix: str | None
    """The subject prefix (None: the backend's default)."""
    bucket: str | None
    """The snapshot bucket (None: the backend's default)."""
    replicas: int
    """Replicas of the stream and the bucket (default 1)."""
    sync_interval: str | None
    """The embedded server's fsync setting (default ``always``: fsync before acknowledging)."""
    timeout: float
    """Seconds a connection or a call may take (default 5)."""
    auth: NatsAuth | None
    """Credentials and TLS settings; the nats CLI's environment variables fill what it leaves out."""
    read_only: bool
    """Never create what is missing (audits); the embedded server neither creates its folder nor a store."""
    port: int | None
    """The embedded server's port (None: a free one); only without a URL."""
    keys: KeySettings | Keyring | None
    """Encryption at rest: the master key and key store (`KeySettings`), or a `Keyring`; None: the
    default (the embedded server's data folder, else ``CONVMEM_MASTER_KEY`` if set, else none)."""
    journal_bucket: str | None
    """The erasure journal's bucket (None: the backend's default, ``<stream>_ERASURES``)."""
    accept_loss: bool
    """A writer's: make a lost events stream or erasure journal again, empty (default False:
    `StoreLost`); the operator's acceptance of the loss (``convmem repair --accept-loss``)."""


class BackendOpener(Protocol):
    """Opens the backend of one URL scheme (`url` None: the default scheme's own default)."""

    def open(self, url: str | None, options: BackendOptions) -> Backend:
        """The backend, its connection (if any) on a loop thread of its own."""
        ...

    async def open_here(self, url: str | None, options: BackendOptions) -> Backend:
        """The backend, from a coroutine, its connection (if any) on the running event loop."""
        ...


_OPENERS: dict[str, BackendOpener] = {}


def register_backend(scheme: str, opener: BackendOpener) -> None:
    """Open URLs of `scheme` (``scheme://...``) with `opener`; a scheme is registered once."""
    if not scheme.isidentifier() or scheme != scheme.lower():
        raise InvalidInput("scheme", f"must be a lowercase name such as 'nats', got {scheme!r}")
    if scheme in _OPENERS:
        raise InvalidInput("scheme", f"{scheme}:// is already registered to {_OPENERS[scheme]!r}")
    _OPENERS[scheme] = opener


def backend_opener(url: str | None) -> BackendOpener:
    """The opener registered for `url`'s scheme (None: the default scheme's); `InvalidInput` otherwise."""
    if url is None:
        return _OPENERS[DEFAULT_SCHEME]
    scheme, sep, _ = url.strip().partition("://") if isinstance(url, str) else ("", "", "")
    opener = _OPENERS.get(scheme.lower()) if sep else None
    if opener is None:
        raise _not_a_backend(url)
    return opener


def _not_a_backend(url: object) -> InvalidInput:
    shown = redact_url(url) if isinstance(url, str) else repr(url)
    others = ", ".join(f"{scheme}://" for scheme, opener in _OPENERS.items() if opener is not _NATS)
    return InvalidInput(
        "url",
        f"{shown!r} is not a NATS URL (nats://host:port) nor a URL of another backend ({others}); "
        "omit it for the embedded server",
    )


class _InMemory:
    """``memory://``: the in-memory log and snapshot store (nothing to connect)."""

    def open(self, url: str | None, options: BackendOptions) -> Backend:
        if url != MEMORY_URL:
            raise _not_a_backend(url)
        return InMemoryBackend()

    async def open_here(self, url: str | None, options: BackendOptions) -> Backend:
        return self.open(url, options)

    def __repr__(self) -> str:
        return "InMemoryBackend"


class _Nats:
    """NATS JetStream: a server or cluster at the URL, else the embedded server."""

    def open(self, url: str | None, options: BackendOptions) -> Backend:
        if url is None:
            return JetStreamBackend.embedded(options.get("data_dir"), **_embedded(options))
        return JetStreamBackend.connect(url, **_joined(url, options))

    async def open_here(self, url: str | None, options: BackendOptions) -> Backend:
        if url is None:
            return await JetStreamBackend.embedded_here(options.get("data_dir"), **_embedded(options))
        return await JetStreamBackend.connect_here(url, **_joined(url, options))

    def __repr__(self) -> str:
        return "JetStreamBackend"


class _Embedded(EmbeddedOptions, total=False):
    sync_interval: str | None
    port: int | None


_S = TypeVar("_S", bound=EmbeddedOptions)


def _embedded(options: BackendOptions) -> _Embedded:
    """The embedded server's settings given (`JetStreamBackend.embedded`'s defaults for the rest)."""
    settings = _Embedded()
    if "sync_interval" in options:
        settings["sync_interval"] = options["sync_interval"]
    if "timeout" in options:
        settings["timeout"] = options["timeout"]
    if "read_only" in options:
        settings["read_only"] = options["read_only"]
    if options.get("accept_loss"):
        settings["accept_loss"] = True
    if options.get("port") is not None:
        settings["port"] = options["port"]
    if options.get("keys") is not None:
        settings["keys"] = options["keys"]
    return _named(settings, options)


def _joined(url: str, options: BackendOptions) -> JetStreamOptions:
    """The settings given to join the server or cluster at `url` (checked to be NATS URLs).

    The credentials are completed from the nats CLI's environment variables;
    `JetStreamBackend.connect`'s defaults stand for what was not given.
    """
    if not all(u.strip().startswith(("nats://", "tls://", "ws://", "wss://")) for u in url.split(",")):
        raise _not_a_backend(url)
    if options.get("port") is not None:
        raise InvalidInput("port", "is the embedded server's port: give no URL to start one on it")
    from_env, given = NatsAuth.from_env(), options.get("auth")
    settings = JetStreamOptions(auth=from_env if given is None else given.merged(from_env))
    if "replicas" in options:
        settings["replicas"] = options["replicas"]
    if "timeout" in options:
        settings["timeout"] = options["timeout"]
    if "read_only" in options:
        settings["read_only"] = options["read_only"]
    if options.get("accept_loss"):
        settings["accept_loss"] = True
    if options.get("keys") is not None:
        settings["keys"] = options["keys"]
    return _named(settings, options)


def _named(settings: _S, options: BackendOptions) -> _S:
    """`settings` with the stream, prefix and bucket names given (the backend's defaults for the rest)."""
    if (stream := options.get("stream")) is not None:
        settings["stream"] = stream
    if (prefix := options.get("prefix")) is not None:
        settings["prefix"] = prefix
    if (bucket := options.get("bucket")) is not None:
        settings["bucket"] = bucket
    if (journal := options.get("journal_bucket")) is not None:
        settings["journal_bucket"] = journal
    return settings


# The one place a scheme is registered (a backend outside convmem calls `register_backend` itself).
_NATS = _Nats()
for _scheme in ("nats", "tls", "ws", "wss"):
    register_backend(_scheme, _NATS)
register_backend("memory", _InMemory())
