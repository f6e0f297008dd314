"""`convmem fork`: a new session that starts where another one was, at a position or a time of its past."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from convmem.actors import MemorySystem
from convmem.adapters.frontends.cli._as_of import moment_through, parse_through
from convmem.adapters.frontends.cli._common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    CliError,
    backend,
    emit_json,
    parse_key,
    positive_int,
)

__all__ = ["add_fork_command"]


def add_fork_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register `fork` on the CLI's subparsers (`common`: the global options)."""
    p = commands.add_parser(
        "fork", parents=[common], help="start a new session as another one was at a point of its past"
    )
    p.add_argument("key", help="the session to fork, tenant:user:session")
    p.add_argument("--to", required=True, help="the new session, tenant:user:session (must have no events)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--position", type=positive_int, help="as of this log position (default: now)")
    when.add_argument(
        "--time", help="as of this time: epoch seconds, or ISO 8601 through its last digit (as replay --time)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_fork)


def cmd_fork(args: argparse.Namespace) -> int:
    key, to = parse_key(args.key), parse_key(args.to)
    at: int | datetime | None = args.position
    if args.time:
        at = moment_through(parse_through(args.time))  # through its last digit, as replay --time
    with backend(args) as (log, snapshots):
        if log.last_seq(key) == 0:
            raise CliError(f"no events for session {key.composite()}: nothing to fork", EXIT_NOT_FOUND)
        with MemorySystem(log=log, snapshots=snapshots) as system:
            forked = system.fork(key, to=to, at=at)
    if args.json:
        emit_json({"key": to.composite(), "events": forked.events, "forked_at": forked.forked_at})
    else:
        print(
            f"forked {key.composite()} as of position {forked.forked_at} into {to.composite()}: "
            f"{forked.events} events"
        )
    return EXIT_OK
