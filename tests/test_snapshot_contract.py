"""The `SnapshotStore` contract (`convmem.testing.SnapshotStoreContract`), for the in-memory store and
the JetStream key-value store; then what only the bucket can hold."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from convmem.actors import SnapshotStore
from convmem.adapters import EmbeddedNatsServer, JetStreamEventLog, JetStreamSnapshotStore
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.errors import InvalidConfig, SessionClosed
from convmem.events import MemoryKey
from convmem.testing import InMemorySnapshotStore, OpenStore, SnapshotStoreContract
from convmem.testing._snapshot_contract import KEY, snap


class TestInMemoryStore(SnapshotStoreContract):
    @pytest.fixture
    def open_store(self) -> Iterator[OpenStore]:
        """Handles on one fresh in-memory store: the same object each time."""
        shared = InMemorySnapshotStore()
        yield lambda: shared
        shared.close()


class TestJetStreamStore(SnapshotStoreContract):
    @pytest.fixture
    def open_store(self, nats_server: EmbeddedNatsServer) -> Iterator[OpenStore]:
        """Handles on the test server's bucket: a connection each."""
        handles: list[SnapshotStore] = []

        def open_jetstream() -> SnapshotStore:
            handles.append(JetStreamSnapshotStore.connect(nats_server.url, timeout=10.0))
            return handles[-1]

        yield open_jetstream
        for handle in handles:
            handle.close()


# -- JetStream only: what the bucket may hold that the in-memory store cannot ----------------


@pytest.fixture
def bucket_store(nats_server: EmbeddedNatsServer) -> Iterator[JetStreamSnapshotStore]:
    store = JetStreamSnapshotStore.connect(nats_server.url)
    yield store
    store.close()


def put_raw(url: str, subject: str, data: bytes) -> None:
    """Write bytes into the bucket under `subject`, bypassing the store."""
    connection = NatsConnection.connect(url)
    try:

        async def put() -> None:
            await connection.js.publish(subject, data)

        connection.call(put, what="raw put")
    finally:
        connection.close()


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1 not msgpack", b"\x93\x01\x02\x03", b'{"key": "json"}', b"\x84\xa3key\x93\xa0\xa1b\xa1c"],
)
def test_corrupt_bytes_in_the_bucket_load_as_none(
    nats_server: EmbeddedNatsServer, bucket_store: JetStreamSnapshotStore, data: bytes
) -> None:
    """A value that does not decode to a valid snapshot is ignored, never raised; a save replaces it."""
    put_raw(nats_server.url, bucket_store.subject(KEY), data)
    assert bucket_store.load(KEY) is None
    bucket_store.save(snap(1))
    assert bucket_store.load(KEY) == snap(1)


def test_a_snapshot_of_another_key_is_ignored(
    nats_server: EmbeddedNatsServer, bucket_store: JetStreamSnapshotStore
) -> None:
    """A valid snapshot stored under the wrong key is not returned for this key."""
    other = MemoryKey("acme", "bob", "s1")
    put_raw(nats_server.url, bucket_store.subject(KEY), msgspec.msgpack.encode(snap(5, other)))
    assert bucket_store.load(KEY) is None


def test_a_closed_store_raises_session_closed(bucket_store: JetStreamSnapshotStore) -> None:
    """After close() the JetStream store refuses every call."""
    bucket_store.close()
    with pytest.raises(SessionClosed):
        bucket_store.load(KEY)
    with pytest.raises(SessionClosed):
        bucket_store.save(snap(1))
    with pytest.raises(SessionClosed):
        bucket_store.delete(KEY)


def test_the_log_and_the_store_share_one_connection(nats_server: EmbeddedNatsServer) -> None:
    """Closing one of two adapters on a connection leaves the other working; the last closes it."""
    connection = NatsConnection.connect(nats_server.url)
    log = JetStreamEventLog(connection)
    store = JetStreamSnapshotStore(connection)
    connection.release()
    log.close()
    store.save(snap(1))
    assert store.load(KEY) == snap(1)
    store.close()
    assert connection.closed


# Snapshots larger than a message ---------------------------------------------------------


def _stored(url: str, subject: str) -> bytes | None:
    """The bytes stored on `subject` of the default bucket, read past the store (None: nothing)."""
    connection = NatsConnection.connect(url)
    try:

        async def get() -> bytes | None:
            message = await connection.get_message("KV_CONVMEM_SNAPSHOTS", {"last_by_subj": subject})
            return None if message is None else message.data

        return connection.call(get, what="raw get")
    finally:
        connection.close()


