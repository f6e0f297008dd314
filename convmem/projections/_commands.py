"""What a decision takes in: the commands, and the ids that its events get.

A command is a frozen struct saying what a caller (or the summarizer pool)
asks of a session; `decide` turns it into events. `EventIds` numbers the
events of one decision so that a retried command's events get the same ids.
"""

from __future__ import annotations

import msgspec

from convmem.events import ConversationTurn, MemoryKey, MessageItem, ShortTermMemoryConfig
from convmem.projections._health import SummaryRequest

__all__ = [
    "AddItems",
    "AddTurn",
    "AdoptTurns",
    "Clear",
    "Command",
    "EventIds",
    "PopItem",
    "Restore",
    "StartSession",
    "SummaryFailed",
    "SummarySucceeded",
]


class StartSession(msgspec.Struct, frozen=True, kw_only=True):
    """Open a session explicitly (the first other command opens it implicitly)."""

    key: MemoryKey
    config: ShortTermMemoryConfig
    injected_summary: str | None = None
    injected_from: MemoryKey | None = None


class AddTurn(msgspec.Struct, frozen=True, kw_only=True):
    """Store a completed turn."""

    turn: ConversationTurn


class AddItems(msgspec.Struct, frozen=True, kw_only=True):
    """Store agent items as they arrive (see `ItemsAdded`)."""

    items: tuple[MessageItem, ...]


class PopItem(msgspec.Struct, frozen=True, kw_only=True):
    """Remove the session's last item (nothing happens on an empty session)."""


class Clear(msgspec.Struct, frozen=True, kw_only=True):
    """Forget the session's turns and summary (they stay in the log).

    `moved_to` records that the turns were moved to that session (the end of a move);
    `through` refuses the clear (`InvalidInput`) when the session holds turns numbered
    above it, i.e. turns that arrived after the mover read the session.
    """

    reason: str = "cleared by caller"
    moved_to: MemoryKey | None = None
    through: int | None = None
    config: ShortTermMemoryConfig | None = None
    """Run with this configuration from the clear on (None: keep the session's)."""


class AdoptTurns(msgspec.Struct, frozen=True, kw_only=True):
    """Append turns moved here from `source` (its events up to `source_seq`); see `TurnsAdopted`."""

    source: MemoryKey
    source_seq: int
    turns: tuple[ConversationTurn, ...]


class Restore(msgspec.Struct, frozen=True, kw_only=True):
    """Replace the session's content with a `to_dict()` export's (see `parse_export`).

    A restored session starts HEALTHY: its pending turns are summarized afresh.
    """

    summary: str
    turns: tuple[ConversationTurn, ...]
    origin: str = ""


class SummarySucceeded(msgspec.Struct, frozen=True, kw_only=True):
    """The summarizer answered `request` with `summary` (not yet validated)."""

    request: SummaryRequest
    summary: str


class SummaryFailed(msgspec.Struct, frozen=True, kw_only=True):
    """The summarizer failed on `request` (exception, timeout, bad output)."""

    request: SummaryRequest
    reason: str


Command = (
    StartSession
    | AddTurn
    | AddItems
    | PopItem
    | Clear
    | Restore
    | AdoptTurns
    | SummarySucceeded
    | SummaryFailed
)


class EventIds:
    """Event ids and seqs for one decision: ``{command_id}/{tag}/{k}``, seqs after `version`."""

    def __init__(self, command_id: str, version: int) -> None:
        self._command_id = command_id
        self._n = 0
        self._kinds: dict[str, int] = {}
        self.seq = version

    def mark(self) -> tuple[int, int, dict[str, int]]:
        return self._n, self.seq, dict(self._kinds)

    def reset(self, mark: tuple[int, int, dict[str, int]]) -> None:
        self._n, self.seq, kinds = mark
        self._kinds = dict(kinds)

    def next(self, tag: str) -> tuple[int, str]:
        """The next seq, and an id naming the event's kind: a retried command's events
        get the same ids kind by kind, even when the retry decides fewer events."""
        self._n += 1
        self.seq += 1
        self._kinds[tag] = self._kinds.get(tag, 0) + 1
        return self.seq, f"{self._command_id}/{tag}/{self._kinds[tag]}"
