"""What `replay` says besides the context: where the replay stopped, the query it was read with, and
the events a `--time` cannot tell apart.

A time names a moment, a log position names an event. Events stored in the same moment (one write's
events; or writes the clock did not tell apart) share a time, so a context served at that time may
have been read before some of them: `replay --time` shows the state after every event stamped at or
before the time, and names those stamped exactly at it (``same_time``), which `--position` tells
apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from convmem.actors import ErasureJournal, ErasureReceipt, LoggedEvent, find_erasure, timeline
from convmem.adapters.frontends.cli._inspect import stamp
from convmem.errors import ConvmemError, InvalidInput
from convmem.events import HistoryCompacted, MemoryKey, decode_event
from convmem.projections import SessionState, check_query

__all__ = ["gone_reason", "query_text", "replay_point", "same_time_note"]


def query_text(text: str) -> str:
    """`--query`: a read's query as `get_llm_context(query=...)` accepts it (exit 2 otherwise)."""
    try:
        checked = check_query(text, "--query")
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert checked is not None
    return checked


def replay_point(
    records: Iterable[LoggedEvent], key: MemoryKey, state: SessionState, span: tuple[float, float] | None
) -> dict[str, Any]:
    """The log position of the last event folded into `state` (None when none is left) and, for a
    replay as of a time (`span`: the first and last moments it covers, `as_of`), the positions of
    the folded events stamped within it."""
    rows = [row for row in timeline(r for r in records if r.key == key) if row.position]
    last = [row.position for row in rows if row.seq == state.version]
    position = max(last) if last and state.version else None
    same_time = (
        [
            row.position
            for row in rows
            if row.at is not None and span[0] <= row.at <= span[1] and row.position <= position
        ]
        if span is not None and position is not None
        else []
    )
    return {"position": position, "same_time": same_time}


def same_time_note(positions: list[int]) -> str:
    """The warning `replay --time` gives when events are stamped within the time asked."""
    where = ", ".join(str(p) for p in positions[:8]) + (", ..." if len(positions) > 8 else "")
    return (
        f"note: {len(positions)} event(s) are stamped within this time (positions {where}); "
        "a context served at this time may predate some of them: replay --position names one"
    )


def gone_reason(records: Iterable[LoggedEvent], key: MemoryKey, journal: ErasureJournal | None) -> str | None:
    """Why a replay of `key` as of a point folded nothing though the session was there: an erasure
    (its journal's record), or retention's compaction of the history before the session's first
    event left (a `HistoryCompacted`). None when neither: the key had no events then."""
    try:
        erased = find_erasure(journal, key)
    except ConvmemError:  # a damaged journal is named by verify; here it only cannot say
        erased = None
    if erased is not None:
        by = f" by {erased.by}" if erased.by else ""
        if isinstance(erased, ErasureReceipt):
            what = f"was erased ({stamp(erased.completed_at)} UTC{by})"
        else:
            what = f"is being erased (asked {stamp(erased.at)} UTC{by}; convmem erase --resume finishes it)"
        return (
            f"session {key} as of that point {what}: nothing of it from before the erasure is left to replay"
        )
    first = next((r for r in records if r.key == key and r.position), None)
    if first is None:
        return None
    try:
        event = decode_event(first.data)
    except ConvmemError:
        return None
    if isinstance(event, HistoryCompacted) and event.dropped_events:
        return (
            f"session {key} as of that point is no longer in the log: retention compacted its first "
            f"{event.dropped_events} events away ({event.reason or 'a retention policy'}); its history "
            f"now begins at position {first.position} ({stamp(event.at)} UTC): replay a position or a "
            "time from there on"
        )
    return None
