"""Retention as pure decisions: which sessions go, which histories are compacted, and to what.

* `history_facts`: what a session's stored events say beyond its state (how
  many there are, how old the oldest, the lowest turn number stored, an
  unfinished compaction);
* `plan_retention`: the action a `RetentionPolicy` asks for at `now`:
  nothing, `EraseIdle`, `Compact` or `FinishCompaction`;
* `compaction`: the `HistoryCompacted` event that keeps the summary, the
  newest turns and the rest of the state; `compacted_state` is the fold of
  that event (`evolve` calls it), so a replay that begins there rebuilds the
  very state the live session holds;
* `RetentionReport`: what a sweep did (or, dry, would do) to each session
  (`RetentionOutcome`) and the sessions it would not touch
  (`RetentionProblem`), counted and said in one line; the sweep itself, which
  reads and writes the log, is the runtime's (`convmem.actors.sweep_retention`).

The turns a compaction drops leave the state as the live horizon retires
turns (`_horizon`): their entity mentions are folded into the entity table
that stays, and `retired_through` moves past them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from convmem.errors import EventDecodeError, InvalidInput
from convmem.events import (
    AnyEvent,
    EntityTally,
    HistoryCompacted,
    KeptTurn,
    MemoryKey,
    RetentionPolicy,
    SessionErased,
    SessionRepaired,
    format_duration,
)
from convmem.projections._entities import EntityRecord, EntityTable, track_entities
from convmem.projections._horizon import bound
from convmem.projections._serial import decode_state
from convmem.projections._state import SessionState, TurnRecord, rendered_turn_length

__all__ = [
    "Compact",
    "EraseIdle",
    "FinishCompaction",
    "HistoryFacts",
    "RetentionAction",
    "compacted_state",
    "compaction",
    "history_facts",
    "plan_retention",
]

_NO_ENTITIES = EntityTable()

Action = Literal["erase", "compact", "finish"]
"""What a sweep does to a session (`RetentionOutcome.action`)."""


class HistoryFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a session's stored events say beyond its folded state."""

    events: int
    """The session's events from its latest compaction on (all of them when it has none)."""
    oldest_at: float | None
    """When the oldest stored turn or event was written (a compaction's own time does not count)."""
    first_index: int
    """The lowest turn number the log still holds."""
    unfinished: int | None = None
    """The seq of a compaction whose earlier events are still stored (its sweep was cut short)."""
    stale_events: int = 0
    """How many events come before that compaction."""
    erasure_unfinished: int = 0
    """Events still stored before an erasure fence that ends the history (an erasure cut short)."""
    first_is_fence: bool = False
    """The history opens with an erasure fence (`unfinished` is then that fence's seq)."""


class EraseIdle(msgspec.Struct, frozen=True, kw_only=True):
    """Erase the session: no event for longer than the policy's `idle`."""

    idle_for: float
    reason: str


class Compact(msgspec.Struct, frozen=True, kw_only=True):
    """Compact the session's history, keeping the summary and the turns `keep` (the live state's
    newest), and in the log the older turns `history` the live state had retired."""

    keep: tuple[TurnRecord, ...]
    history: tuple[TurnRecord, ...] = ()
    dropped_events: int
    dropped_turns: int
    reason: str


class FinishCompaction(msgspec.Struct, frozen=True, kw_only=True):
    """Delete the events stored before the compaction (or erasure fence) at `seq` that opens the
    history: a sweep stopped before it did, or a session was begun again over a fence."""

    seq: int
    dropped_events: int
    reason: str = "finishing a compaction whose earlier events are still stored"


RetentionAction = EraseIdle | Compact | FinishCompaction


def history_facts(events: Sequence[AnyEvent]) -> HistoryFacts:
    """The facts of one session's decoded events, in order (see `HistoryFacts`).

    The history counted starts at the latest event that opens one: a
    compaction, an erasure fence (after it), or an operator's repair (whose
    restored state holds the turns it kept).
    """
    opening = 0
    for i, event in enumerate(events):
        if isinstance(event, HistoryCompacted | SessionErased | SessionRepaired):
            opening = i
    opener = events[opening] if events else None
    tail = events[opening + 1 :] if isinstance(opener, SessionErased) else events[opening:]
    unfinished = None
    if (
        opener is not None
        and opening
        and (isinstance(opener, HistoryCompacted) or (isinstance(opener, SessionErased) and tail))
    ):
        unfinished = opener.seq
    first_index = 1
    oldest: float | None = None
    for n, event in enumerate(tail):
        times: list[float]
        if isinstance(event, HistoryCompacted):
            times = [t.at for t in (*event.history, *event.turns)]
            first_index = event.first_index if n == 0 else first_index
        elif isinstance(event, SessionRepaired):
            restored = _restored(event)
            times = [r.at for r in restored.turns] if restored is not None else [event.at]
            if n == 0 and restored is not None:
                first_index = restored.turns[0].index if restored.turns else restored.next_index
        else:
            times = [event.at]
        for at in times:
            if oldest is None or at < oldest:
                oldest = at
    return HistoryFacts(
        events=len(tail),
        oldest_at=oldest,
        first_index=first_index,
        unfinished=unfinished,
        stale_events=opening if unfinished is not None else 0,
        erasure_unfinished=opening if isinstance(opener, SessionErased) and not tail else 0,
        first_is_fence=isinstance(opener, SessionErased),
    )


