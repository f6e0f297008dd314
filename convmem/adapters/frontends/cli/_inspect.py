"""The auditor's views of sessions: `inspect` (one session's events) and `sessions` (which exist)."""

from __future__ import annotations

import argparse
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import LoggedEvent, SessionSequence, TimelineRow, list_sessions, read_jsonl, timeline
from convmem.adapters.frontends.cli._as_of import parse_through
from convmem.adapters.frontends.cli._common import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_OK,
    CliError,
    backend,
    damage_line,
    emit_json,
    history_line,
    history_lost,
    journal_lost,
    journal_lost_line,
    parse_key,
    parse_time,
    positive_int,
    positive_seconds,
    read_session,
    table,
    tallies_damaged,
    tally_damaged_line,
)
from convmem.adapters.frontends.cli._safe import json_text
from convmem.events import EVENT_TYPES as ALL_EVENT_TYPES
from convmem.events import MemoryKey

__all__ = ["add_inspect_commands", "records_from_file", "stamp"]

EVENT_TYPES = (*(str(t.__struct_config__.tag) for t in ALL_EVENT_TYPES), "POISON", "DAMAGED")
"""What `inspect --type` picks from: every event tag the codec knows, poison, and damage."""


def add_inspect_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register inspect and sessions on the CLI's subparsers (`common`: global options)."""
    p = commands.add_parser("inspect", parents=[common], help="a session's event timeline")
    p.add_argument("key", help="tenant:user:session")
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.add_argument("--full", action="store_true", help="show every detail whole (not cut at 60 characters)")
    p.add_argument(
        "--type",
        action="append",
        choices=EVENT_TYPES,
        metavar="TYPE",
        help=f"only events of this type (repeatable): {', '.join(EVENT_TYPES)}",
    )
    p.add_argument("--since", help="only events at or after this time (epoch seconds or ISO 8601)")
    p.add_argument(
        "--until",
        help="only events at or before this time: epoch seconds, or ISO 8601 through its last digit "
        "(10:00:00.123Z: every event shown at that millisecond)",
    )
    p.add_argument(
        "--follow", action="store_true", help="keep showing new events as they are stored (Ctrl-C ends)"
    )
    p.add_argument(
        "--interval", type=positive_seconds, default=0.5, help="seconds between checks with --follow"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (JSON lines with --follow)")
    p.set_defaults(run=cmd_inspect)

    p = commands.add_parser(
        "sessions", parents=[common], help="the sessions in the log, with events, last activity and health"
    )
    p.add_argument("--tenant", help="only this tenant's sessions")
    p.add_argument("--user", help="only this user's sessions (needs --tenant)")
    p.add_argument("--limit", type=positive_int, help="show at most this many")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_sessions)


