"""The events of a session: everything a replay needs, nothing it must recompute.

Every event carries

* `seq`: its position in the session's own history, 1-based and gapless; a
  fold ignores an event whose `seq` it already applied, so redelivery is
  harmless, and refuses a gap;
* `event_id`: a caller-supplied unique id (the log's message id, so a retried
  append is stored once);
* `at`: epoch seconds from the injected clock.

Turn numbers (`TurnAdded.index`) count every turn the session ever stored, so
a `SummaryProduced` can name the exact range it covers and a clear never
reuses a number.
"""

from __future__ import annotations

import math

import msgspec

from convmem.errors import InvalidInput
from convmem.events._config import MemoryHealth, ShortTermMemoryConfig
from convmem.events._key import MemoryKey
from convmem.events._turn import ConversationTurn, MessageItem

__all__ = [
    "BacklogTrimmed",
    "EntityTally",
    "Event",
    "HealthChanged",
    "HistoryCompacted",
    "ItemPopped",
    "ItemsAdded",
    "KeptTurn",
    "SessionCleared",
    "SessionErased",
    "SessionRepaired",
    "SessionRestored",
    "SessionStarted",
    "SummaryProduced",
    "TurnAdded",
    "TurnsAdopted",
]

_INF = math.inf
_NEG_INF = -math.inf


class Event(msgspec.Struct, frozen=True, gc=False, kw_only=True, tag_field="type", omit_defaults=True):
    """Base of every event; subclasses set a stable domain tag.

    Events, turns and states are immutable trees that never form reference
    cycles, so they are not tracked by the cycle collector (``gc=False``):
    full collections stay short however many turns are live.
    """

    seq: int
    event_id: str
    at: float

    def __post_init__(self) -> None:
        # Every event decoded from the log runs this: an int seq >= 1 and a finite
        # float time (what the decoder gives for a valid event) pass without a call.
        seq, at = self.seq, self.at
        if type(seq) is int and seq >= 1 and type(at) is float and _NEG_INF < at < _INF:
            return
        if isinstance(self.seq, bool) or self.seq < 1:
            raise InvalidInput("seq", f"must be an integer >= 1, got {self.seq!r}")
        if isinstance(self.at, int):  # an int time encodes differently from the equal float
            msgspec.structs.force_setattr(self, "at", float(self.at))
        if not math.isfinite(self.at):  # JSON cannot carry NaN or infinity back
            raise InvalidInput("at", f"must be a finite epoch time, got {self.at!r}")


class SessionStarted(Event, frozen=True, gc=False, tag="session.started"):
    """The session's first event: its key and the configuration it runs with.

    When cross-session injection is on, the summary offered from the user's
    latest other session is recorded here, so a replay shows what was injected.
    A session forked from another (`MemorySystem.fork`) names its source in
    `forked_from` and the source's log position it was copied as of in
    `forked_at`; the source's events up to there follow it, copied.
    """

    key: MemoryKey
    config: ShortTermMemoryConfig
    injected_summary: str | None = None
    injected_from: MemoryKey | None = None
    forked_from: MemoryKey | None = None
    forked_at: int | None = None


class TurnAdded(Event, frozen=True, gc=False, tag="turn.added"):
    """A planner stored a completed turn; `index` is the turn's number in the session."""

    index: int
    turn: ConversationTurn


class SummaryProduced(Event, frozen=True, gc=False, tag="summary.produced"):
    """A summarizer's accepted output: the summary of turns `covers_from..covers_through`.

    The summary replaces the previous one (it was made from it), and only the
    turns in the covered range leave the pending zone.
    """

    summary: str
    covers_from: int
    covers_through: int


class HealthChanged(Event, frozen=True, gc=False, tag="health.changed"):
    """A transition of the health machine, with why and which attempt it was."""

    old: MemoryHealth
    new: MemoryHealth
    reason: str
    attempt: int = 0


class BacklogTrimmed(Event, frozen=True, gc=False, tag="backlog.trimmed"):
    """In DEGRADED, the unsummarized backlog went over its limit: turns up to
    `dropped_through` leave the context (they stay in the log)."""

    dropped_through: int
    reason: str = ""


class SessionCleared(Event, frozen=True, gc=False, tag="session.cleared"):
    """The session was cleared: every turn up to `cleared_through` and the summary leave the context.

    `moved_to` names the session its turns were moved to (a `TurnsAdopted`
    there names this one back), when the clear ends a move.
    """

    cleared_through: int
    reason: str = ""
    moved_to: MemoryKey | None = None
    config: ShortTermMemoryConfig | None = None
    """The configuration the session runs with from here (None: unchanged). A clear that starts a
    new generation (a PenguiFlow state store that holds no memory for the key) records the
    configuration of the memory that started it."""


class SessionRestored(Event, frozen=True, gc=False, tag="session.restored"):
    """State imported from `to_dict()` output: the previous content is replaced.

    The restored turns get the numbers `first_index`, `first_index + 1`, ...;
    none is covered by `summary`, which stands for turns the import did not carry.
    """

    summary: str
    turns: tuple[ConversationTurn, ...]
    first_index: int
    origin: str = ""
    """Where the state came from, when not from a caller's `from_dict` (e.g. a PenguiFlow
    state store's saved memory: ``penguiflow-state:sha256:<digest of the state>``)."""


