"""A stored event described for people: its type and what it says, one line (`describe_event`).

What the timeline of an audit shows for each event (`convmem.actors.timeline`, ``convmem
inspect``, the timeline page); a pure function of the event.
"""

from __future__ import annotations

from convmem.events import (
    AnyEvent,
    BacklogTrimmed,
    HealthChanged,
    HistoryCompacted,
    ItemPopped,
    ItemsAdded,
    SessionCleared,
    SessionErased,
    SessionRepaired,
    SessionRestored,
    SessionStarted,
    SummaryProduced,
    TurnAdded,
    TurnsAdopted,
)

__all__ = ["describe_event"]


def describe_event(event: AnyEvent, *, full: bool = False) -> tuple[str, str]:
    """`event`'s type for people (``turn.added``) and what it says, its texts cut at about 60
    characters unless `full`."""
    clip = _whole if full else _cut
    match event:
        case SessionStarted():
            extra = f", injected summary from {event.injected_from}" if event.injected_from else ""
            if event.forked_from is not None:
                extra += f", forked from {event.forked_from} as of position {event.forked_at}"
            return "session.started", f"strategy={event.config.strategy}{extra}"
        case TurnAdded():
            return "turn.added", f"#{event.index} user: {clip(event.turn.user_message)}"
        case SummaryProduced():
            return (
                "summary.produced",
                f"turns {event.covers_from}-{event.covers_through}: {clip(event.summary)}",
            )
        case HealthChanged():
            return (
                "health.changed",
                f"{event.old.value} -> {event.new.value} (attempt {event.attempt}): {event.reason}",
            )
        case BacklogTrimmed():
            return "backlog.trimmed", f"dropped through #{event.dropped_through}"
        case SessionCleared():
            moved = f", moved to {event.moved_to}" if event.moved_to is not None else ""
            return "session.cleared", f"through #{event.cleared_through}{moved}: {event.reason}"
        case SessionRestored():
            origin = f" ({event.origin})" if event.origin else ""
            return "session.restored", f"{len(event.turns)} turns from #{event.first_index}{origin}"
        case TurnsAdopted():
            return (
                "turns.adopted",
                f"{len(event.turns)} turns from #{event.first_index}, moved from {event.source} "
                f"(its events through seq {event.source_seq})",
            )
        case SessionErased():
            return "session.erased", event.reason
        case SessionRepaired():
            found = f"; found: {'; '.join(event.damage)}" if event.damage else ""
            return (
                "session.repaired",
                f"restored to seq {event.restored_seq} ({event.method}){found}",
            )
        case ItemsAdded():
            return "items.added", f"{len(event.items)} items from #{event.first_index}"
        case ItemPopped():
            return "item.popped", f"{event.item.kind}"
        case HistoryCompacted():
            turns = (*event.history, *event.turns)
            kept = f"turns #{turns[0].index}-#{turns[-1].index} kept" if turns else "no turn kept"
            return (
                "history.compacted",
                f"{event.dropped_events} earlier events dropped ({event.dropped_turns} turns), {kept}, "
                f"summary through #{event.summary_through}: {clip(event.reason)}",
            )


def _cut(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _whole(text: str) -> str:
    return text
