"""How many bytes a tenant's events take in the stream, counted the way JetStream counts them.

A file-store message takes ``34 + subject + headers + payload`` bytes when it
has headers (22 bytes of record head, 4 of header length, 8 of checksum), the
measure of the stream's ``bytes`` and of its ``max_bytes``. The count reads
the tenant's messages with batched direct gets (the reads' own permission,
no consumer left on the server), from a stream position on, so a tally can
be brought up to date by reading only what was appended since.
"""

from __future__ import annotations

from convmem.adapters.backends.jetstream._connection import NatsConnection, StoredMessage
from convmem.adapters.backends.jetstream._read import fetch_batch

__all__ = ["count_bytes", "stored_size"]

_RECORD = 34
"""Bytes a file-store message with headers takes besides its subject, headers and payload."""
_ADDED_BY_GET = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Nats-UpTo-Sequence",
    }
)
"""Headers a direct get adds to the stored message (not part of what is stored)."""
_STATUS_LINE = len(b"NATS/1.0\r\n")


def stored_size(message: StoredMessage) -> int:
    """The bytes `message` takes in a file store (its headers as stored, without the direct get's)."""
    headers = [(k, v) for k, v in message.headers.items() if k not in _ADDED_BY_GET]
    header_bytes = _STATUS_LINE + sum(len(k) + len(v) + 4 for k, v in headers) + 2 if headers else 0
    record = _RECORD if headers else _RECORD - 4
    return record + len(message.subject.encode()) + header_bytes + len(message.data)


async def count_bytes(
    conn: NatsConnection, stream: str, subject_filter: str, *, after: int = 0, batch: int = 2048
) -> tuple[int, int, bool]:
    """One batch of a count: (bytes of the messages on `subject_filter` past stream position `after`,
    the last position read (`after` when none), whether no message is left past it)."""
    got = await fetch_batch(conn, stream, subject_filter, start=after + 1, batch=batch)
    total = sum(stored_size(message) for message in got.messages)
    last = max((message.seq for message in got.messages), default=after)
    return total, max(last, after), got.pending == 0 or not got.messages
