"""The auditor's commands: replay, verify, export, erase, restore, repair (inspect and sessions are in
`_inspect`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import (
    Erased,
    ErasureJournal,
    ErasureRequest,
    EventLog,
    LoggedEvent,
    MemorySystem,
    PoisonEvent,
    SnapshotStore,
    export_jsonl,
    plan_repair,
    read_scope,
    replay_session,
    replayed_context,
    restore_lost,
    verify,
)
from convmem.actors._journal import (
    DamagedRecord,
    ErasureJournalDamaged,
    JournaledLog,
    erasure_after,
    readable_pending,
    readable_receipts,
    receipts_mark,
)
from convmem.adapters.backends import InMemoryEventLog, default_export_registry
from convmem.adapters.frontends.cli._as_of import as_of
from convmem.adapters.frontends.cli._common import (
    EXIT_DAMAGED,
    EXIT_DECLINED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    Progress,
    backend,
    damage_line,
    emit_json,
    history_line,
    history_lost,
    journal_lost,
    journal_lost_line,
    open_store,
    parse_key,
    positive_int,
    read_session,
    session_counts,
    table,
    tallies_damaged,
    tally_damaged_line,
)
from convmem.adapters.frontends.cli._inspect import records_from_file
from convmem.adapters.frontends.cli._readable import readable
from convmem.adapters.frontends.cli._replayed import gone_reason, query_text, replay_point, same_time_note
from convmem.adapters.frontends.cli._safe import json_text
from convmem.errors import ConvmemError, SessionDamaged, StoreNotFound
from convmem.events import MemoryKey
from convmem.projections import agent_items

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
    when.add_argument(
        "--time",
        help="stop after this time: epoch seconds, or ISO 8601 through its last digit "
        "(10:00:00.123Z: every event inspect shows at that millisecond)",
    )
    p.add_argument("--from-file", type=Path, help="read events from a JSONL export instead of the log")
    p.add_argument(
        "--query",
        type=query_text,
        help="the planner's message the context was read with (get_llm_context(query=...)): the lines "
        "recalled for it, as the session served them (at most 8,000 characters)",
    )
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
        "erase",
        parents=[common],
        help="erase a session's or a user's events and snapshots (recorded first; finishes pending ones)",
    )
    p.add_argument("--key", help="one session, tenant:user:session")
    p.add_argument("--tenant", help="the user's tenant")
    p.add_argument("--user", help="every session of this user (needs --tenant)")
    p.add_argument("--resume", action="store_true", help="only finish the erasures left pending")
    p.add_argument(
        "--settle",
        metavar="ID",
        help="then settle the damaged journal record of erasure ID (`erase --resume` names it): "
        "erase its scope in the same command (--key or --tenant/--user) when it is known",
    )
    p.add_argument("--by", help="who asks (kept in the erasure's receipt; default: $USER)")
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
    p.add_argument(
        "--accept-loss",
        action="store_true",
        help="accept that the store lost its events stream or erasure-journal bucket: make it again, "
        "empty (writers refuse to until then, exit 7); then repair the session if one is named",
    )
    p.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_repair)

    p = commands.add_parser(
        "restore",
        parents=[common],
        help="write a lost session's kept snapshot back into the log (when the log lost its events)",
    )
    p.add_argument("key", help="tenant:user:session")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_restore)


def _scope(args: argparse.Namespace) -> dict[str, Any]:
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant (a user id is only unique within its tenant)", EXIT_USAGE)
    return {"tenant_id": args.tenant, "user_id": args.user}


def cmd_replay(args: argparse.Namespace) -> int:
    """The state as of the latest event (a position, a time); exit 7 naming the session's damage when
    verify's check of it finds any (events damaged or missing, the log short of its snapshot: a lost
    session; a damaged snapshot or data key), also when no event of it is left to replay."""
    key = parse_key(args.key)
    span = as_of(args.time) if args.time else None  # a time as written, through its last digit
    until_time = span[1] if span is not None else None
    gone: str | None = None
    if args.from_file:
        records: list[LoggedEvent] = records_from_file(args.from_file)
        state, report = replay_session(records, key, until_position=args.position, until_time=until_time)
        damage = report.damage
        if not state.started and state.version == 0:
            gone = gone_reason(records, key, None)
    else:
        with backend(args, read_only=True, lost_ok=True) as (log, snapshots):
            records, damage = read_session(log, snapshots, key)
            state, report = replay_session(records, key, until_position=args.position, until_time=until_time)
            if not state.started and state.version == 0:  # an erasure or a compaction, named
                gone = gone_reason(
                    records, key, log.erasure_journal() if isinstance(log, JournaledLog) else None
                )
    if not state.started and state.version == 0 and not damage:
        raise CliError(
            gone or f"no events for session {key} (check the key, or --nats/--data-dir)", EXIT_NOT_FOUND
        )
    health = "damaged" if damage else state.health.value
    context = replayed_context(state, query=args.query)  # measured by the counter the session recorded
    folded = replay_point(records, key, state, span)
    result = {
        "key": key.composite(),
        "seq": state.version,
        **folded,
        "health": health,
        "turns": len(state.turns),
        "summary_through": state.summary_through,
        "context": context,
        "agent_items": agent_items(state) if state.config.agents.strategy != "none" else None,
        "poison": [msgspec.to_builtins(p) for p in report.poison],
        "damage": [msgspec.to_builtins(d) for d in damage],
    }
    if args.json:
        emit_json(result)
    else:
        print(f"session {key}  seq {state.version}  health {health}  live turns {len(state.turns)}")
        print(readable(context))  # the context as text: a summary as its lines, not one escaped string
        if folded["same_time"]:
            print(same_time_note(folded["same_time"]), file=sys.stderr)
        for poison in report.poison:
            print(f"{key}: poison at position {poison.position}: {poison.problem}", file=sys.stderr)
        _report_damage(damage)
    return EXIT_DAMAGED if damage else EXIT_OK


def _report_damage(damage: list[PoisonEvent]) -> None:
    """Each damage on stderr as verify names it, then what to do."""
    for each in damage:
        print(damage_line(each), file=sys.stderr)
    if damage:
        print(_DAMAGED_ADVICE, file=sys.stderr)


_DAMAGED_ADVICE = "damaged sessions are refused until repaired: convmem repair tenant:user:session"


def cmd_verify(args: argparse.Namespace) -> int:
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    if key is None and not (args.all or args.tenant):
        raise CliError("say what to verify: a KEY, --tenant [--user], or --all", EXIT_USAGE)
    progress = Progress("verify: events read", quiet=args.json)
    started = time.perf_counter()
    journal_damage: list[DamagedRecord] = []
    journal_gone: str | None = None  # the erasure journal's bucket, lost (`journal_lost`)
    lost: str | None = None  # the log's whole history, when its stream is gone (`history_lost`)
    tally_damage: list[tuple[str, str]] = []  # (bucket, tenant): a tally counted but served by none
    try:
        if args.from_file:
            file_log = InMemoryEventLog()
            for record in records_from_file(args.from_file):
                file_log.append_raw(record.key, record.data, seq=record.seq)
            progress.set_total(event_count(file_log, key, scope))
            checks = verify(file_log, None, key=key, progress=progress.update, **scope)
        else:
            with open_store(args, read_only=True, lost_ok=True) as opened:
                lost = history_lost(opened.log)
                journal_gone = journal_lost(opened.log)
                journal_damage = _verify_journal(opened.journal)
                tally_damage = _tallies_in_scope(opened.log, args, key)
                progress.set_total(event_count(opened.log, key, scope))
                # (A session's check that needs the damaged journal records: ErasureJournalDamaged, exit 7.)
                checks = verify(opened.log, opened.snapshots, key=key, progress=progress.update, **scope)
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    if not checks and not journal_damage and lost is None and journal_gone is None:
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
                "journal_damage": [msgspec.to_builtins(d) for d in journal_damage],
                "history_lost": lost,
                "journal_lost": journal_gone,
                "tally_damage": [tenant_id for _, tenant_id in tally_damage],
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
                print(damage_line(damage))
        for damaged in journal_damage:
            print(f"erasure journal: DAMAGED {damaged.describe()}")
        _print_store_damage(lost, journal_gone, tally_damage)
        print(
            f"{len(checks) - len(failed)}/{len(checks)} sessions verified, {events} events in {elapsed:.2f}s"
            + (
                f"; the erasure journal holds {len(journal_damage)} damaged record(s)"
                if journal_damage
                else ""
            )
        )
    if (
        any(c.damage for c in checks)
        or journal_damage
        or lost is not None
        or journal_gone is not None
        or tally_damage
    ):
        if not args.json:
            if any(c.damage for c in checks):
                print(_DAMAGED_ADVICE)
            if journal_damage:
                print(ErasureJournalDamaged(journal_damage).advice)
        return EXIT_DAMAGED
    return EXIT_FAILED if failed else EXIT_OK


def _tallies_in_scope(
    log: EventLog, args: argparse.Namespace, key: MemoryKey | None
) -> list[tuple[str, str]]:
    """The damaged byte tallies verify names: every tenant's with ``--all``, the tenant's with
    ``--tenant`` alone (as `sessions` of that tenant names it); none for a user or a session."""
    if key is not None or args.user or not (args.all or args.tenant):
        return []
    return [t for t in tallies_damaged(log) if args.all or t[1] == args.tenant]


def _print_store_damage(
    lost: str | None, journal_gone: str | None, tally_damage: list[tuple[str, str]]
) -> None:
    """What verify found wrong beside the sessions: the lost history or journal, damaged tallies."""
    if lost is not None:
        print(history_line(lost))
    if journal_gone is not None:
        print(journal_lost_line(journal_gone))
    for bucket, tenant_id in tally_damage:
        print(tally_damaged_line(bucket, tenant_id))


def _verify_journal(journal: ErasureJournal | None) -> list[DamagedRecord]:
    """The erasure journal's damaged records, pending and receipts (none when there is no journal)."""
    return [] if journal is None else _journal_state(journal)[1]


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
    if args.accept_loss:
        accepted = _accept_loss(args)
        if accepted is not None:
            return accepted
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
        left = [d for c in verify(log, snapshots, key=key) for d in c.damage] if plan.snapshot_problem else []
    if left:  # the repair event is stored, but what verify reports stays: not repaired
        raise CliError(
            f"session {key.composite()} not repaired: its repair is event seq {plan.seq}, but its "
            f"snapshot was not replaced ({plan.snapshot_problem}) and verify still reports "
            f"{'; '.join(d.problem for d in left)}; see `convmem verify {key.composite()}`",
            EXIT_DAMAGED,
        )
    note = f" (its new snapshot was not saved: {plan.snapshot_problem})" if plan.snapshot_problem else ""
    _report_repair(args, plan, f"repaired {what}: the repair is event seq {plan.seq}{note}")
    return EXIT_OK


