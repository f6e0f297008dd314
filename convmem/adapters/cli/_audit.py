"""The auditor's commands: replay, verify, export, erase, repair (inspect and sessions are in `_inspect`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import (
    EventLog,
    LoggedEvent,
    MemorySystem,
    export_jsonl,
    plan_repair,
    read_jsonl,
    replay_session,
    verify,
)
from convmem.adapters._memory import InMemoryEventLog
from convmem.adapters.cli._common import (
    EXIT_DAMAGED,
    EXIT_DECLINED,
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
    positive_int,
    session_counts,
    table,
)
from convmem.adapters.cli._safe import json_text
from convmem.errors import ConvmemError
from convmem.events import MemoryKey
from convmem.projections import agent_items, llm_context

__all__ = ["add_audit_commands", "event_count"]


def add_audit_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register replay, verify, export, erase and repair on the CLI's subparsers (`common`: global
    options)."""
    p = commands.add_parser(
        "replay",
        parents=[common],
        help="a session's state and context as of its latest event, a position or a time",
    )
    p.add_argument("key", help="tenant:user:session")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--position", type=positive_int, help="stop after this log position (stream sequence)")
    when.add_argument("--time", help="stop after this time (epoch seconds or ISO 8601)")
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_replay)

    p = commands.add_parser(
        "verify", parents=[common], help="rebuild sessions from the log and compare with their snapshots"
    )
    p.add_argument("key", nargs="?", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="every session of a tenant")
    p.add_argument("--user", help="every session of a user (needs --tenant)")
    p.add_argument("--all", action="store_true", help="every session in the log")
    p.add_argument("--from-file", type=Path, help="verify a JSONL export (no snapshots)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_verify)

    p = commands.add_parser(
        "export", parents=[common], help="events as JSONL, one per line (replay --from-file reads it back)"
    )
    p.add_argument("--key", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="every session of a tenant")
    p.add_argument("--user", help="every session of a user (needs --tenant)")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(run=cmd_export)

    p = commands.add_parser(
        "erase", parents=[common], help="erase a session's or a user's events and snapshots"
    )
    p.add_argument("--key", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="the user's tenant")
    p.add_argument("--user", help="every session of this user (needs --tenant)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_erase)

    p = commands.add_parser(
        "repair",
        parents=[common],
        help="repair a damaged session: restore its newest good snapshot or cut at its last good event",
    )
    p.add_argument("key", nargs="?", help="the session, tenant:user:session (or --tenant, --user, --session)")
    p.add_argument("--tenant", help="the session's tenant")
    p.add_argument("--user", help="the session's user")
    p.add_argument("--session", help="the session's id")
    p.add_argument(
        "--method",
        choices=("auto", "snapshot", "cut"),
        default="auto",
        help="where the restored state comes from (auto: whichever holds more)",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_repair)


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


def cmd_replay(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    until_time = parse_time(args.time) if args.time else None
    if args.from_file:
        records: Iterable[LoggedEvent] = _records_from_file(args.from_file)
        state, report = replay_session(records, key, until_position=args.position, until_time=until_time)
    else:
        with backend(args, read_only=True) as (log, _):
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
        "damage": [msgspec.to_builtins(d) for d in report.damage],
    }
    if args.json:
        emit_json(result)
    else:
        print(
            f"session {key}  seq {state.version}  health {state.health.value}  live turns {len(state.turns)}"
        )
        emit_json(context)
        for poison in report.poison:
            print(f"{key}: poison at position {poison.position}: {poison.problem}", file=sys.stderr)
        for damage in report.damage:
            print(f"{key}: DAMAGED{_where(damage.seq, damage.position)}: {damage.problem}", file=sys.stderr)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    if key is None and not (args.all or args.tenant):
        raise CliError("say what to verify: a KEY, --tenant [--user], or --all", EXIT_USAGE)
    progress = Progress("verify: events read", quiet=args.json)
    started = time.perf_counter()
    try:
        if args.from_file:
            file_log = InMemoryEventLog()
            for record in _records_from_file(args.from_file):
                file_log.append_raw(record.key, record.data, seq=record.seq)
            progress.set_total(event_count(file_log, key, scope))
            checks = verify(file_log, None, key=key, progress=progress.update, **scope)
        else:
            with backend(args, read_only=True) as (log, snapshots):
                progress.set_total(event_count(log, key, scope))
                checks = verify(log, snapshots, key=key, progress=progress.update, **scope)
    finally:
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
                        "damage": [msgspec.to_builtins(d) for d in c.damage],
                        "repaired": c.repaired,
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
                "ok" if c.ok else "DAMAGED" if c.damage else "FAILED",
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
            for damage in check.damage:
                print(f"{check.key}: DAMAGED{_where(damage.seq, damage.position)}: {damage.problem}")
        print(
            f"{len(checks) - len(failed)}/{len(checks)} sessions verified, {events} events in {elapsed:.2f}s"
        )
    if any(c.damage for c in checks):
        if not args.json:
            print("damaged sessions are refused until repaired: convmem repair tenant:user:session")
        return EXIT_DAMAGED
    return EXIT_FAILED if failed else EXIT_OK


def _where(seq: int | None, position: int | None) -> str:
    """ " seq 3, position 12" (what is known of where a damage is), or "" (a snapshot's)."""
    parts = [f"seq {seq}" if seq is not None else "", f"position {position}" if position else ""]
    where = ", ".join(p for p in parts if p)
    return f" {where}" if where else ""


def _repair_key(args: argparse.Namespace) -> MemoryKey:
    named = (args.tenant, args.user, args.session)
    if args.key and any(named):
        raise CliError("name the session once: a KEY, or --tenant, --user and --session", EXIT_USAGE)
    if args.key:
        return parse_key(args.key)
    if not all(named):
        raise CliError(
            "say which session to repair: tenant:user:session, or --tenant --user --session", EXIT_USAGE
        )
    tenant, user, session = named
    return (
        parse_key(f"{tenant}:{user}:{session}")
        if ":" not in "".join(named)
        else _key_of(tenant, user, session)
    )


def _key_of(tenant: str, user: str, session: str) -> MemoryKey:
    try:
        return MemoryKey(tenant, user, session)
    except ConvmemError as exc:
        raise CliError(f"bad session: {exc}", EXIT_USAGE) from None


def cmd_repair(args: argparse.Namespace) -> int:
    key = _repair_key(args)
    with backend(args, read_only=args.dry_run) as (log, snapshots):
        plan, _ = plan_repair(log, snapshots, key, method=args.method)
        if not plan.needed:
            if log.last_seq(key) == 0 and (snapshots is None or snapshots.load(key) is None):
                raise CliError(f"nothing to repair: no events or snapshot for session {key}", EXIT_NOT_FOUND)
            _report_repair(args, plan, "nothing to repair: the session verifies")
            return EXIT_OK
        what = (
            f"session {key.composite()}: {len(plan.damage)} damaged or missing event(s); restore "
            f"{'the snapshot' if plan.method == 'snapshot' else 'the events'} up to seq {plan.restored_seq} "
            f"({plan.turns} live turns)"
        )
        if args.dry_run:
            _report_repair(args, plan, f"would repair {what}")
            return EXIT_OK
        if not args.yes and not _confirm_repair(what, key.composite()):
            print("not repaired: the confirmation did not match", file=sys.stderr)
            return EXIT_DECLINED
        with MemorySystem(log=log, snapshots=snapshots) as system:
            plan = system.repair(key, method=args.method, reason="convmem repair")
    note = f" (its new snapshot was not saved: {plan.snapshot_problem})" if plan.snapshot_problem else ""
    _report_repair(args, plan, f"repaired {what}: the repair is event seq {plan.seq}{note}")
    return EXIT_OK


def _confirm_repair(what: str, token: str) -> bool:
    if not sys.stdin.isatty():
        raise CliError(f"refusing to repair {what} without confirmation: pass --yes", EXIT_USAGE)
    answer = input(f"Repair {what}? Type {token} to confirm: ")
    return answer.strip() == token


def _report_repair(args: argparse.Namespace, plan: Any, message: str) -> None:
    if args.json:
        emit_json(
            {
                "key": plan.key.composite(),
                "needed": plan.needed,
                "applied": plan.applied,
                "method": plan.method or None,
                "restored_seq": plan.restored_seq,
                "seq": plan.seq or None,
                "turns": plan.turns,
                "damage": [msgspec.to_builtins(d) for d in plan.damage],
                "snapshot_problem": plan.snapshot_problem or None,
            }
        )
        return
    for damage in plan.damage:
        print(f"{plan.key}: DAMAGED{_where(damage.seq, damage.position)}: {damage.problem}")
    print(message)


def cmd_export(args: argparse.Namespace) -> int:
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    count = 0
    with backend(args, read_only=True) as (log, _):
        total = event_count(log, key, scope)
        if not total:
            what = f"session {key.composite()}" if key else "that scope" if scope["tenant_id"] else "the log"
            raise CliError(f"nothing to export: no events for {what}", EXIT_NOT_FOUND)
        out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
        progress = Progress("export: events", total, quiet=not args.output)
        try:
            records = log.read(key) if key is not None else log.read_all(**scope)
            for line in export_jsonl(records):
                out.write((line if args.output else json_text(line)) + "\n")  # stdout: no raw controls
                count += 1
                if count % 200 == 0:
                    progress.update(count)
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
    try:
        answer = input(f"Erase {what}? This cannot be undone. Type {token} to confirm: ")
    except EOFError:  # Ctrl-D: no answer is not a yes
        print(file=sys.stderr)
        return False
    return answer.strip() == token


def cmd_erase(args: argparse.Namespace) -> int:
    if bool(args.key) == bool(args.user):
        raise CliError("say what to erase: --key tenant:user:session, or --tenant T --user U", EXIT_USAGE)
    key = parse_key(args.key) if args.key else None
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant", EXIT_USAGE)
    with backend(args) as (log, snapshots):
        keys = [key] if key is not None else log.keys(tenant_id=args.tenant, user_id=args.user)
        if key is not None and log.last_seq(key) == 0:
            keys = []
        if key is not None:
            what = f"session {key.composite()}"
        else:
            what = f"user {args.user} of tenant {args.tenant} ({len(keys)} session(s))"
        if not keys:
            raise CliError(f"nothing to erase: no events for {what}", EXIT_NOT_FOUND)
        token = key.composite() if key else args.user
        if not args.yes and not _confirm(what, token):
            print("not erased: the confirmation did not match", file=sys.stderr)
            return EXIT_DECLINED
        progress = Progress("erase: sessions", len(keys), quiet=args.json or key is not None)
        events = sessions = 0
        try:
            with MemorySystem(log=log, snapshots=snapshots) as system:
                if key is None:  # a user: their data keys go first, so no copy of their events opens
                    system.shred_user(args.tenant, args.user)
                for done, each in enumerate(keys, start=1):
                    erased = system.erase(each)
                    events += erased.events_purged
                    sessions += erased.sessions
                    progress.update(done)
        finally:
            progress.close()
    if args.json:
        emit_json({"events_purged": events, "sessions": sessions})
    else:
        print(f"erased {what}: {events} events purged from {sessions} session(s)")
    return EXIT_OK


def event_count(log: EventLog, key: MemoryKey | None, scope: dict[str, Any]) -> int:
    """How many events a read of `key` (or of the scope) will bring, to size a progress bar."""
    if key is not None:
        return len(log.read(key)) if isinstance(log, InMemoryEventLog) else _counts(log, scope, key)
    return _counts(log, scope, None)


def _counts(log: EventLog, scope: dict[str, Any], key: MemoryKey | None) -> int:
    counts = session_counts(log, **scope)
    return counts.get(key, 0) if key is not None else sum(counts.values())
