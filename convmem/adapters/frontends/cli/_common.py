"""What every `convmem` command shares: errors, exit codes, output, progress, the backend."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from convmem.actors import EventLog, LoggedEvent, PoisonEvent, SnapshotStore, verify
from convmem.adapters._files import read_limited
from convmem.adapters.backends import Backend
from convmem.adapters.backends.jetstream import default_store_dir, running_server_url
from convmem.adapters.backends.keys import KeySettings
from convmem.adapters.frontends._connect import open_backend
from convmem.adapters.frontends.cli._safe import json_text, raw_stream, visible
from convmem.errors import EncryptionKeyError, InvalidInput, PermissionDenied
from convmem.events import MemoryKey

__all__ = [
    "EXIT_CODES",
    "EXIT_DAMAGED",
    "EXIT_DECLINED",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "MAX_SECONDS",
    "CliError",
    "Progress",
    "backend",
    "bounded_int",
    "damage_line",
    "emit_json",
    "history_line",
    "history_lost",
    "journal_lost",
    "journal_lost_line",
    "key_settings",
    "nats_url",
    "open_store",
    "parse_key",
    "parse_time",
    "positive_int",
    "positive_seconds",
    "read_document",
    "read_session",
    "session_counts",
    "table",
    "tallies_damaged",
    "tally_damaged_line",
]

MAX_DOCUMENT_BYTES = 1 << 20
"""A config or policy document holds at most this many bytes (1 MiB: far more than any real one)."""

EXIT_OK = 0
EXIT_FAILED = 1  # verification found a mismatch or poison; an unreadable session (retention, sessions)
EXIT_USAGE = 2  # bad arguments
EXIT_NOT_FOUND = 3  # the key or user has no events
EXIT_UNAVAILABLE = 4  # the NATS server or log cannot be reached (or refuses these credentials)
EXIT_INVALID = 5  # an input (file, key, data) is wrong
EXIT_DECLINED = 6  # the confirmation prompt was declined: nothing changed
EXIT_DAMAGED = 7  # damaged or missing events, a damaged snapshot or data key or journal record, a lost part
EXIT_INTERNAL = 70  # a bug
EXIT_INTERRUPTED = 130

EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_FAILED: "verification found a mismatch or a poison event (or a demo session did not verify, "
    "retention left an unreadable session alone, or `sessions` listed one)",
    EXIT_USAGE: "bad arguments",
    EXIT_NOT_FOUND: "the key, user or stream has no events",
    EXIT_UNAVAILABLE: "the NATS server or log cannot be reached, or refuses these credentials",
    EXIT_INVALID: "an input is wrong (a file, data; or the demo's `--data-dir` already holds an earlier "
    "demo run, left as it is)",
    EXIT_DECLINED: "the confirmation prompt was declined; nothing changed",
    EXIT_DAMAGED: "damaged or missing events, a damaged snapshot, data key or byte tally (verify, replay, "
    "inspect, timeline, sessions, export: `convmem repair`), a damaged erasure-journal record, or a "
    "lost events stream or erasure-journal bucket (a writer makes none again: `convmem repair "
    "--accept-loss`)",
    EXIT_INTERNAL: "an internal error (a bug: please report it)",
    EXIT_INTERRUPTED: "interrupted",
}


class CliError(Exception):
    """A failure the CLI reports as one line, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


MAX_SECONDS = 86_400.0
"""The longest wait a seconds option takes (a day; past about 9.2e9 a wait overflows time_t)."""


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds above 0 and at most {MAX_SECONDS:g} (a day)"
        )
    return value


