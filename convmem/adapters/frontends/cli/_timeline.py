"""`convmem timeline KEY -o page.html`: one self-contained HTML page of a session's history.

For every event: where it sits in the log, what it was, the health after it,
the exact context a model would have been shown as of it (`replayed_context` of
the state the events up to it fold into, as readable text) with the change
from the event before, and the summary as of it with what the last summary
added, kept and dropped, line by line. The page needs nothing at view time:
data, style and script are in the file, and its content security policy
forbids fetching anything.

The file stays small whatever the session's length: every distinct line is
stored once, each event's context as its change from the event before (with
the whole context every `CHECKPOINT` events), and the page rebuilds and draws
only the selected event's context.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import (
    LoadReport,
    LoggedEvent,
    PoisonEvent,
    SessionSequence,
    decode_logged,
    replayed_context,
    timeline,
)
from convmem.adapters.frontends.cli._common import (
    EXIT_DAMAGED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    CliError,
    Progress,
    backend,
    damage_line,
    parse_key,
    read_session,
)
from convmem.adapters.frontends.cli._inspect import records_from_file, stamp
from convmem.adapters.frontends.cli._page import PAGE
from convmem.adapters.frontends.cli._readable import readable_lines
from convmem.adapters.frontends.cli._safe import visible
from convmem.errors import ReplayError
from convmem.events import AnyEvent, MemoryKey
from convmem.projections import SessionState, SkippedEvent, evolve

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


CHECKPOINT = 100
"""Every this many events the page's data holds a whole context; between them, changes only."""


class _Lines:
    """Every distinct line of text once, and every distinct chunk of lines (a turn, a heading) once.

    A context is a list of chunk ids, so the change from one context to the
    next is found among turns, not among the many lines turns share ("-",
    "assistant: |"), and stays cheap however long the context grows.
    """

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.texts: list[str] = []
        self.opens: list[bool] = []  # by line id: whether the line starts a chunk
        self.chunk_ids: dict[tuple[int, ...], int] = {}
        self.chunks: list[tuple[int, ...]] = []

    def of(self, lines: Iterable[str]) -> list[int]:
        out = []
        for line in lines:
            found = self.ids.get(line)
            if found is None:
                found = self.ids[line] = len(self.texts)
                self.texts.append(line)
                self.opens.append(_opens_chunk(line))
            out.append(found)
        return out

    def chunked(self, lines: list[str]) -> list[int]:
        """`lines` as chunk ids: a chunk starts at a line of a list item's dash or of a top-level name."""
        ids = self.of(lines)
        opens = self.opens
        out: list[int] = []
        start = 0
        for at in range(1, len(ids) + 1):
            if at < len(ids) and not opens[ids[at]]:
                continue
            chunk = tuple(ids[start:at])
            found = self.chunk_ids.get(chunk)
            if found is None:
                found = self.chunk_ids[chunk] = len(self.chunks)
                self.chunks.append(chunk)
            out.append(found)
            start = at
        return out


def _opens_chunk(line: str) -> bool:
    bare = line.lstrip(" ")
    return bare == "-" or bare.startswith("- ") or len(line) - len(bare) <= 2


def _delta(before: list[int], after: list[int]) -> list[int | list[int]] | None:
    """`after` as edits of `before`; None when unchanged.

    ``[a, b]`` keeps ``before[a:b]``; an id adds that chunk.
    """
    if before == after:
        return None
    head = 0
    while head < len(before) and head < len(after) and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < len(before) - head and tail < len(after) - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    ops: list[int | list[int]] = [[0, head]] if head else []
    old, new = before[head : len(before) - tail], after[head : len(after) - tail]
    for tag, a1, a2, b1, b2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag == "equal":
            ops.append([head + a1, head + a2])
        else:
            ops.extend(new[b1:b2])
    if tail:
        ops.append([len(before) - tail, len(before)])
    return ops


def _summary_diff(before: list[int], after: list[int]) -> list[list[Any]]:
    """The summary's lines, each tagged ``+`` added, ``-`` dropped or `` `` kept from the summary before."""
    out: list[list[Any]] = []
    for tag, a1, a2, b1, b2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag == "equal":
            out.extend([" ", i] for i in after[b1:b2])
            continue
        out.extend(["-", i] for i in before[a1:a2])
        out.extend(["+", i] for i in after[b1:b2])
    return out


def _short(row_type: str, detail: str) -> str:
    """A summary's row names the turns it covers; the summary itself is in the page's summary pane."""
    if row_type == "summary.produced":
        return detail.split(":", 1)[0]
    return detail