def _accept_loss(args: argparse.Namespace) -> int | None:
    """`repair --accept-loss`: a lost events stream or erasure journal made again, empty, once the
    operator confirms, each named on stderr; None when a session is named too (repaired next)."""
    named = bool(args.key or args.tenant or args.user or args.session)
    with open_store(args, read_only=True, lost_ok=True) as opened:  # what is lost: nothing made
        gone, journal_gone = history_lost(opened.log), journal_lost(opened.log)
    lost = [
        *([history_line(gone)] if gone is not None else []),
        *([journal_lost_line(journal_gone)] if journal_gone is not None else []),
    ]
    for line in lost:
        print(line, file=sys.stderr)
    accepted: list[str] = []
    if lost and not args.dry_run:
        what = f"the loss of {len(lost)} part(s) of the store (each made again, empty)"
        if not args.yes and not _confirm_repair(what, "accept"):
            print("not accepted: the confirmation did not match", file=sys.stderr)
            return EXIT_DECLINED
        with open_store(args, accept_loss=True) as opened:
            accepted = list(getattr(opened, "accepted_loss", ()))
    if named:
        return None
    if args.json:
        emit_json({"lost": lost, "accepted": accepted})
    elif not lost:
        print("nothing to accept: the store lost neither its events stream nor its erasure journal")
    else:
        done = "would accept" if args.dry_run else "accepted"
        print(f"{done} the loss of {len(lost)} part(s) of the store: each made again, empty")
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
        print(damage_line(damage))
    print(message)


