"""The `EventLog` contract (`convmem.testing.EventLogContract`), kept by the in-memory and the JetStream log.

`open_log()` gives another handle on the same log: the same object in
memory, a second connection (another process, in effect) on JetStream.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from convmem.actors import EventLog
from convmem.adapters import EmbeddedNatsServer, JetStreamEventLog
from convmem.testing import EventLogContract, InMemoryEventLog, OpenLog
from convmem.testing._log_contract import KEY, events


class TestInMemoryLog(EventLogContract):
    @pytest.fixture
    def open_log(self) -> Iterator[OpenLog]:
        """Handles on one fresh in-memory log: the same object each time."""
        shared = InMemoryEventLog()
        yield lambda: shared
        shared.close()


class TestJetStreamLog(EventLogContract):
    @pytest.fixture
    def open_log(self, nats_server: EmbeddedNatsServer) -> Iterator[OpenLog]:
        """Handles on the test server's log: a connection each."""
        handles: list[EventLog] = []

        def open_jetstream() -> EventLog:
            handles.append(JetStreamEventLog.connect(nats_server.url, timeout=10.0))
            return handles[-1]

        yield open_jetstream
        for handle in handles:
            handle.close()


@pytest.fixture(params=["memory", "jetstream"])
def raw_log(request: pytest.FixtureRequest) -> Iterator[InMemoryEventLog | JetStreamEventLog]:
    """A log of either kind that can hold raw bytes (`append_raw` is no part of the `EventLog` port)."""
    log: InMemoryEventLog | JetStreamEventLog
    if request.param == "memory":
        log = InMemoryEventLog()
    else:
        log = JetStreamEventLog.connect(request.getfixturevalue("nats_server").url, timeout=10.0)
    yield log
    log.close()


def test_raw_bytes_are_read_back_with_their_position(raw_log: InMemoryEventLog | JetStreamEventLog) -> None:
    """Bytes that are no event come back as they are, with a position; appends go on around them."""
    log = raw_log
    log.append(KEY, events(1), expected_seq=0)
    position = log.append_raw(KEY, b"\xffnot an event")
    assert log.last_seq(KEY) == 1
    assert log.append(KEY, events(2), expected_seq=1) == 2
    records = log.read(KEY)
    assert [(r.seq, r.data) for r in records][1] == (None, b"\xffnot an event")
    assert (records[1].position, records[1].event_id) == (position, None)
    assert [r.seq for r in records] == [1, None, 2]
    assert [r.position for r in log.read_all()] == [r.position for r in records]
