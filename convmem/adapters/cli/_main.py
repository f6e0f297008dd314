"""The `convmem` command line: the demo, the service, and the auditor's commands.

Exit codes: 0 done; 1 verification found a problem (or a demo session did not
verify); 2 bad arguments; 3 the key or user has no events; 4 the NATS server
or log cannot be reached; 5 an input is wrong (file, data); 130 interrupted.
Errors are one line on stderr saying what to do; no tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from convmem import __version__
from convmem.adapters.cli._audit import add_audit_commands
from convmem.adapters.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_UNAVAILABLE,
    CliError,
)
from convmem.adapters.cli._demo import add_demo_command
from convmem.adapters.cli._serve import add_serve_command
from convmem.errors import ConvmemError, LogUnavailable

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="convmem",
        description="Short-term conversation memory for LLM planners, event-sourced on NATS JetStream.",
        epilog="Exit codes: 0 ok, 1 verification failed, 2 usage, 3 not found, 4 unreachable, "
        "5 invalid input, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"convmem {__version__}")
    parser.add_argument(
        "--nats",
        default=os.environ.get("CONVMEM_NATS_URL") or None,
        help="NATS URL of an existing server or cluster, or memory:// (default: the embedded server; "
        "env CONVMEM_NATS_URL)",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("CONVMEM_DATA_DIR") or None,
        help="the embedded server's data folder (default: a per-user folder; env CONVMEM_DATA_DIR)",
    )
    parser.add_argument(
        "--stream", default=os.environ.get("CONVMEM_STREAM") or None, help="event stream name"
    )
    parser.add_argument(
        "--prefix", default=os.environ.get("CONVMEM_PREFIX") or None, help="event subject prefix"
    )
    parser.add_argument(
        "--bucket", default=os.environ.get("CONVMEM_BUCKET") or None, help="snapshot bucket name"
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the server (default 5)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_demo_command(commands)
    add_audit_commands(commands)
    add_serve_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except CliError as exc:
        print(f"convmem: error: {exc}", file=sys.stderr)
        return exc.code
    except LogUnavailable as exc:
        print(f"convmem: error: {exc}", file=sys.stderr)
        print("convmem: is the NATS server up? check --nats / CONVMEM_NATS_URL", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (ConvmemError, ValueError) as exc:
        print(f"convmem: error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print("convmem: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    return code