def cmd_export(args: argparse.Namespace) -> int:
    """Write the scope's events; then name each damaged or missing one (verify's check of the same
    records) on stderr and exit 7 if there is any: what could be read is written all the same."""
    scope = _scope(args)
    key = parse_key(args.key) if args.key else None
    count = 0
    began = time.time()  # before anything is read: an erasure finished since then may miss the file
    if args.output:
        # The registry read (and checked) before the file is written: a damaged one (exit 5) would
        # otherwise refuse to record a file already written, which no later erasure would reach.
        default_export_registry().files()
    with backend(args, read_only=True, lost_ok=True) as (log, snapshots):
        # Where the journal's receipts stand before anything is read: a position, not a time.
        mark = receipts_mark(log.erasure_journal() if isinstance(log, JournaledLog) else None)
        total = event_count(log, key, scope)
        if not total:
            return _nothing_to_export(log, snapshots, key, scope)
        out = args.output.open("w", encoding="utf-8") if args.output else sys.stdout
        progress = Progress("export: events", total, quiet=not args.output)
        exported: set[MemoryKey] = set()
        read: list[LoggedEvent] = []
        unreadable: dict[MemoryKey, str] = {}  # sessions whose data key cannot be used: why
        try:
            records = read_scope(log, unreadable, key=key, **scope)
            for line in export_jsonl(_noting(records, exported, read)):
                out.write((line if args.output else json_text(line)) + "\n")  # stdout: no raw controls
                count += 1
                if count % 200 == 0:
                    progress.update(count)
            progress.update(count)
        finally:
            progress.close()
            if args.output:
                out.close()
                # An erasure of any of these sessions rewrites the file without them.
                default_export_registry().record(args.output, exported)
                _erased_meanwhile(log, exported, began, mark)
        checks = verify(log, snapshots, key=key, records=read, key_problems=unreadable, **scope)
        lost = [d for c in checks for d in c.lost]
        # A damaged snapshot costs the export nothing (it writes events), but verify names it: so does this.
        stored = [d for c in checks for d in c.damage if d not in c.lost]
    if not args.output:
        sys.stdout.flush()
    for damage in lost + stored:
        print(damage_line(damage), file=sys.stderr)
    into = f" to {args.output}" if args.output else ""
    if lost:
        sessions = len({d.key for d in lost})
        print(
            f"exported {count} events{into}, but {len(lost)} event(s) of {sessions} session(s) are damaged "
            "or missing (named above): convmem repair tenant:user:session",
            file=sys.stderr,
        )
        return EXIT_DAMAGED
    if stored:
        print(
            f"exported {count} events{into}, every one the log holds, but the snapshot of "
            f"{len({d.key for d in stored})} session(s) is damaged (named above): convmem repair "
            "tenant:user:session",
            file=sys.stderr,
        )
        return EXIT_DAMAGED
    if args.output:
        print(f"exported {count} events{into}", file=sys.stderr)
    return EXIT_OK


