"""Reading a session's tail from JetStream: from the snapshot's seq on, not the whole history."""

from __future__ import annotations

from convmem.adapters import EmbeddedNatsServer, JetStreamEventLog
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._read import tail_start
from convmem.events import ConversationTurn, MemoryKey, SessionStarted, ShortTermMemoryConfig, TurnAdded

LONG = MemoryKey("acme", "ada", "long")
OTHER = MemoryKey("acme", "bob", "other")
STREAM = "CONVMEM_EVENTS"


def _history(log: JetStreamEventLog, key: MemoryKey, turns: range) -> None:
    """Turns of `key` in `turns` (the first range starts the session), one append each."""
    for n in turns:
        if n == 1:
            started = SessionStarted(
                seq=1, event_id=f"{key.session_id}-s", at=1.0, key=key, config=ShortTermMemoryConfig()
            )
            log.append(key, [started], expected_seq=0)
        turn = ConversationTurn(user_message=f"q{n}", assistant_response=f"a{n}")
        added = TurnAdded(seq=n + 1, event_id=f"{key.session_id}-{n}", at=1.0, index=n, turn=turn)
        log.append(key, [added], expected_seq=n)


def test_the_tail_starts_at_the_first_event_after_the_seq(nats_server: EmbeddedNatsServer) -> None:
    """For every seq, the tail starts after the session's event at that seq and no later than its
    next one (other sessions' events interleaved), and a read after the seq holds exactly the
    events above it."""
    log = JetStreamEventLog.connect(nats_server.url)
    try:
        for i, chunk in enumerate((range(1, 40), range(40, 90), range(90, 121))):
            _history(log, LONG, chunk)
            _history(log, OTHER, range(7 * i + 1, 7 * i + 8))
        records = log.read(LONG)
        positions = {r.seq: r.position for r in records}
        last_seq = max(positions)
        connection = NatsConnection.connect(nats_server.url)
        try:
            for after in (1, 2, 38, 39, 40, 64, 100, 119, 120):  # across the interleaved runs
                start = connection.call(lambda after=after: _start(connection, log, after), what="tail start")
                assert positions[after] < start <= positions[after + 1]  # nothing of the session between
                assert [r.seq for r in log.read(LONG, after_seq=after)] == list(
                    range(after + 1, last_seq + 1)
                )
            assert log.read(LONG, after_seq=last_seq) == []
        finally:
            connection.close()
    finally:
        log.close()


async def _start(connection: NatsConnection, log: JetStreamEventLog, after: int) -> int:
    subject = log.subject(LONG)
    last = await connection.get_message(STREAM, {"last_by_subj": subject})
    assert last is not None
    return await tail_start(connection, STREAM, subject, after, last)