def bounded_int(most: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to `most`."""

    def check(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {most}")
        return value

    return check


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def read_document(path: Path, what: str) -> Any:
    """The TOML (a ``.toml`` file) or JSON document in `path` (`what` it is: ``config file``).

    Every way the file can be wrong is a `CliError` (exit 5) naming it: unreadable, not a regular
    file or over `MAX_DOCUMENT_BYTES`, not UTF-8 (with the line), not valid TOML or JSON (the
    parser's line and column), nested too deeply to parse.
    """
    try:
        raw = read_limited(path, MAX_DOCUMENT_BYTES)
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}", EXIT_INVALID) from None
    except InvalidInput as exc:
        raise CliError(f"cannot read {what} {path}: it {exc.problem}", EXIT_INVALID) from None
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        if kind == "TOML":
            return tomllib.loads(raw.decode("utf-8"))
        return json.loads(raw, object_pairs_hook=_once)
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        raise CliError(
            f"{what} {path} is not valid {kind}: line {line} is not UTF-8 text "
            f"(byte {raw[exc.start]:#04x}, byte {column} of the line)",
            EXIT_INVALID,
        ) from None
    except ValueError as exc:
        raise CliError(f"{what} {path} is not valid {kind}: {exc}", EXIT_INVALID) from None
    except RecursionError:
        raise CliError(
            f"{what} {path} is not valid {kind}: its arrays or tables are nested too deeply", EXIT_INVALID
        ) from None


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (JSON keeps the last of two silently, TOML refuses)."""
    table = dict(pairs)
    if len(table) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"an object holds the key {name!r} twice")
            seen.add(name)
    return table


def parse_key(text: str) -> MemoryKey:
    """A `MemoryKey` from ``tenant:user:session`` (``\\:`` escapes a colon inside an id)."""
    try:
        return MemoryKey.from_composite(text)
    except InvalidInput as exc:
        raise CliError(f"bad key {text!r}: {exc} (write it as tenant:user:session)", EXIT_USAGE) from None


def parse_time(text: str) -> float:
    """Epoch seconds from a number or an ISO 8601 time (UTC when no zone is given)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        try:
            datetime.fromtimestamp(seconds, tz=UTC)
        except (ValueError, OverflowError, OSError):
            raise CliError(
                f"bad time {text!r}: epoch seconds must be finite and within years 1 to 9999", EXIT_USAGE
            ) from None
        return seconds
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"bad time {text!r}: use epoch seconds or ISO 8601 (2026-11-21T10:00:00Z)", EXIT_USAGE
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def nats_url(args: argparse.Namespace) -> str | None:
    """The NATS URL to use: the one given, else that of a server running on the embedded data folder.

    `convmem serve` on the embedded default holds its data folder; the other
    commands join that server rather than start their own on the same folder.
    """
    if args.nats:
        return str(args.nats)
    return running_server_url(args.data_dir)


def key_settings(args: argparse.Namespace) -> KeySettings:
    """Where the master key and the key store are, as the global options say.

    Without ``--server`` the embedded default's data folder holds them (also
    when joining the server `convmem serve` runs on it).
    """
    data_dir = None if args.nats else str(args.data_dir or default_store_dir())
    return KeySettings(
        encrypt=False if args.no_encryption else None,
        master_key_file=args.master_key_file,
        master_key_env=args.master_key_env,
        key_store=args.key_store,
        data_dir=data_dir,
    )


@contextmanager
def backend(
    args: argparse.Namespace, *, read_only: bool = False, lost_ok: bool = False
) -> Iterator[tuple[EventLog, SnapshotStore | None]]:
    """The log and snapshot store the global options name; closed on exit.

    `read_only` (replay, verify, inspect, export, sessions, timeline) never
    creates the stream or the bucket: a missing stream is `StoreNotFound`, or
    damage when the store shows it held sessions (see `open_store`).
    """
    with open_store(args, read_only=read_only, lost_ok=lost_ok) as opened:
        yield opened.log, opened.snapshots


@contextmanager
def open_store(
    args: argparse.Namespace,
    *,
    read_only: bool = False,
    url: str | None = None,
    lost_ok: bool = False,
    accept_loss: bool = False,
) -> Iterator[Backend]:
    """The whole backend the global options name (log, snapshots, erasure journal); closed on exit.

    `url` overrides where the options say the server is. A reader's log whose history is lost
    (`history_lost`: its stream is gone, the rest of the store is not) is a `CliError` saying so
    (exit 7), unless the command names that damage itself (`lost_ok`: verify, sessions and the
    auditor's views). A writer refuses a lost events stream or erasure journal (`StoreLost`, exit 7)
    unless `accept_loss` (``convmem repair --accept-loss``): then it makes it again, empty.
    """
    opened = open_backend(
        url if url is not None else nats_url(args),
        data_dir=args.data_dir,
        stream=args.stream,
        prefix=args.prefix,
        bucket=args.bucket,
        timeout=args.timeout,
        auth=args.auth,
        read_only=read_only,
        keys=key_settings(args),
        accept_loss=accept_loss,
    )
    try:
        lost = history_lost(opened.log)
        if lost is not None and not lost_ok:
            raise CliError(lost, EXIT_DAMAGED)
        yield opened
    finally:
        opened.close()


def history_lost(log: EventLog) -> str | None:
    """Why `log` holds none of its sessions' history though the store shows it had some (its stream
    is gone: see `JetStreamBackend`'s `read_only`); None otherwise."""
    lost = getattr(log, "history_lost", None)
    return lost if isinstance(lost, str) else None


def journal_lost(log: EventLog) -> str | None:
    """Why `log`'s erasure journal bucket, missing when the backend opened, was lost (its stream and
    snapshot bucket hold messages: `JetStreamBackend` checks); None otherwise."""
    lost = getattr(log, "journal_lost", None)
    return lost if isinstance(lost, str) else None


def journal_lost_line(lost: str) -> str:
    """The lost erasure journal as the commands name it (as `history_line` names a lost stream)."""
    return f"erasure journal: DAMAGED: {lost}"


def tallies_damaged(log: EventLog) -> list[tuple[str, str]]:
    """(the byte tallies' stream, a tenant whose tally it counts but serves none of) for each such
    tenant of a log that keeps shared byte tallies (JetStream); none for one that keeps none."""
    damaged = getattr(log, "damaged_usage_tallies", None)
    if damaged is None:
        return []
    bucket = str(getattr(log, "usage_bucket", ""))
    try:
        tenants: list[str] = damaged()
    except PermissionDenied:  # these credentials may not read the tallies (an auditor's): nothing known
        return []
    return [(bucket, tenant_id) for tenant_id in tenants]


def tally_damaged_line(bucket: str, tenant_id: str) -> str:
    """A damaged byte tally as verify names it, with its repair."""
    return (
        f"byte tally: DAMAGED: tenant {tenant_id!r} in {bucket}: the stream counts its tally but serves "
        f"none (service instances count the tenant in full); repair: nats stream purge {bucket}"
    )


def history_line(lost: str) -> str:
    """The lost history as the auditor's commands name it (as `damage_line` names a session's)."""
    return f"events stream: DAMAGED: {lost}"


def session_counts(
    log: EventLog, *, tenant_id: str | None = None, user_id: str | None = None
) -> dict[MemoryKey, int]:
    """Events per session (of a tenant, of a user) from a log that counts them without reading."""
    counts = getattr(log, "counts", None)
    if counts is None:
        raise CliError(f"{type(log).__name__} cannot count its sessions' events", EXIT_INVALID)
    found: dict[MemoryKey, int] = counts(tenant_id=tenant_id, user_id=user_id)
    return found


def read_session(
    log: EventLog, snapshots: SnapshotStore | None, key: MemoryKey
) -> tuple[list[LoggedEvent], list[PoisonEvent]]:
    """The session's records, and its damaged or missing events (and damaged snapshot or data key):
    verify's check of the session. No record when its data key cannot be used (the damage names
    it); a key error that is no session's (no master key given) is raised, as a read raises it."""
    try:
        records = log.read(key)
    except EncryptionKeyError:  # verify's check reads it again: whose key, or raised again
        records = None
    damage = [d for check in verify(log, snapshots, key=key, records=records) for d in check.damage]
    lost = history_lost(log)
    if lost is not None:  # whatever events the session had went with the stream
        damage.append(PoisonEvent(key=key, position=0, seq=None, problem=lost))
    return records or [], damage


def damage_line(damage: PoisonEvent) -> str:
    """One damage as verify names it: ``KEY: DAMAGED seq 3, position 12: what failed``."""
    parts = [
        f"seq {damage.seq}" if damage.seq is not None else "",
        f"position {damage.position}" if damage.position else "",
    ]
    where = ", ".join(p for p in parts if p)
    return f"{damage.key}: DAMAGED{f' {where}' if where else ''}: {damage.problem}"


def emit_json(data: Any, out: TextIO | None = None) -> None:
    """One JSON document on stdout."""
    stream = out or sys.stdout
    text = json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    stream.write(json_text(text) + "\n")


def table(rows: Sequence[Sequence[object]], headers: Sequence[str], out: TextIO | None = None) -> None:
    """A plain aligned text table; control characters in a cell are shown as escapes (`visible`)."""
    stream = out or sys.stdout
    cells = [[visible(h) for h in headers], *[[visible(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        stream.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if n == 0:
            stream.write("  ".join("-" * w for w in widths) + "\n")


class Progress:
    """A progress bar with a total and an ETA on stderr when it is a terminal; silent otherwise.

    Silent too with ``--json`` (`quiet`) or ``CONVMEM_NO_PROGRESS`` set.
    """

    def __init__(
        self, label: str, total: int | None = None, *, quiet: bool = False, stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        out = stream or sys.stderr
        self._bar: RichProgress | None = None
        if not quiet and out.isatty() and os.environ.get("CONVMEM_NO_PROGRESS") is None:
            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(file=raw_stream(out)),  # its own escape codes, around our label
                transient=False,
            )
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def set_total(self, total: int) -> None:
        """The total, once it is known."""
        self.total = total
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def update(self, done: int) -> None:
        """Show `done` of `total`."""
        self.done = done
        if self._bar is not None:
            self._bar.update(self._task, completed=done)

    def close(self) -> None:
        """End the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
