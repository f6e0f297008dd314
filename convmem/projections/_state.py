"""The folded state of one session, and the zones a context view reads from it.

`SessionState` is immutable and holds every live turn (the turns since the
last clear, restore or erasure, within the live horizon of ``_horizon``) with
its number, so every strategy can be projected from it. Which turns are
*summarized*, *pending* or *recent* is not stored but derived from two
watermarks:

* `summary_through`: the last turn number the summary covers;
* `dropped_through`: the last turn number dropped from a DEGRADED backlog.

A turn is unsummarized when its number is above both. The recent zone is the
last `full_zone_turns` live turns; the pending zone is every unsummarized turn
before it.
"""

from __future__ import annotations

import json

import msgspec

from convmem.events import ConversationTurn, MemoryHealth, MemoryKey, ShortTermMemoryConfig, date_text
from convmem.projections._entities import EntityTable

__all__ = ["SessionState", "TurnRecord", "rendered_turn_length"]


def rendered_turn_length(turn: ConversationTurn, *, include_digest: bool, include_date: bool = False) -> int:
    """Characters of the turn in the canonical JSON rendering of a context view.

    The rendering is ``json.dumps(..., ensure_ascii=False, sort_keys=True)``,
    the one `estimate_tokens()` measures, so view lengths add up exactly. With
    `include_date`, a turn whose ``ts`` is known shows ``"date": "8 May 2023"``.
    """
    if include_date and turn.ts > 0 and (date := date_text(turn.ts)):
        # ', "date": "..."': the ASCII date, its quotes, key and separators (12 characters).
        return rendered_turn_length(turn, include_digest=include_digest) + len(date) + 12
    if not turn.artifacts_shown and (not include_digest or turn.trajectory_digest is None):
        # {"assistant": "...", "user": "..."} holds the two JSON strings in 25 characters
        # of frame, the compact array ["...","..."] in 3: measure the array, add 22.
        user, answer = turn.user_message, turn.assistant_response
        try:
            size = len(_json_encode((user, answer))) + 22
        except UnicodeEncodeError:  # a lone surrogate (no stored turn has one): json.dumps below
            pass
        else:
            if user.isascii() and answer.isascii():
                return size
            # msgspec writes UTF-8: count each character once, not once per byte.
            return size - len(user.encode()) + len(user) - len(answer.encode()) + len(answer)
    return len(json.dumps(turn.to_llm(include_digest=include_digest), ensure_ascii=False, sort_keys=True))


_json_encode = msgspec.json.Encoder().encode
"""Measures JSON strings for `rendered_turn_length`.

msgspec escapes exactly the characters `json.dumps` escapes, with escapes of
the same length, and writes every other character as its UTF-8 bytes, so its
size less the extra bytes of multi-byte characters is the length `json.dumps`
gives (``tests/test_rendered_length.py`` pins this for every code point). It is
one pass in C, where a regular-expression scan for characters to escape cost
2 ns a character.
"""


_DEFAULT_CONFIG = ShortTermMemoryConfig()
_NO_ENTITIES = EntityTable()


class TurnRecord(msgspec.Struct, frozen=True, gc=False, kw_only=True, array_like=True):
    """A stored turn with its number, the time it was stored and its rendered length."""

    index: int
    turn: ConversationTurn
    at: float
    rendered_len: int


class SessionState(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """Everything the context views need; a pure function of the session's events."""

    key: MemoryKey | None = None
    config: ShortTermMemoryConfig = _DEFAULT_CONFIG
    """Until the session starts, the default configuration: one shared immutable instance,
    so a replay from scratch does not build and validate a configuration of its own."""
    version: int = 0
    """`seq` of the last applied event (0: nothing applied)."""
    started: bool = False
    turns: tuple[TurnRecord, ...] = ()
    next_index: int = 1
    summary: str = ""
    summary_through: int = 0
    dropped_through: int = 0
    health: MemoryHealth = MemoryHealth.HEALTHY
    attempt: int = 0
    health_since: float = 0.0
    injected_summary: str | None = None
    injected_from: MemoryKey | None = None
    last_at: float = 0.0
    idempotency_keys: tuple[str, ...] = ()
    """The idempotency keys of the session's latest keyed writes, oldest first, at most
    `config.idempotency_horizon` of them (see ``_idempotency``)."""
    retired_through: int = 0
    """Turns numbered up to here left the live state past its horizon (the log keeps them)."""
    retired_entities: EntityTable = _NO_ENTITIES
    """The entity table of the turns that left the live state since the last clear."""

    # Derived zones ---------------------------------------------------------

    @property
    def watermark(self) -> int:
        """Turns numbered up to here are summarized or dropped."""
        return max(self.summary_through, self.dropped_through)

    def unsummarized(self) -> tuple[TurnRecord, ...]:
        """Live turns that no summary covers and no backlog trim dropped."""
        mark = self.watermark
        turns = self.turns
        if not turns or turns[0].index > mark:
            return turns
        lo, hi = 0, len(turns)
        while lo < hi:
            mid = (lo + hi) // 2
            if turns[mid].index <= mark:
                lo = mid + 1
            else:
                hi = mid
        return turns[lo:]

    def recent(self) -> tuple[TurnRecord, ...]:
        """The full zone: the last `full_zone_turns` live turns (none when it is 0)."""
        zone = self.config.budget.full_zone_turns
        return self.turns[-zone:] if zone else ()

    def pending(self) -> tuple[TurnRecord, ...]:
        """Unsummarized turns evicted from the full zone, oldest first."""
        zone = self.config.budget.full_zone_turns
        if len(self.turns) <= zone:
            return ()
        if not zone:
            return self.unsummarized()
        first_recent = self.turns[-zone].index
        return tuple(r for r in self.unsummarized() if r.index < first_recent)

    def turn_count(self) -> int:
        """Live turns (since the last clear)."""
        return len(self.turns)
