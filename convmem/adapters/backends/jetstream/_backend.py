"""`JetStreamBackend`: the durable log, snapshot store and erasure journal on one NATS connection.

```python
with JetStreamBackend.connect("nats://127.0.0.1:4222") as backend:
    system = MemorySystem(log=backend.log, snapshots=backend.snapshots, journal=backend.journal, ...)
```

`embedded()` starts a private nats-server first (see `EmbeddedNatsServer`)
and stops it on close. Closing the backend closes both adapters; closing
both adapters closes the connection too.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TypedDict, Unpack

from convmem.actors._bounds import MAX_REPLICAS, check_count, check_seconds
from convmem.adapters._auth import NatsAuth, redact_url
from convmem.adapters.backends.jetstream._connection import (
    ConnectionOptions,
    NatsConnection,
)
from convmem.adapters.backends.jetstream._embedded import EmbeddedNatsServer
from convmem.adapters.backends.jetstream._journal import JetStreamErasureJournal, erasure_bucket
from convmem.adapters.backends.jetstream._keystore import DEFAULT_KEY_BUCKET, NatsKeyStore
from convmem.adapters.backends.jetstream._log import (
    DEFAULT_PREFIX,
    DEFAULT_STREAM,
    JetStreamEventLog,
    stream_not_found,
)
from convmem.adapters.backends.jetstream._lost import (
    history_lost,
    journal_lost,
    lost_parts,
    mark_store,
    part_configs,
    refusal,
)
from convmem.adapters.backends.jetstream._setup import check_exists, check_names
from convmem.adapters.backends.jetstream._snapshots import DEFAULT_BUCKET, JetStreamSnapshotStore
from convmem.adapters.backends.keys import Keyring, KeySettings, KeyStore, master_source, store_spec
from convmem.adapters.backends.keys._stores import CHECK_META, DirKeyStore
from convmem.errors import EncryptionKeyError, InvalidConfig, StoreLost, StoreNotFound

__all__ = ["EmbeddedOptions", "JetStreamBackend", "JetStreamOptions", "open_key_store", "open_keyring"]

_log = logging.getLogger("convmem.jetstream")


class EmbeddedOptions(TypedDict, total=False):
    """Settings of a JetStream backend that an embedded server takes too (each optional)."""

    stream: str
    """The events stream (default ``CONVMEM_EVENTS``)."""
    prefix: str
    """The subject prefix (default ``convmem.ev``)."""
    bucket: str
    """The snapshot bucket (default ``CONVMEM_SNAPSHOTS``)."""
    journal_bucket: str
    """The erasure journal's bucket (default ``<stream>_ERASURES``)."""
    timeout: float
    """Seconds a connection, a check or a call may take (default 5)."""
    read_only: bool
    """Never create the stream or the buckets (audits): a missing stream is `StoreNotFound`,
    a missing bucket leaves `snapshots` (or `journal`) None. An embedded server then never
    creates its folder or store either (see `EmbeddedNatsServer`). A missing stream while the
    store still holds what sessions leave beside their events (snapshots, erasure records, data
    keys, byte tallies) is no `StoreNotFound` but damage: the log reads as empty and its `history_lost` says
    what was lost (`verify` names each session with a snapshot as lost)."""
    keys: KeySettings | Keyring | None
    """Encryption at rest: where the master key and the key store are (`KeySettings`), or a
    `Keyring` made by the caller (kept open: the caller closes it). None: the embedded default's
    (a master key and key folder in its data folder), else ``CONVMEM_MASTER_KEY`` if set, else none."""
    accept_loss: bool
    """A writer's: make the events stream or the erasure journal's bucket again, empty, though the
    store shows it existed and was lost (default False: `StoreLost`, naming the part and where).
    The operator's explicit acceptance (``convmem repair --accept-loss``); `accepted_loss` says what."""


class JetStreamOptions(EmbeddedOptions, total=False):
    """Settings of a JetStream backend on a server of its own (each optional)."""

    replicas: int
    """Replicas of the stream and the bucket (default 1; 3 on a cluster survives a server's loss)."""
    duplicate_window: float
    """Seconds the stream remembers message ids (default 120)."""
    max_control_line: int
    """The server's ``max_control_line``: longer subjects are refused here, not by a dropped connection."""
    auth: NatsAuth | None
    """Credentials and TLS settings (none: the URL's own, if any)."""


