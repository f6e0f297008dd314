"""NATS JetStream: the durable event log, the snapshot store, their connection and the embedded server.

One connection (`_connection`) on its own event-loop thread serves the log
(`_log`, with its loop-side writer `_write`, reads `_read` and stream setup
`_setup`) and the key-value snapshot store (`_snapshots`); `_backend` bundles
them, and `_embedded` runs a private `nats-server` for the default setup.
"""

from convmem.adapters.jetstream._backend import JetStreamBackend
from convmem.adapters.jetstream._embedded import EmbeddedNatsServer
from convmem.adapters.jetstream._log import JetStreamEventLog
from convmem.adapters.jetstream._snapshots import JetStreamSnapshotStore

__all__ = ["EmbeddedNatsServer", "JetStreamBackend", "JetStreamEventLog", "JetStreamSnapshotStore"]