class TurnsAdopted(Event, frozen=True, gc=False, tag="turns.adopted"):
    """Turns moved here from `source`, the session that held them before this key was known.

    The turns are appended after this session's own, numbered from
    `first_index`, and are unsummarized here. `source_seq` is the last event
    of `source` the move covers; `source` then records a `SessionCleared`
    with ``moved_to`` naming this session. A replay of either side shows the
    move; nothing is lost if the process stops between the two.
    """

    source: MemoryKey
    source_seq: int
    turns: tuple[ConversationTurn, ...]
    first_index: int


class SessionErased(Event, frozen=True, gc=False, tag="session.erased"):
    """Tombstone left where a session's events were purged (erasure of personal data).

    It may open a history at any `seq`: the events before it no longer exist.
    Its `seq` stays above every erased event's, so a stale writer that still
    expects the old last sequence conflicts instead of writing them back.
    """

    reason: str = ""


class SessionRepaired(Event, frozen=True, gc=False, tag="session.repaired"):
    """An operator repaired a damaged session (`convmem repair`): its state is `state` from here on.

    `state` is the session's state as restored, encoded as a snapshot is
    (the newest snapshot that passed its checks, or the replay of the events
    up to the last good one); the fold takes it whole, so a replay is exact
    whatever damaged records lie before this event. Like a `SessionErased`
    fence it may open at any seq above the session's. `method` is
    ``"snapshot"`` or ``"cut"``, `restored_seq` the seq the restored state
    stood at, `damage` what was found damaged or missing, `unreadable` how
    many stored messages the store held but could not read when repaired
    (they stay counted, not reported again).
    """

    state: bytes
    method: str
    restored_seq: int
    damage: tuple[str, ...] = ()
    unreadable: int = 0
    reason: str = ""


class ItemsAdded(Event, frozen=True, gc=False, tag="items.added"):
    """Agent items stored as they arrived (an OpenAI-Agents session's `add_items`).

    A user message item opens a new turn (numbered from `first_index` on);
    every other item joins the session's last turn.
    """

    items: tuple[MessageItem, ...]
    first_index: int


class ItemPopped(Event, frozen=True, gc=False, tag="item.popped"):
    """The session's last item was removed (an OpenAI-Agents session's `pop_item`).

    A turn left without items leaves the context; its number is not reused.
    `item` is the item removed, as it was.
    """

    item: MessageItem


def _as_time(holder: msgspec.Struct, name: str) -> None:
    """`holder.name` as a finite float (an int time encodes differently from the equal float)."""
    value = getattr(holder, name)
    if isinstance(value, int) and not isinstance(value, bool):
        msgspec.structs.force_setattr(holder, name, float(value))
    elif not (isinstance(value, float) and math.isfinite(value)):
        raise InvalidInput(name, f"must be a finite epoch time, got {value!r}")


class KeptTurn(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A turn a `HistoryCompacted` keeps: its number, when it was stored, the turn."""

    index: int
    at: float
    turn: ConversationTurn

    def __post_init__(self) -> None:
        _as_time(self, "at")


class EntityTally(msgspec.Struct, frozen=True, gc=False, kw_only=True, omit_defaults=True):
    """One entity of the entity memory's table, as a `HistoryCompacted` carries it."""

    name: str
    kind: str | None = None
    attributes: dict[str, str] = msgspec.field(default_factory=dict)
    mentions: int = 0
    last_mention: int = 0


class HistoryCompacted(Event, frozen=True, gc=False, tag="history.compacted"):
    """Retention dropped the session's events before this one; it carries what the fold needs.

    Like a snapshot written into the log: the state after it is built from its
    fields alone (`convmem.projections.evolve`), whatever came before, so a
    history may begin with it at any seq and replays exactly from there. It
    keeps the summary, the newest turns (`turns`, numbered; older ones within
    the policy's caps that the live state had retired in `history`) and every other
    part of the state (health, idempotency keys, the entity table of the turns
    that left). It is not activity: the session's `last_at` stays the time of
    its last event before it. `dropped_events` and `dropped_turns` say what
    went, for people; `reason` names the policy.
    """

    key: MemoryKey
    config: ShortTermMemoryConfig
    turns: tuple[KeptTurn, ...] = ()
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
    retired_through: int = 0
    entities: tuple[EntityTally, ...] = ()
    entity_mentions: int = 0
    dropped_events: int = 0
    dropped_turns: int = 0
    reason: str = ""
    history: tuple[KeptTurn, ...] = ()
    """Older turns the log keeps that the live state had already retired (past its live
    horizon, their entities counted in `entities`): the fold leaves them out unless it keeps
    every turn (``config.live_turns`` None, as the whole-history views fold the log)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _as_time(self, "last_at")
        _as_time(self, "health_since")

    @property
    def first_index(self) -> int:
        """The lowest turn number the log holds from here on (`next_index` when no turn is kept)."""
        kept = self.history or self.turns
        return kept[0].index if kept else self.next_index