def _restored(event: SessionRepaired) -> SessionState | None:
    """The state a repair restored (None when it does not decode: the fold reports that)."""
    try:
        return decode_state(event.state)
    except EventDecodeError:
        return None


def plan_retention(
    state: SessionState,
    facts: HistoryFacts,
    policy: RetentionPolicy,
    now: float,
    *,
    whole: SessionState | None = None,
) -> RetentionAction | None:
    """What `policy` asks of the session at `now`; None: keep it as it is.

    An unfinished compaction, or an erasure whose fence was stored but whose
    events were not erased, is finished first, whatever the policy. A session
    idle past `policy.idle` is erased. Otherwise a history over a cap (more
    events than `max_events`, more turns stored than `max_turns`, data older
    than `max_age`) is compacted to the summary and the newest turns within
    the caps. A session that has not started (or was erased) is left alone.
    `whole` is the session's state with every turn since its last clear (the
    fold of `without_horizon`), when its live state retired some: the turns
    within the caps that only it holds are kept in the log as `history`.
    """
    if not state.started:
        if facts.erasure_unfinished:
            return EraseIdle(idle_for=0.0, reason="finishing an erasure cut short (its fence is stored)")
        return None
    if facts.unfinished is not None:
        if facts.first_is_fence:
            reason = "dropping a history erased under a session begun again over its fence"
            return FinishCompaction(seq=facts.unfinished, dropped_events=facts.stale_events, reason=reason)
        return FinishCompaction(seq=facts.unfinished, dropped_events=facts.stale_events)
    if policy.idle is not None and now - state.last_at > policy.idle:
        idle_for = now - state.last_at
        return EraseIdle(
            idle_for=idle_for,
            reason=f"idle for {format_duration(idle_for)}, over idle {format_duration(policy.idle)}",
        )
    reasons = []
    stored_turns = max(0, state.next_index - facts.first_index)
    if policy.max_events is not None and facts.events > policy.max_events:
        reasons.append(f"{facts.events} events, over max_events {policy.max_events}")
    if policy.max_turns is not None and stored_turns > policy.max_turns:
        reasons.append(f"{stored_turns} turns stored, over max_turns {policy.max_turns}")
    cutoff = now - policy.max_age if policy.max_age is not None else None
    if cutoff is not None and facts.oldest_at is not None and facts.oldest_at < cutoff:
        assert policy.max_age is not None
        reasons.append(f"data older than max_age {format_duration(policy.max_age)}")
    if not reasons:
        return None
    first_live = state.turns[0].index if state.turns else state.next_index
    older = tuple(r for r in whole.turns if r.index < first_live) if whole is not None else ()
    kept = (*older, *state.turns)
    if cutoff is not None:
        kept = tuple(r for r in kept if r.at >= cutoff)
    if policy.max_turns is not None and policy.max_turns < len(kept):
        kept = kept[-policy.max_turns :]
    keep = tuple(r for r in kept if r.index >= first_live)
    history = kept[: len(kept) - len(keep)]
    return Compact(
        keep=keep,
        history=history,
        dropped_events=facts.events,
        dropped_turns=max(0, stored_turns - len(kept)),
        reason="; ".join(reasons),
    )


