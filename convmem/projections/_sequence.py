"""Which stored messages of a session's subject are its events: one rule for every reader and writer.

A session's version is the seq of its last event. The fold (`load_state`,
the audits) and every log's writer (the JetStream writer's conditional
appends, the in-memory log's checks) count it with this one rule, so they
can never disagree about it: a disagreement would block the session's
writes for good (the writer expecting one seq, the fold deciding after
another) or make a valid event vanish (the fold taking another message's
place for it).

Walking the subject in log order, a message is the session's next event when
its ``Convmem-Seq`` header (`LoggedEvent.seq`, what the writer stored beside
the bytes) is the version plus one, whatever its bytes hold (an event of a
newer version, or bytes that do not decode, still take that seq: the fold
reports and skips them). Erasure may open a history above that: a
`SessionErased` fence at any higher seq, and a `SessionStarted` at any seq
while the session has no event, when they decode and their own seq agrees
with the header; so may retention's `HistoryCompacted` at any higher seq
(the events before it were dropped).

A `SessionRepaired` (an operator's repair of a damaged session) may open a
history at any higher seq too, as a fence does.

An *intact* message (its ``Convmem-Sum`` checksum matched: convmem wrote it and
it is intact) whose seq skips seqs is taken as well: the seqs it skips are
missing (the store lost them), which `gap` tells the reader, who reports the
session as damaged. Writers and readers count such a session alike, so the
repair lands above everything stored.

Any other message does not fit: it has no header (convmem did not write it),
its seq is not above the version (rewound), or it skips seqs without a matching checksum. It
stays where it is, the version does not move, and the readers report it with
its session and position.
"""

from __future__ import annotations

from convmem.errors import EventDecodeError
from convmem.events import (
    AnyEvent,
    HistoryCompacted,
    MemoryKey,
    SessionErased,
    SessionRepaired,
    SessionStarted,
    decode_event,
)

__all__ = ["SessionSequence", "names_another"]


def names_another(event: AnyEvent, key: MemoryKey) -> str | None:
    """Why `event`, stored in `key`'s session, is not its own: a start or a compaction that names
    another session (convmem writes a session's own key there, a fork's copies included, so a
    stranger wrote it); None for any other event. It holds its seq, as any event that fits and
    does not fold."""
    if isinstance(event, SessionStarted | HistoryCompacted) and event.key != key:
        return f"it names session {event.key}, not {key}"
    return None


class SessionSequence:
    """The version of one session while its stored messages are walked in log order."""

    __slots__ = ("gap", "version")

    def __init__(self, version: int = 0) -> None:
        self.version = version
        """The seq of the last message taken as the session's event (0: none yet)."""
        self.gap: tuple[int, int] | None = None
        """The seqs (first, last) that the message just taken skipped: events the store lost."""

    def take(self, seq: int | None, data: bytes, *, intact: bool = False) -> str | None:
        """The next stored message: None when it is the session's next event (the version moves to
        `seq`), else why it does not fit the session (the version stays).

        `intact`: the message's checksum matched (see the module's docstring).
        """
        version = self.version
        if self.gap is not None:
            self.gap = None
        if seq is None:
            return "it has no Convmem-Seq header (convmem did not write it)"
        if seq == version + 1:
            self.version = seq
            return None
        if seq <= version:
            return f"its seq {seq} is not above the session's seq {version} (rewound)"
        try:
            event = decode_event(data)
        except EventDecodeError:
            event = None
        if (
            event is not None
            and event.seq == seq
            and (
                isinstance(event, SessionErased | HistoryCompacted | SessionRepaired)
                or (version == 0 and isinstance(event, SessionStarted))
            )
        ):
            self.version = seq
            return None
        if intact:
            self.gap = (version + 1, seq - 1)
            self.version = seq
            return None
        return f"its seq {seq} skips {seq - version - 1} seq(s) after the session's seq {version}"