def _split_store(url: str) -> JetStreamSnapshotStore:
    """A store that splits every snapshot over 100 bytes (it owns its connection)."""
    connection = NatsConnection.connect(url)
    try:
        return JetStreamSnapshotStore(connection, part_bytes=100)
    finally:
        connection.release()


def test_a_snapshot_over_the_payload_limit_is_split_and_loads_back(nats_server: EmbeddedNatsServer) -> None:
    """A 3 MiB snapshot (three times NATS's 1 MiB payload) saves in parts and loads back equal."""
    store = JetStreamSnapshotStore.connect(nats_server.url)
    try:
        big = snap(7, data=bytes(range(256)) * (3 * 4096))
        store.save(big)
        assert store.load(KEY) == big
        assert _stored(nats_server.url, f"{store.subject(KEY)}.part.3") is not None
        assert _stored(nats_server.url, f"{store.subject(KEY)}.part.4") is None
    finally:
        store.close()


def test_a_smaller_snapshot_or_a_delete_erases_every_part(nats_server: EmbeddedNatsServer) -> None:
    """Parts left over from a bigger snapshot are erased by the next save, and all of them by delete."""
    store = _split_store(nats_server.url)
    parts = f"{store.subject(KEY)}.part"
    try:
        store.save(snap(1, data=b"x" * 450))
        assert [_stored(nats_server.url, f"{parts}.{i}") is not None for i in range(6)] == [True] * 5 + [
            False
        ]
        store.save(snap(2, data=b"y" * 150))
        assert store.load(KEY) == snap(2, data=b"y" * 150)
        assert [_stored(nats_server.url, f"{parts}.{i}") is not None for i in range(3)] == [True, True, False]
        store.save(snap(3))
        assert store.load(KEY) == snap(3)
        assert _stored(nats_server.url, f"{parts}.0") is None
        store.save(snap(4, data=b"z" * 350))
        store.delete(KEY)
        assert store.load(KEY) is None
        assert _stored(nats_server.url, f"{parts}.0") is None
    finally:
        store.close()


def test_a_split_snapshot_missing_a_part_loads_as_none(nats_server: EmbeddedNatsServer) -> None:
    """A head whose parts are gone is no snapshot (the session replays the log instead)."""
    store = _split_store(nats_server.url)
    try:
        store.save(snap(1, data=b"x" * 250))
        connection = NatsConnection.connect(nats_server.url)
        try:

            async def erase() -> None:
                part = await connection.get_message(
                    "KV_CONVMEM_SNAPSHOTS", {"last_by_subj": f"{store.subject(KEY)}.part.1"}
                )
                assert part is not None
                await connection.api("$JS.API.STREAM.MSG.DELETE.KV_CONVMEM_SNAPSHOTS", {"seq": part.seq})

            connection.call(erase, what="erase a part")
        finally:
            connection.close()
        assert store.load(KEY) is None
    finally:
        store.close()


def test_a_bad_part_size_is_refused(nats_server: EmbeddedNatsServer) -> None:
    """`part_bytes` must be a positive number of bytes."""
    connection = NatsConnection.connect(nats_server.url)
    try:
        with pytest.raises(InvalidConfig, match="part_bytes"):
            JetStreamSnapshotStore(connection, part_bytes=0)
    finally:
        connection.close()


def test_parts_without_their_head_are_listed_and_deleted(nats_server: EmbeddedNatsServer) -> None:
    """A delete killed after the head and a first part leaves a gap: keys() still finds the rest, delete
    erases them."""
    store = _split_store(nats_server.url)
    parts = f"{store.subject(KEY)}.part"
    try:
        store.save(snap(1, data=b"x" * 450))
        connection = NatsConnection.connect(nats_server.url)
        try:

            async def erase_head_and_first_part() -> None:
                for subject in (store.subject(KEY), f"{parts}.0"):
                    stored = await connection.get_message("KV_CONVMEM_SNAPSHOTS", {"last_by_subj": subject})
                    assert stored is not None
                    await connection.api(
                        "$JS.API.STREAM.MSG.DELETE.KV_CONVMEM_SNAPSHOTS", {"seq": stored.seq}
                    )

            connection.call(erase_head_and_first_part, what="erase the head and part 0")
        finally:
            connection.close()
        assert store.load(KEY) is None
        assert store.keys(tenant_id="acme", user_id="alice") == [KEY]
        store.delete(KEY)
        assert [_stored(nats_server.url, f"{parts}.{i}") for i in range(5)] == [None] * 5
        assert store.keys() == []
    finally:
        store.close()
