"""The JetStream writer remembers the last message of the sessions it wrote most recently, so that a
write to one of them publishes at once (a forgotten one costs a request to the stream's leader first)."""

from __future__ import annotations

from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.backends.jetstream._appends import RECENT_SESSIONS, Last
from convmem.adapters.backends.jetstream._connection import NatsConnection
from convmem.adapters.backends.jetstream._write import SessionWriter


def test_a_writer_remembers_the_last_message_of_its_recent_sessions(nats_server: EmbeddedNatsServer) -> None:
    """Tens of thousands of sessions written in turn (a service's round robin) stay known: every one
    of the newest `RECENT_SESSIONS` keeps its last message; the oldest beyond them is forgotten, and a
    session written again moves to the newest."""
    connection = NatsConnection.connect(nats_server.url)
    try:
        writer = SessionWriter(connection, "CONVMEM_EVENTS")
        subjects = [f"convmem.ev.acme.u{n % 97}.s{n}" for n in range(RECENT_SESSIONS + 2)]
        assert RECENT_SESSIONS >= 50_000  # a service writing to 10,000 sessions in turn pays no lookup
        for n, subject in enumerate(subjects[:-2]):
            writer.remember(subject, Last(n + 1, 2 * n + 1, f"e{n}"))
        writer.remember(subjects[0], Last(7, RECENT_SESSIONS * 4, "again"))  # written again: newest now
        for n, subject in enumerate(subjects[-2:]):
            writer.remember(subject, Last(1, RECENT_SESSIONS * 4 + n + 1, f"late{n}"))
        assert writer.known(subjects[0]) == Last(7, RECENT_SESSIONS * 4, "again")
        assert writer.known(subjects[1]) is None  # the two oldest left for the two newest
        assert writer.known(subjects[2]) is None
        assert writer.known(subjects[3]) == Last(4, 7, "e3")
        assert writer.known(subjects[-1]) == Last(1, RECENT_SESSIONS * 4 + 2, "late1")
        assert sum(writer.known(s) is not None for s in subjects) == RECENT_SESSIONS
    finally:
        connection.close()
