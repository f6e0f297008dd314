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

import os
from types import TracebackType

from convmem.adapters._embedded import EmbeddedNatsServer
from convmem.adapters._jetstream_log import DEFAULT_PREFIX, DEFAULT_STREAM, JetStreamEventLog
from convmem.adapters._jetstream_snapshots import DEFAULT_BUCKET, JetStreamSnapshotStore
from convmem.adapters._nats import DEFAULT_MAX_CONTROL_LINE, NatsConnection

__all__ = ["JetStreamBackend"]


class JetStreamBackend:
    """A JetStream event log and snapshot store sharing one connection (and maybe a server)."""

    def __init__(
        self,
        log: JetStreamEventLog,
        snapshots: JetStreamSnapshotStore,
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
    ) -> JetStreamBackend:
        """Connect to `url`; create or check the stream and the bucket.

        `replicas` 3 on a cluster survives the loss of a server; on a single
        server durability rests on its ``sync_interval`` (see `EmbeddedNatsServer`).
        """
        connection = NatsConnection.connect(url, timeout=timeout, max_control_line=max_control_line)
        try:
            log = JetStreamEventLog(
                connection, stream=stream, prefix=prefix, replicas=replicas, duplicate_window=duplicate_window
            )
            try:
                snapshots = JetStreamSnapshotStore(connection, bucket=bucket, replicas=replicas)
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

    def close(self) -> None:
        """Close both adapters (and so the connection), then stop the embedded server if any."""
        try:
            self.log.close()
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
