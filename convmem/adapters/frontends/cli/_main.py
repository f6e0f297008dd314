"""The `convmem` command line: the demo, the service, and the auditor's and operator's commands.

Global options (where to find NATS, how to authenticate, which names) are
accepted before or after the subcommand and listed in every ``--help``. The
exit codes are `_common.EXIT_CODES`; every error is one line on stderr, with
no traceback and no secret.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from convmem._version import __version__
from convmem.actors import ErasureJournalDamaged
from convmem.adapters._auth import NatsAuth, scrub, url_secrets
from convmem.adapters.frontends.cli._audit import add_audit_commands
from convmem.adapters.frontends.cli._common import (
    EXIT_CODES,
    EXIT_DAMAGED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    positive_seconds,
)
from convmem.adapters.frontends.cli._demo import add_demo_command
from convmem.adapters.frontends.cli._fork import add_fork_command
from convmem.adapters.frontends.cli._inspect import add_inspect_commands
from convmem.adapters.frontends.cli._keys import add_keys_command
from convmem.adapters.frontends.cli._retention import add_retention_command
from convmem.adapters.frontends.cli._safe import guarded
from convmem.adapters.frontends.cli._serve import add_serve_command
from convmem.adapters.frontends.cli._timeline import add_timeline_command
from convmem.errors import (
    ConvmemError,
    LogUnavailable,
    OperationTimeout,
    PermissionDenied,
    SessionClosed,
    StoreLost,
    StoreNotFound,
)

__all__ = ["build_parser", "main"]


def _env(*names: str) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every command takes; after a subcommand they override those given before it."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    where = parser.add_argument_group("where the log lives (every command)")
    where.add_argument(
        "-s",
        "--server",
        "--nats",
        dest="nats",
        metavar="URL",
        default=default(_env("CONVMEM_NATS_URL", "NATS_URL")),
        help="NATS URL(s) of an existing server or cluster, or memory:// (default: the embedded server, "
        "or the one `convmem serve` runs on it; env CONVMEM_NATS_URL or NATS_URL)",
    )
    where.add_argument(
        "--data-dir",
        default=default(_env("CONVMEM_DATA_DIR")),
        help="the embedded server's data folder (default: a per-user folder; env CONVMEM_DATA_DIR)",
    )
    where.add_argument(
        "--stream", default=default(_env("CONVMEM_STREAM")), help="event stream name (env CONVMEM_STREAM)"
    )
    where.add_argument(
        "--prefix", default=default(_env("CONVMEM_PREFIX")), help="event subject prefix (env CONVMEM_PREFIX)"
    )
    where.add_argument(
        "--bucket", default=default(_env("CONVMEM_BUCKET")), help="snapshot bucket name (env CONVMEM_BUCKET)"
    )
    where.add_argument(
        "--timeout",
        type=positive_seconds,
        default=default(5.0),
        help="seconds to wait for the server (default 5)",
    )
    keys = parser.add_argument_group("encryption at rest (every command)")
    keys.add_argument(
        "--master-key-file",
        metavar="FILE",
        default=default(_env("CONVMEM_MASTER_KEY_FILE")),
        help="file holding the master key (default: the embedded server's DATA_DIR/master.key, made on first "
        "use; env CONVMEM_MASTER_KEY_FILE)",
    )
    keys.add_argument(
        "--master-key-env",
        metavar="NAME",
        default=default(None),
        help="name of an environment variable holding the master key (default: CONVMEM_MASTER_KEY if set)",
    )
    keys.add_argument(
        "--key-store",
        metavar="DIR|nats[:BUCKET]",
        default=default(_env("CONVMEM_KEY_STORE")),
        help="where the data keys are: a folder, or a NATS key-value bucket (default: DATA_DIR/keys for the "
        "embedded server, else the bucket CONVMEM_KEYS; env CONVMEM_KEY_STORE)",
    )
    keys.add_argument(
        "--no-encryption",
        action="store_true",
        default=default(False),
        help="store new events unencrypted (encrypted ones still need their key to be read)",
    )
    auth = parser.add_argument_group("credentials and TLS (every command; as the nats CLI takes them)")
    env = NatsAuth.from_env()
    auth.add_argument(
        "--creds", metavar="FILE", default=default(env.creds), help="credentials file (NATS_CREDS)"
    )
    auth.add_argument("--nkey", metavar="FILE", default=default(env.nkey), help="nkey seed file (NATS_NKEY)")
    auth.add_argument("--nats-user", default=default(env.user), help="NATS user name (NATS_USER)")
    auth.add_argument("--nats-password", default=default(env.password), help="NATS password (NATS_PASSWORD)")
    auth.add_argument("--tlsca", metavar="FILE", default=default(env.tls_ca), help="CA certificate (NATS_CA)")
    auth.add_argument(
        "--tlscert", metavar="FILE", default=default(env.tls_cert), help="client certificate (NATS_CERT)"
    )
    auth.add_argument(
        "--tlskey", metavar="FILE", default=default(env.tls_key), help="client certificate key (NATS_KEY)"
    )
    auth.add_argument(
        "--inbox-prefix",
        default=default(env.inbox_prefix),
        help="subject prefix of reply inboxes of JetStream reads, for users confined to their own "
        "(NATS_INBOX_PREFIX); the service answers on _INBOX_<tenant> and _OPS_INBOX by itself",
    )


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{message} (see {self.prog} --help)", EXIT_USAGE)

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # Python 3.11's argparse drops a "--" given as an option's value (``--position=--``) and
        # stores [] without calling the option's type: the value is the text "--", checked as any.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    epilog = "exit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
    parser = _Parser(
        prog="convmem",
        description="Short-term conversation memory for LLM planners, event-sourced on NATS JetStream.",
        epilog=epilog,
    )
    parser.add_argument("--version", action="version", version=f"convmem {__version__}")
    _global_options(parser, suppress=False)
    common = _Parser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    add_demo_command(commands, common)
    add_audit_commands(commands, common)
    add_inspect_commands(commands, common)
    add_fork_command(commands, common)
    add_timeline_command(commands, common)
    add_retention_command(commands, common)
    add_serve_command(commands, common)
    add_keys_command(commands, common)
    for sub in commands.choices.values():
        sub.epilog = epilog
    return parser


def _auth(args: argparse.Namespace) -> NatsAuth:
    return NatsAuth(
        creds=args.creds,
        nkey=args.nkey,
        tls_ca=args.tlsca,
        tls_cert=args.tlscert,
        tls_key=args.tlskey,
        user=args.nats_user,
        password=args.nats_password,
        inbox_prefix=args.inbox_prefix,
    )


class _Scrubbed(logging.Filter):
    """Log records with every secret of the command line hidden."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage(), self._secrets)
        record.args = None
        return True