def page_data(
    records: Iterable[LoggedEvent], key: MemoryKey, progress: Progress | None = None
) -> dict[str, Any]:
    """What the page shows, event by event (see the module docstring).

    Each distinct line is stored once (``lines``), each distinct chunk of lines
    once as line ids (``chunks``); each event's context is a list of chunk ids,
    stored as the change from the event before (``context``: edits, or null when unchanged)
    with the whole context every `CHECKPOINT` events (``whole``); each summary
    is stored as its line diff from the summary before (``summaries``). The
    page rebuilds the selected event's context from these.
    """
    records = list(records)
    rows = timeline(records, full=True)
    state = SessionState()
    by_position: dict[int, list[AnyEvent | SkippedEvent]] = {}
    unfit: dict[int, str] = {}
    walk = SessionSequence()  # one walk of the session's records, as a replay makes it
    for record in records:
        report = LoadReport()
        for decoded in decode_logged([record], on_poison="skip", report=report, sequence=walk):
            by_position.setdefault(record.position, []).append(decoded)  # a gap's stand-in, then it
        if record.position not in by_position and report.poison:
            unfit[record.position] = report.poison[0].problem
    lines = _Lines()
    shown: dict[Any, list[str]] = {}  # each turn's lines, rendered once
    previous: list[int] = []
    summary: list[int] = []
    events: list[list[Any]] = []
    contexts: list[Any] = []
    whole: dict[str, list[int]] = {}
    summaries: dict[str, list[list[Any]]] = {}
    for index, listed in enumerate(rows):
        row = listed
        if row.position in unfit:
            row = msgspec.structs.replace(row, type="POISON", detail=unfit[row.position])
        for each in by_position.get(row.position) or ():
            try:
                state = evolve(state, each)
            except ReplayError as exc:
                row = msgspec.structs.replace(row, type="POISON", detail=str(exc))
        context = lines.chunked(readable_lines(replayed_context(state), cache=shown))  # the recorded counter
        contexts.append(_delta(previous, context))
        if index % CHECKPOINT == 0:
            whole[str(index)] = context
        now = lines.of(state.summary.split("\n")) if state.summary else []
        if now != summary:
            summaries[str(index)] = _summary_diff(summary, now)
        events.append(
            [
                row.position,
                row.seq,
                row.at,
                stamp(row.at) if row.at is not None else None,
                row.type,
                _short(row.type, row.detail),
                state.health.value if state.started else "unknown",
            ]
        )
        previous, summary = context, now
        if progress is not None and index % 64 == 0:
            progress.update(index)
    if progress is not None:
        progress.update(len(rows))
    times = [e[2] for e in events if e[2] is not None]
    return {
        "key": key.composite(),
        "first": stamp(min(times)) if times else "-",
        "last": stamp(max(times)) if times else "-",
        "checkpoint": CHECKPOINT,
        "lines": lines.texts,
        "chunks": lines.chunks,
        "events": events,
        "context": contexts,
        "whole": whole,
        "summaries": summaries,
    }


_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
"""JSON escapes for what could end, comment out or re-open markup inside a script element."""
_SLOTS = re.compile("__TITLE__|__DATA__")


def timeline_page(records: Iterable[LoggedEvent], key: MemoryKey, progress: Progress | None = None) -> str:
    """The whole HTML page of `key`'s events.

    The data is JSON in a ``type="application/json"`` script element with every
    ``<``, ``>`` and ``&`` (and U+2028/2029) escaped, so no stored text can
    close it, open a comment or a script in it, or end the page's markup; the
    script reads it with ``JSON.parse`` and shows it only as text
    (``textContent``), every control character of it as a visible escape
    (`_shown`). Both slots are filled in one pass, so a key or a turn that
    holds a slot's name fills nothing.
    """
    data = json.dumps(_shown(page_data(records, key, progress)), ensure_ascii=False, separators=(",", ":"))
    data = data.translate(_SCRIPT_SAFE)
    filled = {"__TITLE__": _html(key.composite()), "__DATA__": data}
    return _SLOTS.sub(lambda slot: filled[slot.group()], PAGE)


_UNSHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What the page shows as an escape: C0 (newline and tab aside), DEL, C1 and the bidi controls (the line
separators U+2028/2029 stay: the page shows them as the line breaks they are)."""


def _shown(value: Any) -> Any:
    """`value` with every control character of its texts as a visible escape (`_UNSHOWN`), as the CLI
    prints them: `textContent` runs no markup, but a raw bidi override (U+202E) would still turn the
    rest of a line around in the browser, and a terminal escape or a C1 control reach a terminal that
    prints the file."""
    if isinstance(value, str):
        return _UNSHOWN.sub(lambda control: visible(control.group()), value)
    if isinstance(value, dict):
        return {name: _shown(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_shown(item) for item in value]
    return value


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def cmd_timeline(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    records: list[LoggedEvent] = []
    if args.from_file:
        records = [r for r in records_from_file(args.from_file) if r.key == key]
    damage: list[PoisonEvent] = []
    if not args.from_file:
        with backend(args, read_only=True, lost_ok=True) as (log, snapshots):
            records, damage = read_session(log, snapshots, key)
    for each in damage:  # the page shows the records the log holds; this, what it lost too
        print(damage_line(each), file=sys.stderr)
    if not records:
        if damage:
            raise CliError(
                f"no event of session {key.composite()} can be read (its damage is named above): "
                "no page written",
                EXIT_DAMAGED,
            )
        raise CliError(f"no events for session {key.composite()}", EXIT_NOT_FOUND)
    progress = Progress("timeline: events", total=len(records))
    try:
        page = timeline_page(records, key, progress)
    finally:
        progress.close()
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote the timeline of {key.composite()} ({len(records)} events) to {args.output}")
    return EXIT_DAMAGED if damage else EXIT_OK
