"""What only the JetStream adapters and the embedded server promise, on real nats-server processes."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from convmem.actors import Snapshot
from convmem.adapters import EmbeddedNatsServer, JetStreamBackend, JetStreamEventLog, JetStreamSnapshotStore
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._embedded import find_nats_server
from convmem.errors import (
    EventDecodeError,
    InvalidConfig,
    InvalidInput,
    InvalidKey,
    LogUnavailable,
    UnknownEventType,
)
from convmem.events import Event, MemoryKey, SessionCleared, decode_event

T = TypeVar("T")
KEY = MemoryKey("acme", "alice", "s1")


def event(seq: int, event_id: str | None = None) -> Event:
    return SessionCleared(
        seq=seq,
        event_id=f"ev-{seq}-{time.monotonic_ns()}" if event_id is None else event_id,
        at=1.0,
        cleared_through=0,
    )


def raw(url: str, fn: Callable[[NatsConnection], Awaitable[T]]) -> T:
    """Run `fn` on a plain connection of its own, as another program would."""
    connection = NatsConnection.connect(url)
    try:

        async def run() -> T:
            return await fn(connection)

        return connection.call(run, what="raw access")
    finally:
        connection.close()


def stream_config(url: str, name: str) -> dict[str, Any]:
    async def info(c: NatsConnection) -> dict[str, Any]:
        reply = await c.api(f"$JS.API.STREAM.INFO.{name}")
        config: dict[str, Any] = reply["config"]
        config["_consumers"] = reply["state"]["consumer_count"]
        return config

    return raw(url, info)


@pytest.fixture
def log(nats_server: EmbeddedNatsServer) -> Iterator[JetStreamEventLog]:
    handle = JetStreamEventLog.connect(nats_server.url)
    yield handle
    handle.close()


# -- streams and buckets: created when missing, checked when present ---------------------------


def test_the_stream_is_created_file_backed_with_a_long_duplicate_window(
    nats_server: EmbeddedNatsServer, log: JetStreamEventLog
) -> None:
    """The events stream keeps files, one subject pattern, a 2-minute window and atomic batches."""
    config = stream_config(nats_server.url, "CONVMEM_EVENTS")
    assert config["subjects"] == ["convmem.ev.*.*.*"]
    assert config["storage"] == "file"
    assert config["num_replicas"] == 1
    assert config["duplicate_window"] == 120 * 10**9
    assert config["allow_atomic"] is True
    assert log.subject(MemoryKey("a.b", "*", ">")) == "convmem.ev.a=2Eb.=2A.=3E"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"duplicate_window": 30 * 10**9}, "duplicate_window"),
        ({"subjects": ["convmem.ev.>"]}, "subjects"),
        ({"storage": "memory"}, "storage"),
        ({"max_age": 3600 * 10**9}, "max_age"),
    ],
)
def test_an_existing_stream_that_differs_is_refused_and_left_alone(
    nats_server: EmbeddedNatsServer, change: dict[str, Any], named: str
) -> None:
    """A stream of our name with another config is a clear error naming the field, never updated."""
    JetStreamEventLog.connect(nats_server.url, stream="EV").close()
    wanted = stream_config(nats_server.url, "EV")
    wanted.pop("_consumers")
    raw(nats_server.url, lambda c: c.api("$JS.API.STREAM.DELETE.EV"))
    raw(nats_server.url, lambda c: c.api("$JS.API.STREAM.CREATE.EV", {**wanted, **change}))
    with pytest.raises(InvalidConfig, match=named) as caught:
        JetStreamEventLog.connect(nats_server.url, stream="EV")
    assert "never changes" in str(caught.value)
    found = stream_config(nats_server.url, "EV")
    assert all(found[field] == value for field, value in change.items())


def test_a_matching_existing_stream_is_reused(nats_server: EmbeddedNatsServer) -> None:
    """Connecting again to a stream convmem made finds the same events."""
    with JetStreamBackend.connect(nats_server.url) as first:
        first.log.append(KEY, [event(1)], expected_seq=0)
    with JetStreamBackend.connect(nats_server.url) as second:
        assert [r.seq for r in second.log.read(KEY)] == [1]


def test_a_prefix_overlapping_another_stream_is_refused(nats_server: EmbeddedNatsServer) -> None:
    """Subjects another stream already captures are a configuration error."""
    raw(
        nats_server.url,
        lambda c: c.api("$JS.API.STREAM.CREATE.OTHER", {"name": "OTHER", "subjects": ["convmem.>"]}),
    )
    with pytest.raises(InvalidConfig, match="overlap"):
        JetStreamEventLog.connect(nats_server.url)


def test_an_existing_bucket_that_differs_is_refused(nats_server: EmbeddedNatsServer) -> None:
    """A bucket of other settings (a history of 5) is a configuration error, never changed."""
    raw(nats_server.url, lambda c: c.js.create_key_value(bucket="CONVMEM_SNAPSHOTS", history=5))
    with pytest.raises(InvalidConfig, match="max_msgs_per_subject is 5"):
        JetStreamSnapshotStore.connect(nats_server.url)
    info = raw(nats_server.url, lambda c: c.api("$JS.API.STREAM.INFO.KV_CONVMEM_SNAPSHOTS"))
    assert info["config"]["max_msgs_per_subject"] == 5


def test_an_earlier_convmem_bucket_that_denies_deletes_is_replaced(nats_server: EmbeddedNatsServer) -> None:
    """The bucket an earlier convmem made with nats' KV API (deletes denied) is made anew, deletable."""
    raw(nats_server.url, lambda c: c.js.create_key_value(bucket="CONVMEM_SNAPSHOTS"))
    store = JetStreamSnapshotStore.connect(nats_server.url)
    try:
        snapshot = Snapshot(key=KEY, seq=1, state_hash="h", data=b"state")
        store.save(snapshot)
        assert store.load(KEY) == snapshot
        store.delete(KEY)
        assert store.load(KEY) is None
    finally:
        store.close()
    info = raw(nats_server.url, lambda c: c.api("$JS.API.STREAM.INFO.KV_CONVMEM_SNAPSHOTS"))
    assert info["config"].get("deny_delete", False) is False


