"""`JetStreamBackend`: the durable log and snapshot store on one NATS connection.

```python
with JetStreamBackend.connect("nats://127.0.0.1:4222") as backend:
    system = MemorySystem(log=backend.log, snapshots=backend.snapshots, ...)
```

`embedded()` starts a private nats-server first (see `EmbeddedNatsServer`)
and stops it on close. Closing the backend closes both adapters; closing
both adapters closes the connection too.
"""

from __future__ import annotations

import asyncio
import os
from types import TracebackType

from convmem.adapters._auth import NatsAuth
from convmem.adapters.jetstream._connection import DEFAULT_MAX_CONTROL_LINE, NatsConnection
from convmem.adapters.jetstream._embedded import EmbeddedNatsServer
from convmem.adapters.jetstream._log import DEFAULT_PREFIX, DEFAULT_STREAM, JetStreamEventLog
from convmem.adapters.jetstream._snapshots import DEFAULT_BUCKET, JetStreamSnapshotStore
from convmem.errors import StoreNotFound

__all__ = ["JetStreamBackend"]


class JetStreamBackend:
    """A JetStream event log and snapshot store sharing one connection (and maybe a server)."""

    def __init__(
        self,
        log: JetStreamEventLog,
        snapshots: JetStreamSnapshotStore | None,
        *,
        url: str,
        server: EmbeddedNatsServer | None = None,
    ) -> None:
        self.log = log
        self.snapshots = snapshots
        self.url = url
        self.server = server

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        timeout: float = 5.0,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        auth: NatsAuth | None = None,
        read_only: bool = False,
    ) -> JetStreamBackend:
        """Connect to `url`; create or check the stream and the bucket.

        `replicas` 3 on a cluster survives the loss of a server; on a single
        server durability rests on its ``sync_interval`` (see `EmbeddedNatsServer`).
        `auth` holds credentials and TLS settings. `read_only` (audits) never
        creates the stream or the bucket: a missing stream is `StoreNotFound`,
        a missing bucket leaves `snapshots` None.
        """
        connection = NatsConnection.connect(
            url, timeout=timeout, max_control_line=max_control_line, auth=auth
        )
        return cls._on(connection, url, stream, prefix, bucket, replicas, duplicate_window, read_only)

    @classmethod
    async def connect_here(
        cls,
        url: str,
        *,
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        bucket: str = DEFAULT_BUCKET,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        timeout: float = 5.0,
        max_control_line: int = DEFAULT_MAX_CONTROL_LINE,
        auth: NatsAuth | None = None,
        read_only: bool = False,
    ) -> JetStreamBackend:
        """`connect`, with the NATS connection on the event loop running here (call from a coroutine).

        For asyncio planners: an `AsyncSessionHandle` write then runs on the
        planner's own loop from decision to acknowledgement, with no thread
        in between, which is convmem's fastest write path. Blocking calls
        must come from other threads (a `SessionHandle`, `close`): close
        with `await backend.aclose()`, and the system with `await system.aclose()`.
        """
        connection = await NatsConnection.connect_here(
            url, timeout=timeout, max_control_line=max_control_line, auth=auth
        )
        # The stream and bucket checks wait on this loop: they run on a worker thread meanwhile.
        return await asyncio.to_thread(
            cls._on, connection, url, stream, prefix, bucket, replicas, duplicate_window, read_only
        )

    @classmethod
    def _on(
        cls,
        connection: NatsConnection,
        url: str,
        stream: str,
        prefix: str,
        bucket: str,
        replicas: int,
        duplicate_window: float,
        read_only: bool = False,
    ) -> JetStreamBackend:
        try:
            log = JetStreamEventLog(
                connection,
                stream=stream,
                prefix=prefix,
                replicas=replicas,
                duplicate_window=duplicate_window,
                create=not read_only,
            )
            snapshots: JetStreamSnapshotStore | None
            try:
                snapshots = JetStreamSnapshotStore(
                    connection, bucket=bucket, replicas=replicas, create=not read_only
                )
            except StoreNotFound:
                snapshots = None  # a reader does without snapshots
            except BaseException:
                log.close()
                raise
        finally:
            connection.release()  # the two adapters hold the connection from here on
        return cls(log, snapshots, url=url)

    @classmethod
    def embedded(
        cls,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        sync_interval: str | None = "always",
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        bucket: str = DEFAULT_BUCKET,
        timeout: float = 5.0,
    ) -> JetStreamBackend:
        """Start a private nats-server on `store_dir` (default: the per-user data folder) and connect."""
        server = EmbeddedNatsServer(store_dir, sync_interval=sync_interval).start()
        try:
            backend = cls.connect(
                server.url,
                stream=stream,
                prefix=prefix,
                bucket=bucket,
                timeout=timeout,
                max_control_line=server.max_control_line,
            )
        except BaseException:
            server.stop()
            raise
        backend.server = server
        return backend

    @classmethod
    async def embedded_here(
        cls,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        sync_interval: str | None = "always",
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        bucket: str = DEFAULT_BUCKET,
        timeout: float = 5.0,
    ) -> JetStreamBackend:
        """`embedded`, connected on the event loop running here (see `connect_here`)."""
        server = await asyncio.to_thread(EmbeddedNatsServer(store_dir, sync_interval=sync_interval).start)
        try:
            backend = await cls.connect_here(
                server.url,
                stream=stream,
                prefix=prefix,
                bucket=bucket,
                timeout=timeout,
                max_control_line=server.max_control_line,
            )
        except BaseException:
            await asyncio.to_thread(server.stop)
            raise
        backend.server = server
        return backend

    async def aclose(self) -> None:
        """`close` from a coroutine: on a worker thread, as closing waits on the connection's loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Close both adapters (and so the connection), then stop the embedded server if any."""
        try:
            self.log.close()
            if self.snapshots is not None:
                self.snapshots.close()
        finally:
            if self.server is not None:
                self.server.stop()

    def __enter__(self) -> JetStreamBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
