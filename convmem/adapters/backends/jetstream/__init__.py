"""NATS JetStream: the durable event log, the snapshot store, their connection and the embedded server.

One connection (`_connection`, with nats-py's client and its shortcuts in
`_client`, and the connection's watch for refusals and reconnections in
`_watch`) runs on its own event-loop thread and serves the log and the
key-value snapshot store (`_snapshots`). The log (`_log`) appends through
its loop-side writer: the full conditional append, the last-message cache
and erasure in `_write`, the one-event hot path in `_fast`, what both share
in `_appends`; reads are `_read`, stream setup `_setup`. `_sealing` seals
events as they are encoded and opens them as they are read (encryption at
rest), and `_keystore` keeps data keys in a key-value bucket of their own
(`NatsKeyStore`). `_backend` bundles log, snapshots and keyring (for a
reader whose events stream is missing, `_lost` says whether the store lost
its history or never had any), and `_embedded` runs a private `nats-server`
for the default setup. Front ends (the service, the CLI) use the names
below, the connection helpers among them.
"""

from convmem.adapters.backends.jetstream._backend import JetStreamBackend, open_key_store
from convmem.adapters.backends.jetstream._client import NatsClient, close_quietly
from convmem.adapters.backends.jetstream._connection import NatsConnection, server_list
from convmem.adapters.backends.jetstream._embedded import (
    EmbeddedNatsServer,
    default_store_dir,
    running_server_url,
)
from convmem.adapters.backends.jetstream._journal import JetStreamErasureJournal
from convmem.adapters.backends.jetstream._keystore import NatsKeyStore
from convmem.adapters.backends.jetstream._log import JetStreamEventLog
from convmem.adapters.backends.jetstream._snapshots import JetStreamSnapshotStore
from convmem.adapters.backends.jetstream._watch import answered_first

__all__ = [
    "EmbeddedNatsServer",
    "JetStreamBackend",
    "JetStreamErasureJournal",
    "JetStreamEventLog",
    "JetStreamSnapshotStore",
    "NatsClient",
    "NatsConnection",
    "NatsKeyStore",
    "answered_first",
    "close_quietly",
    "default_store_dir",
    "open_key_store",
    "running_server_url",
    "server_list",
]