@pytest.mark.parametrize(
    "options", [{"stream": "a.b"}, {"stream": "A B"}, {"prefix": "a.*"}, {"prefix": "a..b"}, {"replicas": 0}]
)
def test_bad_names_and_settings_are_refused(nats_server: EmbeddedNatsServer, options: dict[str, Any]) -> None:
    """Stream names and prefixes that NATS would misread are refused up front."""
    with pytest.raises(InvalidConfig):
        JetStreamEventLog.connect(nats_server.url, **options)


# -- appends -------------------------------------------------------------------------------------


def test_a_retry_answered_with_wrong_last_sequence_is_not_a_conflict(
    nats_server: EmbeddedNatsServer, log: JetStreamEventLog
) -> None:
    """When our first attempt was stored but its ack lost, the retry's refusal is recognised as ours."""
    log.append(KEY, [event(1)], expected_seq=0)
    last_position = log.read(KEY)[-1].position
    retried = event(2, "retried-once")
    headers = {
        "Nats-Msg-Id": retried.event_id,
        "Nats-Expected-Last-Subject-Sequence": str(last_position),
        "Convmem-Seq": "2",
    }

    async def publish_twice(c: NatsConnection) -> list[dict[str, Any]]:
        replies = []
        for _ in range(2):  # the same message id with the same expectation, as a retry sends it
            reply = await c.nc.request(log.subject(KEY), b"first attempt", headers=dict(headers))
            replies.append(json.loads(reply.data))
        return replies

    first, second = raw(nats_server.url, publish_twice)
    assert "error" not in first
    assert second["error"]["err_code"] == 10071  # "wrong last sequence", not "duplicate"
    assert log.append(KEY, [retried], expected_seq=1) == 2  # our cache still expects the old message
    records = log.read(KEY)
    assert [(r.seq, r.event_id) for r in records] == [(1, records[0].event_id), (2, "retried-once")]


