"""`convmem retention`: apply the retention policies once, as a dry run or for real.

The policies come from a TOML or JSON file (``--policy``, or
``CONVMEM_RETENTION``), the same file `convmem serve --retention` sweeps
with. ``--dry-run`` lists what would happen and writes nothing (the stream
and the bucket are not even created); ``--apply`` does it: idle sessions go
through the normal erasure, histories over a cap are compacted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from convmem.actors import MemorySystem, RetentionReport, sweep_retention
from convmem.adapters.frontends.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    Progress,
    backend,
    emit_json,
    parse_time,
    read_document,
    table,
)
from convmem.events import RetentionPolicies

__all__ = ["RETENTION_ENV", "add_retention_command", "load_retention"]

RETENTION_ENV = "CONVMEM_RETENTION"


def load_retention(path: Path) -> RetentionPolicies:
    """The policies in `path` (TOML, or JSON for any other suffix); errors name the file and the key."""
    data = read_document(path, "retention policy file")
    try:
        return RetentionPolicies.parse(data)
    except ValueError as exc:
        raise CliError(f"retention policies {path}: {exc}", EXIT_INVALID) from None


def add_retention_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `retention` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser(
        "retention",
        parents=[common],
        help="apply the retention policies once: erase idle sessions, compact long histories",
    )
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="list what would happen; write nothing")
    mode.add_argument("--apply", action="store_true", help="erase and compact as the policies say")
    p.add_argument(
        "--policy",
        type=Path,
        default=os.environ.get(RETENTION_ENV) or None,
        help=f"TOML or JSON file of retention policies (env {RETENTION_ENV})",
    )
    p.add_argument("--tenant", help="only this tenant's sessions")
    p.add_argument(
        "--as-of",
        help="with --dry-run: apply the policies as of this time (epoch seconds or ISO 8601; default now)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_retention)


def cmd_retention(args: argparse.Namespace) -> int:
    if args.policy is None:
        raise CliError(f"say which policies to apply: --policy FILE (or {RETENTION_ENV})", EXIT_USAGE)
    if args.as_of and not args.dry_run:
        raise CliError("--as-of goes with --dry-run only: --apply acts as of now", EXIT_USAGE)
    policies = load_retention(args.policy)
    progress = Progress("retention: sessions", quiet=args.json)

    def advance(done: int, total: int) -> None:
        if progress.total != total:
            progress.set_total(total)
        progress.update(done)

    try:
        if args.dry_run:
            now = parse_time(args.as_of) if args.as_of else time.time()
            with backend(args, read_only=True) as (log, snapshots):
                report = sweep_retention(
                    log,
                    policies,
                    now=now,
                    dry_run=True,
                    snapshots=snapshots,  # read only: names a session known only by its snapshot
                    tenant_id=args.tenant,
                    progress=advance,
                )
        else:
            with backend(args) as (log, snapshots), MemorySystem(log=log, snapshots=snapshots) as system:
                report = system.sweep_retention(policies=policies, tenant_id=args.tenant)
    finally:
        progress.close()
    if args.json:
        emit_json({**msgspec.to_builtins(report), "summary": report.summary()})
    else:
        _print(report, policies)
    return EXIT_FAILED if report.problems else EXIT_OK


def _print(report: RetentionReport, policies: RetentionPolicies) -> None:
    for line in policies.describe():
        print(f"policy {line}")
    rows = []
    for o in report.outcomes:
        status = "would" if report.dry_run else "done"
        if o.skipped is not None:
            status = f"skipped: {o.skipped}"
        turns = f"{o.turns_kept} kept, {o.turns_dropped} dropped" if o.action == "compact" else "-"
        rows.append((o.key.composite(), o.action, status, o.events_removed, turns, o.reason))
    if rows:
        table(rows, ["session", "action", "status", "events", "turns", "why"])
    for problem in report.problems:
        print(f"convmem: left alone {problem.key.composite()}: {problem.problem}", file=sys.stderr)
    print(("dry run: " if report.dry_run else "") + report.summary())
