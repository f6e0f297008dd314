"""`convmem timeline KEY -o page.html`: one self-contained HTML page of a session's history.

For every event: where it sits in the log, what it was, the health after it,
the exact context a model would have been shown as of it (`llm_context` of
the state the events up to it fold into) and the change from the event
before. The page needs nothing at view time: data, style and script are in
the file, and its content security policy forbids fetching anything.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import LoadReport, LoggedEvent, SessionSequence, decode_logged, timeline
from convmem.adapters.cli._common import EXIT_NOT_FOUND, EXIT_OK, CliError, backend, parse_key
from convmem.adapters.cli._inspect import records_from_file, stamp
from convmem.adapters.cli._page import PAGE
from convmem.errors import ReplayError
from convmem.events import AnyEvent, MemoryKey
from convmem.projections import SessionState, SkippedEvent, evolve, llm_context

__all__ = ["add_timeline_command", "timeline_page"]


def add_timeline_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `timeline` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser(
        "timeline",
        parents=[common],
        help="write a self-contained HTML page of a session's events and the context as of each",
    )
    p.add_argument("key", help="tenant:user:session")
    p.add_argument("-o", "--output", type=Path, required=True, help="the HTML file to write")
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.set_defaults(run=cmd_timeline)


def _context_text(state: SessionState) -> str:
    return json.dumps(llm_context(state), ensure_ascii=False, indent=2, sort_keys=True)


def page_data(records: Iterable[LoggedEvent], key: MemoryKey) -> dict[str, Any]:
    """What the page shows, event by event (see the module docstring)."""
    records = list(records)
    rows = timeline(records, full=True)
    state = SessionState()
    previous = _context_text(state)
    events: list[dict[str, Any]] = []
    by_position: dict[int, list[AnyEvent | SkippedEvent]] = {}
    unfit: dict[int, str] = {}
    walk = SessionSequence()  # one walk of the session's records, as a replay makes it
    for record in records:
        report = LoadReport()
        for decoded in decode_logged([record], on_poison="skip", report=report, sequence=walk):
            by_position.setdefault(record.position, []).append(decoded)  # a gap's stand-in, then it
        if record.position not in by_position and report.poison:
            unfit[record.position] = report.poison[0].problem
    for listed in rows:
        row = listed
        found = by_position.get(row.position)
        if row.position in unfit:
            row = msgspec.structs.replace(row, type="POISON", detail=unfit[row.position])
        for each in found or ():
            try:
                state = evolve(state, each)
            except ReplayError as exc:
                row = msgspec.structs.replace(row, type="POISON", detail=str(exc))
        context = _context_text(state)
        diff = [
            line
            for line in difflib.ndiff(previous.splitlines(), context.splitlines())
            if line[:1] in "+- " and not line.startswith("? ")
        ]
        changed = [line for line in diff if line[:1] in "+-"]
        events.append(
            {
                "position": row.position,
                "seq": row.seq,
                "at": row.at,
                "time": stamp(row.at) if row.at is not None else None,
                "type": row.type,
                "detail": row.detail,
                "health": state.health.value if state.started else "unknown",
                "context": context,
                "diff": diff if changed else [],
            }
        )
        previous = context
    times = [e["at"] for e in events if e["at"] is not None]
    return {
        "key": key.composite(),
        "first": stamp(min(times)) if times else "-",
        "last": stamp(max(times)) if times else "-",
        "events": events,
    }


_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
"""JSON escapes for what could end, comment out or re-open markup inside a script element."""
_SLOTS = re.compile("__TITLE__|__DATA__")


def timeline_page(records: Iterable[LoggedEvent], key: MemoryKey) -> str:
    """The whole HTML page of `key`'s events.

    The data is JSON in a ``type="application/json"`` script element with every
    ``<``, ``>`` and ``&`` (and U+2028/2029) escaped, so no stored text can
    close it, open a comment or a script in it, or end the page's markup; the
    script reads it with ``JSON.parse`` and shows it only as text
    (``textContent``). Both slots are filled in one pass, so a key or a turn
    that holds a slot's name fills nothing.
    """
    data = json.dumps(page_data(records, key), ensure_ascii=False).translate(_SCRIPT_SAFE)
    filled = {"__TITLE__": _html(key.composite()), "__DATA__": data}
    return _SLOTS.sub(lambda slot: filled[slot.group()], PAGE)


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def cmd_timeline(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    if args.from_file:
        records = [r for r in records_from_file(args.from_file) if r.key == key]
    else:
        with backend(args, read_only=True) as (log, _):
            records = log.read(key)
    if not records:
        raise CliError(f"no events for session {key.composite()}", EXIT_NOT_FOUND)
    args.output.write_text(timeline_page(records, key), encoding="utf-8")
    print(f"wrote the timeline of {key.composite()} ({len(records)} events) to {args.output}")
    return EXIT_OK