def _erased_meanwhile(log: Any, keys: Iterable[MemoryKey], began: float, mark: int | None) -> None:
    """Rewrite the export just recorded without any of `keys` that an erasure covers which was pending
    or finished since the export started reading: kept in the journal after `mark` (`receipts_mark`,
    a position: the eraser's clock may be hours off this one's), or, a journal that cannot mark,
    finished after `began`.

    An erasure rewrites the files the registry lists; one that ran while this export read (or is
    still pending) may have done so before this file was listed, and would leave its lines here.
    """
    journal = log.erasure_journal() if isinstance(log, JournaledLog) else None
    if journal is None:
        return
    registry = default_export_registry()
    for key in sorted(keys, key=str):
        if erasure_after(journal, key, began, mark=mark) is not None:
            registry.erase_copies(
                ErasureRequest.of(key.tenant_id, key.user_id, key.session_id, by="convmem export", at=began)
            )


def _nothing_to_export(
    log: EventLog, snapshots: SnapshotStore | None, key: MemoryKey | None, scope: dict[str, Any]
) -> int:
    """No event to export: exit 3, or 7 naming the loss when the scope's sessions had events that the
    log lost (a session known only by its snapshot, readable or damaged; the whole stream gone). No
    file is written."""
    lost = [d for c in verify(log, snapshots, key=key, **scope) for d in c.damage]
    gone = history_lost(log)
    what = f"session {key.composite()}" if key else "that scope" if scope["tenant_id"] else "the log"
    if not lost and gone is None:
        raise CliError(f"nothing to export: no events for {what}", EXIT_NOT_FOUND)
    for damage in lost:
        print(damage_line(damage), file=sys.stderr)
    if gone is not None:
        print(history_line(gone), file=sys.stderr)
    print(
        f"nothing exported: the log holds no event of {what}, and its events are lost (named above): "
        "convmem repair tenant:user:session",
        file=sys.stderr,
    )
    return EXIT_DAMAGED


def _noting(
    records: Iterable[LoggedEvent], keys: set[MemoryKey], read: list[LoggedEvent]
) -> Iterator[LoggedEvent]:
    """`records` as they pass, their keys noted in `keys` (the export registry's) and each kept in `read`
    (for the damage check)."""
    for record in records:
        keys.add(record.key)
        read.append(record)
        yield record