class JetStreamBackend:
    """A JetStream event log and snapshot store sharing one connection (and maybe a server).

    `connect` and `embedded` put the connection on a loop thread of its own;
    `connect_here` and `embedded_here`, called from a coroutine, on the
    running event loop. Both pairs take the same `JetStreamOptions`.
    """

    def __init__(
        self,
        log: JetStreamEventLog,
        snapshots: JetStreamSnapshotStore | None,
        *,
        url: str,
        server: EmbeddedNatsServer | None = None,
        keyring: Keyring | None = None,
        journal: JetStreamErasureJournal | None = None,
    ) -> None:
        self.log = log
        self.snapshots = snapshots
        self.journal = journal
        self.url = url
        self.server = server
        self.keyring = keyring
        """The keyring this backend opened (closed with it); None when it stores plain or was given one."""
        self.accepted_loss: tuple[str, ...] = ()
        """What this writer made again, empty, with ``accept_loss``: one line per lost part."""

    @classmethod
    def connect(cls, url: str, **options: Unpack[JetStreamOptions]) -> JetStreamBackend:
        """Connect to `url`; create or check the stream and the bucket.

        `replicas` 3 on a cluster survives the loss of a server; on a single
        server durability rests on its ``sync_interval`` (see `EmbeddedNatsServer`).
        """
        return cls._on(NatsConnection.connect(url, **_connection(_checked(options))), url, options)

    @classmethod
    async def connect_here(cls, url: str, **options: Unpack[JetStreamOptions]) -> JetStreamBackend:
        """`connect`, with the NATS connection on the event loop running here (call from a coroutine).

        For asyncio planners: an `AsyncSessionHandle` write then runs on the
        planner's own loop from decision to acknowledgement, with no thread
        in between, which is convmem's fastest write path. Blocking calls
        must come from other threads (a `SessionHandle`, `close`): close
        with `await backend.aclose()`, and the system with `await system.aclose()`.
        """
        connection = await NatsConnection.connect_here(url, **_connection(_checked(options)))
        # The stream and bucket checks wait on this loop: they run on a worker thread meanwhile.
        return await asyncio.to_thread(cls._on, connection, url, options)

    @classmethod
    def _on(cls, connection: NatsConnection, url: str, options: JetStreamOptions) -> JetStreamBackend:
        replicas, create = options.get("replicas", 1), not options.get("read_only", False)
        keys = options.get("keys")
        owned: Keyring | None = None
        try:
            keyring = (
                keys
                if isinstance(keys, Keyring)
                else (owned := open_keyring(keys, connection, replicas, read_only=not create))
            )
        except BaseException:
            connection.release()
            raise
        stream = options.get("stream", DEFAULT_STREAM)
        journal_name = options.get("journal_bucket") or erasure_bucket(stream)
        found: tuple[dict[str, object] | None, dict[str, object] | None] | None = None
        accepted: list[str] = []
        try:
            if create:  # before anything is made: a lost part is never made again unasked
                found = part_configs(connection, stream, journal_name)
                for part, name, why in lost_parts(
                    connection,
                    stream=stream,
                    prefix=options.get("prefix", DEFAULT_PREFIX),
                    journal_bucket=journal_name,
                    snapshot_bucket=options.get("bucket", DEFAULT_BUCKET),
                    keyring=keyring,
                    found=found,
                ):
                    if not options.get("accept_loss", False):
                        raise StoreLost(
                            f"{refusal(part, why)} (the NATS server at {redact_url(url)})",
                            part=part,
                            name=name,
                            where=redact_url(url),
                        )
                    _log.warning("%s: LOST, the loss accepted: made again, empty: %s", part, why)
                    accepted.append(f"{part} {name!r}: {why}")
            log = JetStreamEventLog(
                connection,
                stream=stream,
                prefix=options.get("prefix", DEFAULT_PREFIX),
                replicas=replicas,
                duplicate_window=options.get("duplicate_window", 120.0),
                create=create,
                absent_ok=not create,
                keyring=keyring,
                journal_bucket=options.get("journal_bucket"),
                keys_missing=(
                    missing_key_store(keys)
                    if keyring is None and not create and not isinstance(keys, Keyring)
                    else None
                ),
            )
            snapshots: JetStreamSnapshotStore | None = None
            try:
                try:
                    snapshots = JetStreamSnapshotStore(
                        connection,
                        bucket=options.get("bucket", DEFAULT_BUCKET),
                        replicas=replicas,
                        create=create,
                        keyring=keyring,
                    )
                except StoreNotFound:
                    snapshots = None  # a reader does without snapshots
                if not create and not log.stream_absent:  # a writer asked before it made anything
                    log.journal_lost = journal_lost(
                        connection, stream, log.journal_bucket, options.get("bucket", DEFAULT_BUCKET)
                    )
                journal = log.erasure_journal()  # beside the stream, closed with the log
                if found is not None:  # a writer's: both made, each marked with the other's name
                    mark_store(connection, stream, log.journal_bucket, found)
                if log.stream_absent:  # a reader's: lost, if the rest of the store shows sessions
                    log.history_lost = history_lost(
                        connection,
                        stream,
                        options.get("prefix", DEFAULT_PREFIX),
                        snapshots=snapshots,
                        journal=journal,
                        keyring=keyring,
                        journal_bucket=log.journal_bucket,
                    )
                    if log.history_lost is None:
                        raise stream_not_found(stream)  # nothing was stored there yet
            except BaseException:
                log.close()
                if snapshots is not None:
                    snapshots.close()
                raise
        except BaseException:
            if owned is not None:
                owned.close()
            raise
        finally:
            connection.release()  # the adapters hold the connection from here on
        backend = cls(log, snapshots, url=url, keyring=owned, journal=journal)
        backend.accepted_loss = tuple(accepted)
        return backend

    @classmethod
    def embedded(
        cls,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        sync_interval: str | None = "always",
        port: int | None = None,
        **options: Unpack[EmbeddedOptions],
    ) -> JetStreamBackend:
        """Start a private nats-server on `store_dir` (default: the per-user data folder) and connect.

        `port`: the port it listens on (default: a free one).
        """
        _check_port(port)
        server = EmbeddedNatsServer(
            store_dir, sync_interval=sync_interval, port=port, read_only=options.get("read_only", False)
        ).start()
        with _stopped_on_error(server):
            options = _embedded_keys(options, server)
            return cls.connect(server.url, max_control_line=server.max_control_line, **options)._of(server)

    @classmethod
    async def embedded_here(
        cls,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        sync_interval: str | None = "always",
        port: int | None = None,
        **options: Unpack[EmbeddedOptions],
    ) -> JetStreamBackend:
        """`embedded`, connected on the event loop running here (see `connect_here`)."""
        _check_port(port)
        server = EmbeddedNatsServer(
            store_dir, sync_interval=sync_interval, port=port, read_only=options.get("read_only", False)
        )
        await asyncio.to_thread(server.start)
        try:
            options = _embedded_keys(options, server)
            backend = await cls.connect_here(server.url, max_control_line=server.max_control_line, **options)
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise
        return backend._of(server)

    def _of(self, server: EmbeddedNatsServer) -> JetStreamBackend:
        """This backend, owning `server` (stopped when the backend closes)."""
        self.server = server
        return self

    async def aclose(self) -> None:
        """`close` from a coroutine: on a worker thread, as closing waits on the connection's loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Close the adapters (and so the connection), then stop the embedded server if any."""
        try:
            self.log.close()
            if self.snapshots is not None:
                self.snapshots.close()
            if self.keyring is not None:
                self.keyring.close()
        finally:
            if self.server is not None:
                self.server.stop()

    def __enter__(self) -> JetStreamBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _embedded_keys(options: EmbeddedOptions, server: EmbeddedNatsServer) -> EmbeddedOptions:
    """`options` with the embedded default's keys: a master key and a key folder in its data folder."""
    keys = options.get("keys")
    if isinstance(keys, Keyring):
        return options
    settings = (keys or KeySettings()).with_data_dir(server.store_dir)
    merged = EmbeddedOptions(**options)
    merged["keys"] = settings
    return merged