def compaction(
    state: SessionState,
    keep: Sequence[TurnRecord],
    *,
    event_id: str,
    at: float,
    dropped_events: int = 0,
    dropped_turns: int = 0,
    reason: str = "",
    history: Sequence[TurnRecord] = (),
) -> HistoryCompacted:
    """The event that compacts `state`'s history to its summary and `keep` (its newest turns).

    Its seq follows the state's version; the state after it is `compacted_state` of it.
    `history` are older turns (already retired from `state`) the log keeps beside them.
    """
    if state.key is None or not state.started:
        raise InvalidInput("state", "only a started session's history can be compacted")
    if len(keep) > len(state.turns) or tuple(keep) != state.turns[len(state.turns) - len(keep) :]:
        raise InvalidInput("keep", "a compaction keeps the session's newest turns, in order")
    dropped = state.turns[: len(state.turns) - len(keep)]
    entities = state.retired_entities
    for record in dropped:
        if record.turn.entities:
            entities = track_entities(entities, record.turn.entities, state.config.memories.entity_max)
    return HistoryCompacted(
        seq=state.version + 1,
        event_id=event_id,
        at=at,
        key=state.key,
        config=state.config,
        turns=tuple(KeptTurn(index=r.index, at=r.at, turn=r.turn) for r in keep),
        next_index=state.next_index,
        summary=state.summary,
        summary_through=state.summary_through,
        dropped_through=state.dropped_through,
        health=state.health,
        attempt=state.attempt,
        health_since=state.health_since,
        injected_summary=state.injected_summary,
        injected_from=state.injected_from,
        last_at=state.last_at,
        idempotency_keys=state.idempotency_keys,
        retired_through=max(state.retired_through, dropped[-1].index) if dropped else state.retired_through,
        entities=tuple(
            EntityTally(
                name=e.name,
                kind=e.kind,
                attributes=dict(e.attributes),
                mentions=e.mentions,
                last_mention=e.last_mention,
            )
            for e in entities.entities
        ),
        entity_mentions=entities.mention_total,
        dropped_events=dropped_events,
        dropped_turns=dropped_turns,
        reason=reason,
        history=tuple(KeptTurn(index=r.index, at=r.at, turn=r.turn) for r in history),
    )


def compacted_state(event: HistoryCompacted) -> SessionState:
    """The state a `HistoryCompacted` stands for, whatever came before it (the fold of the event)."""
    config = event.config
    include, dated = config.include_trajectory_digest, config.include_turn_dates
    records = tuple(
        TurnRecord(
            index=t.index,
            turn=t.turn,
            at=t.at,
            rendered_len=rendered_turn_length(t.turn, include_digest=include, include_date=dated),
        )
        for t in ((*event.history, *event.turns) if config.live_turns is None else event.turns)
    )
    entities = (
        EntityTable(
            entities=tuple(
                EntityRecord(
                    name=e.name,
                    kind=e.kind,
                    attributes=dict(e.attributes),
                    mentions=e.mentions,
                    last_mention=e.last_mention,
                )
                for e in event.entities
            ),
            mention_total=event.entity_mentions,
        )
        if event.entities or event.entity_mentions
        else _NO_ENTITIES
    )
    return bound(
        SessionState(
            key=event.key,
            config=config,
            version=event.seq,
            started=True,
            turns=records,
            next_index=event.next_index,
            summary=event.summary,
            summary_through=event.summary_through,
            dropped_through=event.dropped_through,
            health=event.health,
            attempt=event.attempt,
            health_since=event.health_since,
            injected_summary=event.injected_summary,
            injected_from=event.injected_from,
            last_at=event.last_at,
            idempotency_keys=event.idempotency_keys,
            retired_through=event.retired_through,
            retired_entities=entities,
        )
    )


class RetentionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a sweep did to one session, or (a dry run, or `skipped`) would have done."""

    key: MemoryKey
    action: Action
    reason: str
    done: bool = False
    """Carried out (False in a dry run, and when skipped)."""
    events_removed: int = 0
    """Events erased or dropped (in a dry run: that would be)."""
    turns_dropped: int = 0
    turns_kept: int = 0
    skipped: str | None = None
    """Why it was not carried out (written meanwhile, the log failed)."""


class RetentionProblem(msgspec.Struct, frozen=True, kw_only=True):
    """A session the sweep would not touch, and why (poison, a history that does not fold)."""

    key: MemoryKey
    problem: str


class RetentionReport(msgspec.Struct, kw_only=True):
    """The outcome of one sweep."""

    dry_run: bool
    at: float
    """The clock's time the policies were applied at."""
    sessions: int = 0
    """Sessions examined (those of tenants without a policy are not read)."""
    outcomes: list[RetentionOutcome] = msgspec.field(default_factory=list)
    problems: list[RetentionProblem] = msgspec.field(default_factory=list)
    stopped: bool = False
    """The sweep stopped early (the system closed)."""

    def count(self, action: Action) -> int:
        """Sessions `action` was carried out on (dry run: planned for)."""
        return sum(1 for o in self.outcomes if o.action == action and (o.done or self.dry_run))

    @property
    def skipped(self) -> int:
        """Planned actions not carried out (the session moved on, or the log failed)."""
        return sum(1 for o in self.outcomes if o.skipped is not None)

    def summary(self) -> str:
        """One line for people."""
        verb = "would" if self.dry_run else "did"
        removed = sum(o.events_removed for o in self.outcomes if o.done or self.dry_run)
        return (
            f"{self.sessions} session(s) examined; {verb} erase {self.count('erase')}, "
            f"compact {self.count('compact')}, finish {self.count('finish')} compaction(s); "
            f"{removed} event(s) {'to remove' if self.dry_run else 'removed'}; "
            f"{self.skipped} skipped, {len(self.problems)} unreadable"
        )