def _confirm(what: str, token: str, verb: str = "erase") -> bool:
    if not sys.stdin.isatty():
        raise CliError(f"refusing to {verb} {what} without confirmation: pass --yes", EXIT_USAGE)
    try:
        answer = input(f"{verb.capitalize()} {what}? This cannot be undone. Type {token} to confirm: ")
    except EOFError:  # Ctrl-D: no answer is not a yes
        print(file=sys.stderr)
        return False
    return answer.strip() == token


def _erase_scope(args: argparse.Namespace) -> tuple[MemoryKey | None, bool]:
    """The session `erase` names (None: a user, or none), and whether it only settles a record."""
    if args.resume and (args.key or args.user or args.tenant or args.settle):
        raise CliError(
            "--resume finishes what is pending: give no --key, --tenant, --user or --settle", EXIT_USAGE
        )
    settle_only = bool(args.settle) and not (args.key or args.user)
    if not args.resume and not settle_only and bool(args.key) == bool(args.user):
        raise CliError(
            "say what to erase: --key tenant:user:session, or --tenant T --user U (or --resume)", EXIT_USAGE
        )
    key = parse_key(args.key) if args.key else None
    if settle_only and args.tenant:
        raise CliError("--tenant needs --user", EXIT_USAGE)
    if args.user and not args.tenant:
        raise CliError("--user needs --tenant", EXIT_USAGE)
    return key, settle_only


def cmd_erase(args: argparse.Namespace) -> int:
    key, settle_only = _erase_scope(args)
    by = args.by if args.by is not None else os.environ.get("USER", "")
    with open_store(args) as opened:
        journal = opened.journal
        if journal is None:
            raise CliError(f"{opened.url}: this backend keeps no erasure journal", EXIT_INVALID)
        gone = journal_lost(opened.log)  # its pending erasures with it: said, and exit 7, after the work
        if gone is not None:
            print(journal_lost_line(gone), file=sys.stderr)
        pending, damaged = _journal_state(journal)
        if args.settle and args.settle not in {d.id for d in damaged}:
            raise CliError(
                f"no damaged journal record of erasure {args.settle!r} to settle "
                "(`convmem erase --resume` and `convmem verify --all` name them)",
                EXIT_NOT_FOUND,
            )
        keys: list[MemoryKey] = []
        what = ""
        if settle_only:
            if not args.yes and not _confirm(
                f"the damaged record of erasure {args.settle} (nothing is erased: its scope is not known)",
                args.settle,
                verb="settle",
            ):
                print("not settled: the confirmation did not match", file=sys.stderr)
                return EXIT_DECLINED
        elif not args.resume:
            keys = _erasable(opened.log, opened.snapshots, key, args.tenant, args.user)
            if key is not None:
                what = f"session {key.composite()}"
            else:
                what = f"user {args.user} of tenant {args.tenant} ({len(keys)} session(s))"
            if not keys and not pending and not args.settle:
                raise CliError(f"nothing to erase: no events or snapshots for {what}", EXIT_NOT_FOUND)
            token = key.composite() if key else args.user
            if (keys or args.settle) and not args.yes and not _confirm(what, token):
                print("not erased: the confirmation did not match", file=sys.stderr)
                return EXIT_DECLINED
        # The system finishes the pending erasures as it starts (a crashed erase's, or this one's).
        with MemorySystem(
            log=opened.log,
            snapshots=opened.snapshots,
            journal=journal,
            exports=default_export_registry(),
        ) as system:
            still = len(_journal_state(journal)[0])
            if still and isinstance(system.unfinished_erasures, SessionDamaged):
                raise CliError(  # a copy nats-server can neither read nor erase: damage, named
                    f"{still} pending erasure(s) not finished: {system.unfinished_erasures}; they stay "
                    "pending: run `convmem erase --resume` once that is done",
                    EXIT_DAMAGED,
                )
            if still:
                raise CliError(
                    f"{still} pending erasure(s) could not be finished (see the log above); "
                    "run `convmem erase --resume` again",
                    EXIT_UNAVAILABLE,
                )
            erased = None
            if keys or (args.settle and not settle_only):  # a settled scope is erased again even if empty
                try:
                    erased = (
                        system.erase(key, by=by) if key else system.erase_user(args.tenant, args.user, by=by)
                    )
                except SessionDamaged as exc:  # a copy it could not remove: the erasure stays pending
                    raise CliError(
                        f"not erased: {exc}; the erasure stays pending: run `convmem erase --resume` "
                        "once that is done",
                        EXIT_DAMAGED,
                    ) from None
            if args.settle:
                journal.settle(args.settle, by=by, at=system.clock.now())
        damaged = _journal_state(journal)[1]
    code = _erase_result(args, what, erased, len(pending), damaged)
    return EXIT_DAMAGED if gone is not None else code