def open_keyring(
    keys: KeySettings | None, connection: NatsConnection, replicas: int = 1, *, read_only: bool = False
) -> Keyring | None:
    """The keyring `keys` name (see `KeySettings`), its key store on `connection` when a NATS bucket;
    None when they name no master key (events stored plain).

    A reader (`read_only`) creates nothing: no key, no folder, no bucket; with no key store
    there it has no keyring (an encrypted event it meets is then `EncryptionKeyError`).
    """
    settings = keys or KeySettings()
    if settings.encrypt is False:
        return None
    nats = store_spec(settings).startswith("nats:")
    if nats and master_source(settings, may_create=False) is None:
        return None  # no master key named: plain, and no bucket made for nothing
    store = open_key_store(settings, connection, replicas, read_only=read_only)
    if store is None:
        return None
    try:
        provider = master_source(settings, may_create=not read_only and store.meta(CHECK_META) is None)
        if provider is None:
            store.close()
            return None
        return Keyring(provider, store, read_only=read_only)
    except BaseException:
        store.close()
        raise


def missing_key_store(keys: KeySettings | None) -> str | None:
    """Why a reader has no keyring although a master key is given: its key store folder is gone."""
    settings = keys or KeySettings()
    if settings.encrypt is False:
        return None
    spec = store_spec(settings)
    if spec.startswith("nats:") or Path(spec).is_dir():
        return None
    try:
        if master_source(settings, may_create=False) is None:
            return None
    except EncryptionKeyError:
        return None  # no usable master key either: the error names that one, as before
    return (
        f"the key store {spec} does not exist, though a master key is given: restore that folder "
        "from a backup of the keys (without it nothing encrypted can be read)"
    )