@pytest.mark.parametrize("event_id", ["", " padded", "padded ", "two\nlines", "nul\x00"])
def test_event_ids_that_cannot_travel_as_a_header_are_refused(log: JetStreamEventLog, event_id: str) -> None:
    """An event id NATS would strip or split (it is the Nats-Msg-Id header) is refused, nothing stored."""
    with pytest.raises(InvalidInput, match="event_id"):
        log.append(KEY, [event(1, event_id)], expected_seq=0)
    assert log.read(KEY) == []


def test_ids_too_long_for_the_servers_control_line_are_refused_before_sending(
    nats_server: EmbeddedNatsServer, log: JetStreamEventLog
) -> None:
    """A subject the server would drop the connection for is refused up front; the log stays usable."""
    longest = MemoryKey("🙂" * 256, "🙂" * 256, "🙂" * 256)
    with pytest.raises(InvalidKey, match="max_control_line"):
        log.append(longest, [event(1)], expected_seq=0)
    assert log.append(KEY, [event(1)], expected_seq=0) == 1
    roomy = JetStreamEventLog.connect(nats_server.url, max_control_line=nats_server.max_control_line)
    try:
        assert roomy.append(longest, [event(1)], expected_seq=0) == 1
        assert [r.key for r in roomy.read_all()] == [KEY, longest]
    finally:
        roomy.close()


# -- reads ---------------------------------------------------------------------------------------


def test_poison_published_straight_to_a_session_is_read_with_its_position(
    nats_server: EmbeddedNatsServer, log: JetStreamEventLog
) -> None:
    """Non-events and events from the future come back as records; decoding is the reader's job."""
    log.append(KEY, [event(1)], expected_seq=0)
    future = msgspec.msgpack.encode({"type": "from.the.future", "seq": 2, "event_id": "f", "at": 1.0})

    async def publish(c: NatsConnection) -> None:
        await c.js.publish(log.subject(KEY), b"\x00garbage")
        await c.js.publish(log.subject(KEY), future, headers={"Convmem-Seq": "2"})
        await c.js.publish(log.subject(KEY), b"\x00more garbage")

    raw(nats_server.url, publish)
    records = log.read(KEY)
    assert [r.seq for r in records] == [1, None, 2, None]
    assert [r.position for r in records] == [1, 2, 3, 4]
    assert records[1].data == b"\x00garbage"
    with pytest.raises(EventDecodeError):
        decode_event(records[1].data, seq=records[1].position)
    with pytest.raises(UnknownEventType):
        decode_event(records[2].data)
    assert list(log.read_all()) == records
    assert log.last_seq(KEY) == 2
    assert log.append(KEY, [event(3)], expected_seq=2) == 3


def test_read_all_crosses_batch_boundaries(nats_server: EmbeddedNatsServer) -> None:
    """Reading in small batches returns the same events as one read, stopping inside a batch when asked."""
    connection = NatsConnection.connect(nats_server.url)
    log = JetStreamEventLog(connection, read_batch=3)
    connection.release()  # the log holds the connection now
    try:
        keys = [MemoryKey("t", f"u{i % 2}", f"s{i}") for i in range(5)]
        for seq in range(1, 5):
            for key in keys:
                log.append(key, [event(seq)], expected_seq=seq - 1)
        every = list(log.read_all())
        assert [r.position for r in every] == list(range(1, 21))
        assert [r.position for r in log.read_all(until_position=10)] == list(range(1, 11))
        assert [r.key for r in log.read_all(tenant_id="t", user_id="u1")] == [
            k for _ in range(4) for k in keys if k.user_id == "u1"
        ]
        assert all(log.read(k) == [r for r in every if r.key == k] for k in keys)
    finally:
        log.close()


def test_reads_leave_no_consumer_on_the_server(
    nats_server: EmbeddedNatsServer, log: JetStreamEventLog
) -> None:
    """Session reads and audits use direct gets: nothing is left behind on the stream."""
    log.append(KEY, [event(1)], expected_seq=0)
    log.read(KEY)
    list(log.read_all())
    log.keys()
    assert stream_config(nats_server.url, "CONVMEM_EVENTS")["_consumers"] == 0


# -- connecting ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_an_unreachable_server_fails_fast_with_log_unavailable() -> None:
    """Nothing listening at the URL: LogUnavailable within moments, saying what to do."""
    started = time.monotonic()
    with pytest.raises(LogUnavailable, match="nats-server"):
        JetStreamEventLog.connect(f"nats://127.0.0.1:{free_port()}", timeout=5.0)
    assert time.monotonic() - started < 3.0