def _erase_result(
    args: argparse.Namespace, what: str, erased: Erased | None, resumed: int, damaged: list[DamagedRecord]
) -> int:
    """What `erase` did, on stdout; the journal's damaged records on stderr (exit 7) when there are any."""
    if args.json:
        emit_json(
            {
                "events_purged": erased.events_purged if erased else 0,
                "sessions": erased.sessions if erased else 0,
                "resumed": resumed,
                "settled": args.settle,
                "damaged": [msgspec.to_builtins(d) for d in damaged],
            }
        )
    else:
        if resumed:
            print(f"finished {resumed} pending erasure(s)")
        if erased is not None:
            print(f"erased {what}: {erased.events_purged} events purged from {erased.sessions} session(s)")
        if args.settle:
            print(f"settled the damaged journal record of erasure {args.settle}")
        elif args.resume and not resumed and not damaged:
            print("no pending erasure")
    if damaged:
        _report_journal_damage(damaged, json_output=args.json)
        return EXIT_DAMAGED
    return EXIT_OK


def _journal_state(journal: ErasureJournal) -> tuple[list[ErasureRequest], list[DamagedRecord]]:
    """The pending erasures that read, and every damaged record (pending or receipt) of `journal`."""
    pending, damaged = readable_pending(journal)
    return pending, [*damaged, *readable_receipts(journal)[1]]


def _report_journal_damage(damaged: list[DamagedRecord], *, json_output: bool) -> None:
    """Each damaged journal record on stderr, and what an operator does (`ErasureJournalDamaged.advice`)."""
    for record in damaged:
        print(f"erasure journal: DAMAGED {record.describe()}", file=sys.stderr)
    if not json_output:
        print(ErasureJournalDamaged(damaged).advice, file=sys.stderr)


def _erasable(
    log: EventLog, snapshots: SnapshotStore | None, key: MemoryKey | None, tenant: str, user: str
) -> list[MemoryKey]:
    """What an erase of `key` (or of the user) would find: sessions with events, a snapshot or a part."""
    if key is not None:
        tenant, user = key.tenant_id, key.user_id
    found = set(log.keys(tenant_id=tenant, user_id=user))
    if snapshots is not None:
        found.update(snapshots.keys(tenant_id=tenant, user_id=user))
    if key is not None:
        return [key] if key in found else []
    return sorted(found, key=MemoryKey.composite)


def cmd_restore(args: argparse.Namespace) -> int:
    key = parse_key(args.key)
    with open_store(args) as opened:
        what = f"session {key.composite()} from its snapshot"
        if not args.yes and not _confirm(what, key.composite(), "restore"):
            print("not restored: the confirmation did not match", file=sys.stderr)
            return EXIT_DECLINED
        try:
            restored = restore_lost(opened.log, opened.snapshots, key, now=time.time())
        except StoreNotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
    if args.json:
        emit_json(
            {
                "key": key.composite(),
                "snapshot_seq": restored.snapshot_seq,
                "log_seq": restored.log_seq,
                "seq": restored.seq,
                "turns": restored.turns,
            }
        )
    else:
        print(
            f"restored {key.composite()} from its snapshot at seq {restored.snapshot_seq}: "
            f"{restored.turns} turn(s), the session is at seq {restored.seq}"
        )
    return EXIT_OK


def event_count(log: EventLog, key: MemoryKey | None, scope: dict[str, Any]) -> int:
    """How many events a read of `key` (or of the scope) will bring, to size a progress bar."""
    if key is not None:
        return len(log.read(key)) if isinstance(log, InMemoryEventLog) else _counts(log, scope, key)
    return _counts(log, scope, None)


def _counts(log: EventLog, scope: dict[str, Any], key: MemoryKey | None) -> int:
    counts = session_counts(log, **scope)
    return counts.get(key, 0) if key is not None else sum(counts.values())