def stamp(at: float | None) -> str:
    """A time as people read it, in UTC with milliseconds."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class _Filter:
    def __init__(self, args: argparse.Namespace) -> None:
        self.types = set(args.type or ())
        self.since = parse_time(args.since) if args.since else None
        self.until = parse_through(args.until) if args.until else None  # through its last digit
        if self.since is not None and self.until is not None and self.since > self.until:
            raise CliError("--since is after --until: nothing can match", EXIT_INVALID)

    def keeps(self, row: TimelineRow) -> bool:
        if self.types and row.type not in self.types:
            return False
        if self.since is not None and (row.at is None or row.at < self.since):
            return False
        return self.until is None or (row.at is not None and row.at <= self.until)


def _show(rows: list[TimelineRow], *, as_json: bool, lines: bool = False) -> None:
    if as_json and lines:
        for row in rows:
            sys.stdout.write(json_text(msgspec.json.encode(row).decode()) + "\n")
        sys.stdout.flush()
    elif as_json:
        emit_json([msgspec.to_builtins(r) for r in rows])
    else:
        table(
            [(r.position, r.seq if r.seq is not None else "-", stamp(r.at), r.type, r.detail) for r in rows],
            ["position", "seq", "time (UTC)", "event", "detail"],
        )
        sys.stdout.flush()


def records_from_file(path: Path) -> list[LoggedEvent]:
    """The records of the JSONL export `path` (``--from-file``); a wrong line is an `InvalidInput`
    naming the file and the line (exit 5), a line that is not UTF-8 too (read as bytes for that)."""
    try:
        with path.open("rb") as handle:
            return list(read_jsonl(handle, source=str(path)))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", EXIT_INVALID) from None


def cmd_inspect(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    keep = _Filter(args)
    if args.follow and args.from_file:
        raise CliError("--follow reads the live log; it cannot follow a file", 2)
    if args.from_file:
        rows = timeline((r for r in records_from_file(args.from_file) if r.key == key), full=args.full)
        shown = [r for r in rows if keep.keeps(r)]
        if not rows:
            raise CliError(f"no events for session {key.composite()} in {args.from_file}", EXIT_NOT_FOUND)
        _show(shown, as_json=args.json)
        return EXIT_OK
    with backend(args, read_only=True, lost_ok=True) as (log, snapshots):
        records, damage = read_session(log, snapshots, key)
        if not records and not damage and not args.follow:
            raise CliError(f"no events for session {key.composite()}", EXIT_NOT_FOUND)
        walks: dict[MemoryKey, SessionSequence] = {}
        rows = timeline(records, full=args.full, walks=walks)
        _show([r for r in rows if keep.keeps(r)], as_json=args.json, lines=args.follow)
        for each in damage:  # what the rows cannot show (events the log lost), and what they do
            print(damage_line(each), file=sys.stderr)
        if args.follow:
            last = max((r.position for r in records), default=0)  # by position: seqs may be forged
            pause = threading.Event()  # never set: waits between checks of the log
            while not pause.wait(args.interval):
                fresh = [r for r in log.read(key) if r.position > last]
                if not fresh:
                    continue
                last = fresh[-1].position
                rows = [r for r in timeline(fresh, full=args.full, walks=walks) if keep.keeps(r)]
                if rows:
                    _show(rows, as_json=args.json, lines=True)
    return EXIT_DAMAGED if damage else EXIT_OK


def cmd_sessions(args: argparse.Namespace) -> int:
    """The sessions (those known only by a snapshot too); each lost, damaged or unreadable one is named
    with why (on stderr, or its ``problem`` in JSON): exit 7 for a lost or damaged one, else 1 for an
    unreadable one. A log whose history is lost (its stream gone, the store's snapshots not) is named
    on stderr too, and exit 7, even when no session is left to list; so is a damaged byte tally of a
    tenant listed whole (every tenant, or ``--tenant`` without ``--user``), as verify names it."""
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant (a user id is only unique within its tenant)", 2)
    with backend(args, read_only=True, lost_ok=True) as (log, snapshots):
        rows = list_sessions(log, snapshots, tenant_id=args.tenant, user_id=args.user, limit=args.limit)
        lost = history_lost(log)
        journal_gone = journal_lost(log)
        # A tenant's byte tally, when its sessions are listed whole (a user's are not the tenant's).
        tallies = [] if args.user else [t for t in tallies_damaged(log) if args.tenant in (None, t[1])]
    if not rows and lost is None and journal_gone is None and not tallies:
        scope = (
            f"tenant {args.tenant}" + (f", user {args.user}" if args.user else "")
            if args.tenant
            else "the log"
        )
        raise CliError(f"no sessions in {scope}", EXIT_NOT_FOUND)
    if args.json:
        emit_json([{"key": r.key.composite(), "tenant_id": r.key.tenant_id, **r.as_json()} for r in rows])
    else:
        table(
            [(r.key.composite(), r.events, r.turns, r.live_turns, stamp(r.last_at), r.health) for r in rows],
            ["session", "events", "turns", "live turns", "last activity (UTC)", "health"],
        )
        for row in rows:
            if row.problem is not None:
                print(f"{row.key}: {row.health.upper()}: {row.problem}", file=sys.stderr)
    if lost is not None:  # what no row can show: sessions left no snapshot to be listed by
        print(history_line(lost), file=sys.stderr)
    if journal_gone is not None:  # nor erasures asked for and pending when the journal was lost
        print(journal_lost_line(journal_gone), file=sys.stderr)
    for bucket, tenant_id in tallies:  # nor a tenant's byte tally (verify names it)
        print(tally_damaged_line(bucket, tenant_id), file=sys.stderr)
    healths = {r.health for r in rows}
    if healths & {"lost", "damaged"} or lost is not None or journal_gone is not None or tallies:
        return EXIT_DAMAGED
    return EXIT_FAILED if "unreadable" in healths else EXIT_OK