def _logging(command: str, secrets: tuple[str, ...]) -> None:
    """One line per record on stderr, secrets hidden; the service logs more than the other commands."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_Scrubbed(secrets))
    if command == "serve":
        handler.setFormatter(logging.Formatter("convmem serve: %(levelname)s %(name)s: %(message)s"))
        level = logging.INFO
    else:
        handler.setFormatter(logging.Formatter("convmem: %(levelname)s: %(message)s"))
        level = logging.ERROR  # warnings of a one-shot command would only repeat its error
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    logging.getLogger("nats").setLevel(logging.CRITICAL)  # its errors reach us as exceptions


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()) or "failed"


def main(argv: Sequence[str] | None = None, *, interrupted: bool = False) -> int:
    """Run one command; returns its exit code. Nothing it writes holds a raw control character.

    `interrupted`: a Ctrl-C came while the command line loaded (`python -m convmem`); the
    command does not start: exit 130 (`serve`, which had started nothing, stops cleanly: 0).
    """
    root, nats_log = logging.getLogger(), logging.getLogger("nats")
    handlers, level, nats_level = root.handlers[:], root.level, nats_log.level
    try:
        with guarded():
            return _main(argv, interrupted=interrupted)
    finally:  # called in process (a test, an embedding program): its logging is as it was
        root.handlers = handlers
        root.setLevel(level)
        nats_log.setLevel(nats_level)


def _main(argv: Sequence[str] | None = None, *, interrupted: bool = False) -> int:
    secrets: tuple[str, ...] = ()
    try:
        args = build_parser().parse_args(argv)
        if interrupted:
            if args.command == "serve":
                print("convmem serve: SIGINT while starting; stopped (nothing had started)", file=sys.stderr)
                return EXIT_OK
            raise KeyboardInterrupt
        args.auth = _auth(args)
        secrets = (*url_secrets(args.nats), *args.auth.secrets)
        _logging(args.command, secrets)
        code: int = args.run(args)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except CliError as exc:
        return _fail(str(exc), exc.code, secrets)
    except StoreNotFound as exc:
        return _fail(str(exc), EXIT_NOT_FOUND, secrets)
    except ErasureJournalDamaged as exc:  # a command needed the damaged records: damage, with its advice
        return _fail(str(exc), EXIT_DAMAGED, secrets)
    except StoreLost as exc:  # a writer refused to make a lost part of the store again, empty
        return _fail(str(exc), EXIT_DAMAGED, secrets)
    except (LogUnavailable, PermissionDenied, OperationTimeout, SessionClosed) as exc:
        return _fail(f"{exc} (check --server/NATS_URL and the credentials)", EXIT_UNAVAILABLE, secrets)
    except (ConvmemError, ValueError) as exc:
        return _fail(str(exc), EXIT_INVALID, secrets)
    except BrokenPipeError:
        return 0
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"cannot use{where}: {exc.strerror or exc}", EXIT_INVALID, secrets)
    except KeyboardInterrupt:
        print("convmem: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, and the exit code says so
        return _fail(
            f"internal error ({type(exc).__name__}: {exc}); please report it", EXIT_INTERNAL, secrets
        )
    return code


def _fail(message: str, code: int, secrets: tuple[str, ...]) -> int:
    print(f"convmem: error: {scrub(_one_line(message), secrets)}", file=sys.stderr)
    return code