def test_a_server_without_jetstream_is_reported(tmp_path: Path) -> None:
    """A plain NATS server (no -js) is a clear error about JetStream."""
    port = free_port()
    proc = subprocess.Popen(
        [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # wait for the listener; waiting on the process is the pause
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "plain nats-server did not start"
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.02)
        with pytest.raises(LogUnavailable, match="JetStream"):
            JetStreamEventLog.connect(f"nats://127.0.0.1:{port}", timeout=2.0)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- the embedded server -------------------------------------------------------------------------


def test_the_embedded_server_keeps_events_across_restarts(tmp_path: Path) -> None:
    """Stopped (or killed) and started again on its store, the server still has every event."""
    server = EmbeddedNatsServer(tmp_path / "store").start()
    try:
        with JetStreamBackend.connect(server.url) as backend:
            backend.log.append(KEY, [event(1), event(2)], expected_seq=0)
        server.stop()
        assert not server.running
        server.start()
        with JetStreamBackend.connect(server.url) as backend:
            backend.log.append(KEY, [event(3)], expected_seq=2)
        server.kill()
        server.start()
        with JetStreamBackend.connect(server.url) as backend:
            assert [r.seq for r in backend.log.read(KEY)] == [1, 2, 3]
    finally:
        server.stop()


def test_a_connected_log_rides_out_a_server_restart(nats_server: EmbeddedNatsServer) -> None:
    """Appends fail with LogUnavailable while the server is down and go on once it is back."""
    log = JetStreamEventLog.connect(nats_server.url, timeout=1.0)
    try:
        log.append(KEY, [event(1)], expected_seq=0)
        port = nats_server.port
        nats_server.kill()
        retried = event(2)
        with pytest.raises(LogUnavailable):
            log.append(KEY, [retried], expected_seq=1)
        nats_server.start()
        assert nats_server.port == port
        deadline = time.monotonic() + 20
        while True:  # each attempt waits up to the log's timeout: no sleeping here
            try:
                assert log.append(KEY, [retried], expected_seq=1) == 2
                break
            except LogUnavailable:
                assert time.monotonic() < deadline, "the log never reconnected"
        assert [r.event_id for r in log.read(KEY)][1:] == [retried.event_id]
    finally:
        log.close()


def test_closing_stops_the_loop_thread_even_with_the_server_gone(nats_server: EmbeddedNatsServer) -> None:
    """close() returns at once and leaves no thread behind when the server has died."""
    before = set(threading.enumerate())
    log = JetStreamEventLog.connect(nats_server.url, timeout=2.0)
    [loop] = [t for t in threading.enumerate() if t not in before]
    nats_server.kill()
    started = time.monotonic()
    log.close()
    assert time.monotonic() - started < 2.0
    assert not loop.is_alive()


def test_two_servers_never_share_a_store(nats_server: EmbeddedNatsServer) -> None:
    """A second server on a store in use is refused, naming the server that holds it."""
    with pytest.raises(LogUnavailable, match=f"in use by another nats-server \\(pid {nats_server.pid}\\)"):
        EmbeddedNatsServer(nats_server.store_dir).start()
    assert nats_server.running


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    """No nats-server where we were told to look: LogUnavailable naming the path."""
    with pytest.raises(LogUnavailable, match="missing"):
        EmbeddedNatsServer(tmp_path / "store", binary=tmp_path / "nats-server").start()


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    """A server that exits at start-up is reported with the end of its log."""
    with pytest.raises(LogUnavailable, match="sync"):
        EmbeddedNatsServer(tmp_path / "store", sync_interval="not-a-duration").start()


def test_the_embedded_backend_stops_its_server_on_close(tmp_path: Path) -> None:
    """JetStreamBackend.embedded owns its server: closing the backend stops it."""
    backend = JetStreamBackend.embedded(tmp_path / "store")
    server = backend.server
    assert server is not None
    try:
        assert server.running
        backend.log.append(KEY, [event(1)], expected_seq=0)
    finally:
        backend.close()
    assert not server.running
