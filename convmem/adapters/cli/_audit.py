"""The auditor's commands: replay, verify, inspect, export, erase."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import (
    LoggedEvent,
    MemorySystem,
    export_jsonl,
    read_jsonl,
    replay_session,
    timeline,
    verify,
)
from convmem.adapters._memory import InMemoryEventLog
from convmem.adapters.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Progress,
    backend,
    emit_json,
    parse_key,
    parse_time,
    table,
)
from convmem.projections import agent_items, llm_context

__all__ = ["add_audit_commands"]


def add_audit_commands(commands: Any) -> None:
    """Register replay, verify, inspect, export and erase on the CLI's subparsers."""
    p = commands.add_parser(
        "replay", help="a session's state and context as of its latest event, a position or a time"
    )
    p.add_argument("key", help="tenant:user:session")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--position", type=int, help="stop after this log position (stream sequence)")
    when.add_argument("--time", help="stop after this time (epoch seconds or ISO 8601)")
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_replay)

    p = commands.add_parser("verify", help="rebuild sessions from the log and compare with their snapshots")
    p.add_argument("key", nargs="?", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="every session of a tenant")
    p.add_argument("--user", help="every session of a user (needs --tenant)")
    p.add_argument("--all", action="store_true", help="every session in the log")
    p.add_argument("--from-file", type=Path, help="verify a JSONL export (no snapshots)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_verify)

    p = commands.add_parser("inspect", help="a session's event timeline")
    p.add_argument("key", help="tenant:user:session")
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_inspect)

    p = commands.add_parser("export", help="events as JSONL, one per line (replay --from-file reads it back)")
    p.add_argument("--key", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="every session of a tenant")
    p.add_argument("--user", help="every session of a user (needs --tenant)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(run=cmd_export)

    p = commands.add_parser("erase", help="purge a session's or a user's events and snapshots")
    p.add_argument("--key", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="the user's tenant")
    p.add_argument("--user", help="every session of this user (needs --tenant)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_erase)


def _records_from_file(path: Path) -> list[LoggedEvent]:
    try:
        with path.open(encoding="utf-8") as handle:
            return list(read_jsonl(handle, source=str(path)))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_INVALID) from None


def _scope(args: argparse.Namespace) -> dict[str, Any]:
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant (a user id is only unique within its tenant)", EXIT_USAGE)
    return {"tenant_id": args.tenant, "user_id": args.user}


def _stamp(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def cmd_replay(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    until_time = parse_time(args.time) if args.time else None
    if args.from_file:
        records: Iterable[LoggedEvent] = _records_from_file(args.from_file)
        state, report = replay_session(records, key, until_position=args.position, until_time=until_time)
    else:
        with backend(args) as (log, _):
            records = log.read(key)
            state, report = replay_session(records, key, until_position=args.position, until_time=until_time)
    if not state.started and state.version == 0:
        raise CliError(f"no events for session {key} (check the key, or --nats/--data-dir)", EXIT_NOT_FOUND)
    context = llm_context(state)
    result = {
        "key": key.composite(),
        "seq": state.version,
        "health": state.health.value,
        "turns": len(state.turns),
        "summary_through": state.summary_through,
        "context": context,
        "agent_items": agent_items(state) if state.config.agents.strategy != "none" else None,
        "poison": [msgspec.to_builtins(p) for p in report.poison],
    }
    if args.json:
        emit_json(result)
    else:
        print(
            f"session {key}  seq {state.version}  health {state.health.value}  live turns {len(state.turns)}"
        )
        emit_json(context)
        for poison in report.poison:
            print(f"poison at position {poison.position}: {poison.problem}", file=sys.stderr)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    if key is None and not (args.all or args.tenant):
        raise CliError("say what to verify: a KEY, --tenant [--user], or --all", EXIT_USAGE)
    progress = Progress("verify: events read")
    started = time.perf_counter()
    if args.from_file:
        file_log = InMemoryEventLog()
        for record in _records_from_file(args.from_file):
            file_log.append_raw(record.key, record.data, seq=record.seq)
        checks = verify(file_log, None, key=key, progress=progress.update, **scope)
    else:
        with backend(args) as (log, snapshots):
            checks = verify(log, snapshots, key=key, progress=progress.update, **scope)
    progress.close()
    elapsed = time.perf_counter() - started
    if not checks:
        raise CliError("nothing to verify: no session has events in that scope", EXIT_NOT_FOUND)
    failed = [c for c in checks if not c.ok]
    events = sum(c.events for c in checks)
    if args.json:
        emit_json(
            {
                "sessions": len(checks),
                "events": events,
                "failed": len(failed),
                "seconds": round(elapsed, 3),
                "checks": [
                    {
                        "key": c.key.composite(),
                        "ok": c.ok,
                        "events": c.events,
                        "turns": c.turns,
                        "summaries": c.summaries,
                        "last_seq": c.last_seq,
                        "snapshot_seq": c.snapshot_seq,
                        "problems": c.problems,
                        "poison": [msgspec.to_builtins(p) for p in c.poison],
                    }
                    for c in checks
                ],
            }
        )
    else:
        rows = [
            (
                c.key.composite(),
                c.events,
                c.turns,
                c.summaries,
                c.snapshot_seq or "-",
                "ok" if c.ok else "FAILED",
            )
            for c in checks
        ]
        table(rows, ["session", "events", "turns", "summaries", "snapshot", "verdict"])
        for check in failed:
            for problem in check.problems:
                print(f"{check.key}: {problem}")
            for poison in check.poison:
                print(
                    f"{check.key}: poison at position {poison.position} (seq {poison.seq}): {poison.problem}"
                )
        print(
            f"{len(checks) - len(failed)}/{len(checks)} sessions verified, {events} events in {elapsed:.2f}s"
        )
    return EXIT_FAILED if failed else EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    if args.from_file:
        rows = timeline(r for r in _records_from_file(args.from_file) if r.key == key)
    else:
        with backend(args) as (log, _):
            rows = timeline(log.read(key))
    if not rows:
        raise CliError(f"no events for session {key}", EXIT_NOT_FOUND)
    if args.json:
        emit_json([msgspec.to_builtins(r) for r in rows])
    else:
        table(
            [(r.position, r.seq if r.seq is not None else "-", _stamp(r.at), r.type, r.detail) for r in rows],
            ["position", "seq", "time (UTC)", "event", "detail"],
        )
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
    count = 0
    progress = Progress("export: events")
    try:
        with backend(args) as (log, _):
            records = log.read(key) if key is not None else log.read_all(**scope)
            for line in export_jsonl(records):
                out.write(line + "\n")
                count += 1
                if count % 1000 == 0:
                    progress.update(count)
    finally:
        progress.close()
        if args.output:
            out.close()
    if args.output:
        print(f"exported {count} events to {args.output}", file=sys.stderr)
    return EXIT_OK


def _confirm(what: str, token: str) -> bool:
    if not sys.stdin.isatty():
        raise CliError(f"refusing to erase {what} without confirmation: pass --yes", EXIT_USAGE)
    answer = input(f"Erase {what}? This cannot be undone. Type {token!r} to confirm: ")
    return answer.strip() == token


def cmd_erase(args: argparse.Namespace) -> int:
    if bool(args.key) == bool(args.user):
        raise CliError("say what to erase: --key tenant:user:session, or --tenant T --user U", EXIT_USAGE)
    key = parse_key(args.key) if args.key else None
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant", EXIT_USAGE)
    what = f"session {key}" if key else f"every session of user {args.user!r} of tenant {args.tenant!r}"
    token = key.composite() if key else args.user
    if not args.yes and not _confirm(what, token):
        print("not erased", file=sys.stderr)
        return EXIT_FAILED
    with backend(args) as (log, snapshots), MemorySystem(log=log, snapshots=snapshots) as system:
        if key is not None and log.last_seq(key) == 0:
            raise CliError(f"nothing to erase: no events for {what}", EXIT_NOT_FOUND)
        erased = system.erase(key) if key is not None else system.erase_user(args.tenant, args.user)
        if not erased.sessions:
            raise CliError(f"nothing to erase: no events for {what}", EXIT_NOT_FOUND)
    if args.json:
        emit_json({"events_purged": erased.events_purged, "sessions": erased.sessions})
    else:
        print(f"erased {what}: {erased.events_purged} events purged from {erased.sessions} session(s)")
    return EXIT_OK
