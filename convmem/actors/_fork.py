"""Forking a session: a new session that starts exactly where another one was at a point of its past.

The fork is made of the source's own events up to that point, copied: its
first event is the source's `SessionStarted` with the new key and the fork's
origin (`forked_from`, `forked_at`), the others follow unchanged but for
their ids and seqs. So the fork's state is the source's state at that point
(its key aside), `verify` rebuilds it like any session, and an auditor sees
where it came from.

A fork copies old data, so it never outlives an erasure of it: one pending
for the source or the new session refuses the fork before it writes, and
once written the journal is asked again (`erasure_after`): an erasure of
either that is pending then, or finished since the fork began reading, may
have listed the user's sessions before the fork existed or erased the
source after it was read, so the new session is erased through the journal
(an erasure of its own, recorded first, by ``fork``) and `InvalidInput`
says so.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from datetime import datetime

import msgspec

from convmem.actors._clock import SystemClock
from convmem.actors._eraser import Eraser
from convmem.actors._journal import (
    ErasureJournal,
    ErasureRequest,
    JournaledLog,
    erasure_after,
    receipts_mark,
)
from convmem.actors._ports import EventLog, LoggedEvent
from convmem.errors import EventDecodeError, InvalidInput, SessionDamaged
from convmem.events import (
    AnyEvent,
    HistoryCompacted,
    MemoryKey,
    SessionErased,
    SessionRepaired,
    SessionStarted,
    decode_event,
)
from convmem.projections import SessionSequence, decode_state

__all__ = ["Forked", "fork_events", "fork_session"]

_CHUNK = 500  # events per append: one atomic batch each, well under the server's batch limit


class Forked(msgspec.Struct, frozen=True, kw_only=True):
    """What a fork copied: `events` events of the source, as of its log position `forked_at`."""

    events: int
    forked_at: int


def fork_events(
    records: Iterable[LoggedEvent],
    source: MemoryKey,
    to: MemoryKey,
    *,
    at_position: int | None = None,
    at_time: float | None = None,
    fork_id: str,
) -> tuple[list[AnyEvent], int]:
    """The events of session `to` starting as `source` was after `at_position` (or `at_time`; or now).

    Returns them with the log position of the last source event copied.
    `InvalidInput` when the source had no events by then or holds an
    event this version cannot read (a fork must be exact).
    """
    records = list(records)
    copied: list[AnyEvent] = []
    last = 0
    walk = SessionSequence()
    damaged: SessionDamaged | None = None  # damage no later repair (or fence, or compaction) covers
    for record in records:
        if at_position is not None and record.position > at_position:
            break
        if record.damage is not None:
            damaged = damaged or SessionDamaged(
                key=source.composite(),
                seq=record.seq,
                position=record.position or None,
                problem=f"{record.damage}; cannot fork",
            )
            if record.position and record.seq is not None and record.seq == walk.version + 1:
                walk.version = record.seq
            continue
        if walk.take(record.seq, record.data, intact=record.intact) is not None:
            continue  # not one of the source's events (reported by its audits): not copied
        if walk.gap is not None:
            damaged = damaged or SessionDamaged(
                key=source.composite(),
                seq=walk.gap[0],
                position=None,
                problem=f"events seq {walk.gap[0]}-{walk.gap[1]} are missing; cannot fork",
            )
        try:
            event = decode_event(record.data, seq=record.position)
        except EventDecodeError as exc:
            raise InvalidInput(
                "key", f"{source} has an unreadable event at position {record.position} ({exc}); cannot fork"
            ) from None
        if at_time is not None and round(event.at, 6) > at_time:  # a datetime holds microseconds
            break
        if isinstance(event, SessionErased):
            copied, damaged = [], None  # what came before an erasure fence is not the session's any more
        elif isinstance(event, HistoryCompacted):
            # Retention compacted the history here: the fork starts from the state it carries.
            opened = SessionStarted(seq=1, event_id="", at=event.at, key=event.key, config=event.config)
            copied, damaged = [opened, event], None
        elif isinstance(event, SessionRepaired):
            # An operator repaired the history here: the fork starts from the state it restored.
            restored = decode_state(event.state)
            opened = SessionStarted(seq=1, event_id="", at=event.at, key=source, config=restored.config)
            copied, damaged = ([opened, event] if restored.started else []), None
        else:
            copied.append(event)
        last = record.position
    if damaged is not None:
        raise damaged
    if not copied or not isinstance(copied[0], SessionStarted):
        when = (
            f"position {at_position}"
            if at_position is not None
            else f"time {at_time!r}"
            if at_time is not None
            else "now"
        )
        raise InvalidInput("at", f"{source} had no events as of {when}{_compacted(records)}: nothing to fork")
    start = msgspec.structs.replace(
        copied[0], seq=1, event_id=f"{fork_id}/1", key=to, forked_from=source, forked_at=last
    )
    rest = [
        msgspec.structs.replace(event, seq=n, event_id=f"{fork_id}/{n}")
        if not isinstance(event, HistoryCompacted)
        else msgspec.structs.replace(event, seq=n, event_id=f"{fork_id}/{n}", key=to, idempotency_keys=())
        for n, event in enumerate(copied[1:], start=2)
    ]
    return [start, *rest], last


def fork_session(
    log: EventLog, source: MemoryKey, to: MemoryKey, at: int | datetime | None = None
) -> tuple[Forked, list[AnyEvent]]:
    """Write the fork of `source` as `to` into `log` (see `MemorySystem.fork`); returns what was written."""
    if not isinstance(to, MemoryKey):
        raise InvalidInput("to", f"must be a MemoryKey, got {type(to).__name__}")
    if to == source:
        raise InvalidInput("to", "must be another session than the one forked")
    if isinstance(at, bool) or not (at is None or isinstance(at, int | datetime)):
        raise InvalidInput("at", f"must be a log position (int) or a datetime, got {type(at).__name__}")
    if isinstance(at, datetime) and at.tzinfo is None:
        raise InvalidInput("at", "a datetime needs a time zone (say datetime.now(UTC))")
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    mark = receipts_mark(journal)  # before anything is read: the receipts kept after it are asked after
    for key in (source, to):
        if erasure_after(journal, key, math.inf) is not None:
            raise InvalidInput("key", f"an erasure of {key} is pending (being erased): nothing forked")
    began = time.time()
    events, last = fork_events(
        log.read(source),
        source,
        to,
        at_position=at if isinstance(at, int) else None,
        at_time=at.timestamp() if isinstance(at, datetime) else None,
        fork_id=f"fork/{os.urandom(8).hex()}",
    )
    if log.last_seq(to) != 0:
        raise InvalidInput("to", f"{to} has events already; fork into a session that has none")
    for start in range(0, len(events), _CHUNK):
        chunk = events[start : start + _CHUNK]
        log.append(to, chunk, expected_seq=chunk[0].seq - 1)
    if journal is not None and any(
        erasure_after(journal, key, began, mark=mark) is not None for key in (source, to)
    ):
        _erase_fork(log, journal, to)
        raise InvalidInput(
            "key",
            f"{source} was erased while it was forked: the fork {to} holds erased data and is erased too",
        )
    return Forked(events=len(events), forked_at=last), events


def _erase_fork(log: EventLog, journal: ErasureJournal, to: MemoryKey) -> None:
    """Erase the fork `to` as any erasure is: recorded first, then its events, then every process told."""
    clock = SystemClock()
    eraser = Eraser(journal=journal, log=log, snapshots=None, clock=clock, drop=lambda _matches: None)
    eraser.erase(ErasureRequest.of(to.tenant_id, to.user_id, to.session_id, by="fork", at=clock.now()))


def _compacted(records: list[LoggedEvent]) -> str:
    """Why a session with events had none as of a point: retention compacted its history past it."""
    first = next((r for r in records if r.position and r.damage is None), None)
    try:
        event = decode_event(first.data, seq=first.position) if first is not None else None
    except EventDecodeError:
        return ""
    if first is None or not isinstance(event, HistoryCompacted) or not event.dropped_events:
        return ""
    return (
        f" left in the log (retention compacted its first {event.dropped_events} events away; its "
        f"history now begins at position {first.position}, time {event.at!r})"
    )