def open_key_store(
    settings: KeySettings, connection: NatsConnection | None, replicas: int = 1, *, read_only: bool = False
) -> KeyStore | None:
    """The key store `settings` name: a folder, or a NATS bucket on `connection`.

    None for a reader (`read_only`) when there is none: it is never created then.
    """
    spec = store_spec(settings)
    if not spec.startswith("nats:"):
        if read_only and not Path(spec).is_dir():
            return None
        return DirKeyStore(spec, create=not read_only)
    if connection is None:
        raise InvalidConfig("key_store", f"{spec} is a NATS bucket: give the server (--server URL)")
    bucket = spec[len("nats:") :] or DEFAULT_KEY_BUCKET
    if read_only and not connection.call(
        lambda: check_exists(connection, f"KV_{bucket}"), what=f"finding bucket {bucket!r}"
    ):
        return None
    return NatsKeyStore(connection, bucket=bucket, replicas=replicas)


def _checked(options: JetStreamOptions) -> JetStreamOptions:
    """`options` when their numbers and names are valid; `InvalidConfig` naming one that is not, before
    anything connects (the connection checks its timeout): the duplicate window at most a day, 1 to 5
    replicas (JetStream's most; a single server took 10**6 without a word), names NATS takes."""
    if "replicas" in options:
        check_count("replicas", options["replicas"], most=MAX_REPLICAS)
    if "duplicate_window" in options:
        check_seconds("duplicate_window", options["duplicate_window"])
    # The names too, before the server is asked anything of them: a stream name with a dot or a space
    # made the first request wait out the setup's time or fail as 'invalid subject', as if the server
    # were down.
    check_names(stream=options.get("stream"), prefix=options.get("prefix"), bucket=options.get("bucket"))
    if (journal := options.get("journal_bucket")) is not None:
        try:
            check_names(bucket=journal)
        except InvalidConfig as exc:
            raise InvalidConfig("journal_bucket", exc.problem) from None
    return options


def _check_port(port: object) -> None:
    if port is not None:
        check_count("port", port, most=65535)


def _connection(options: JetStreamOptions) -> ConnectionOptions:
    """The options given that concern the connection itself (its defaults for the rest)."""
    settings = ConnectionOptions(auth=options.get("auth"))
    if "timeout" in options:
        settings["timeout"] = options["timeout"]
    if "max_control_line" in options:
        settings["max_control_line"] = options["max_control_line"]
    return settings


@contextmanager
def _stopped_on_error(server: EmbeddedNatsServer) -> Iterator[None]:
    try:
        yield
    except StoreLost as exc:  # where it was lost: the data folder, not a private server's address
        server.stop()
        folder = str(server.store_dir)
        said = str(exc).replace(
            f"the NATS server at {exc.where}", f"the embedded server's data folder {folder}"
        )
        raise StoreLost(said, part=exc.part, name=exc.name, where=folder) from None
    except BaseException:
        server.stop()
        raise
