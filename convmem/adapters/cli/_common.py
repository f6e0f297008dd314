"""What every `convmem` command shares: errors, exit codes, output, progress, the backend."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from convmem.actors import EventLog, SnapshotStore
from convmem.adapters._connect import open_backend
from convmem.errors import InvalidInput
from convmem.events import MemoryKey

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CliError",
    "Progress",
    "backend",
    "emit_json",
    "parse_key",
    "parse_time",
    "table",
]

EXIT_OK = 0
EXIT_FAILED = 1  # verification found a mismatch or poison
EXIT_USAGE = 2  # bad arguments (argparse's own code)
EXIT_NOT_FOUND = 3  # the key or user has no events
EXIT_UNAVAILABLE = 4  # the NATS server or log cannot be reached
EXIT_INVALID = 5  # an input (file, key, data) is wrong
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure the CLI reports as one line, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


def parse_key(text: str) -> MemoryKey:
    """A `MemoryKey` from ``tenant:user:session`` (``\\:`` escapes a colon inside an id)."""
    try:
        return MemoryKey.from_composite(text)
    except InvalidInput as exc:
        raise CliError(f"bad key {text!r}: {exc} (write it as tenant:user:session)", EXIT_USAGE) from None


def parse_time(text: str) -> float:
    """Epoch seconds from a number or an ISO 8601 time (UTC when no zone is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"bad time {text!r}: use epoch seconds or ISO 8601 (2026-11-21T10:00:00Z)", EXIT_USAGE
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@contextmanager
def backend(args: argparse.Namespace) -> Iterator[tuple[EventLog, SnapshotStore | None]]:
    """The log and snapshot store the global options name; closed on exit."""
    opened = open_backend(
        args.nats,
        data_dir=args.data_dir,
        stream=args.stream,
        prefix=args.prefix,
        bucket=args.bucket,
        timeout=args.timeout,
    )
    try:
        yield opened.log, opened.snapshots
    finally:
        opened.close()


def emit_json(data: Any, out: TextIO | None = None) -> None:
    """One JSON document on stdout."""
    stream = out or sys.stdout
    json.dump(data, stream, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    stream.write("\n")


def table(rows: Sequence[Sequence[object]], headers: Sequence[str], out: TextIO | None = None) -> None:
    """A plain aligned text table."""
    stream = out or sys.stdout
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        stream.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
        if n == 0:
            stream.write("  ".join("-" * w for w in widths) + "\n")


class Progress:
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str, total: int | None = None, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream or sys.stderr
        self._live = self._stream.isatty() and os.environ.get("CONVMEM_NO_PROGRESS") is None
        self._last = -1

    def update(self, done: int) -> None:
        """Show `done` of `total`."""
        self.done = done
        if not self._live:
            return
        if self.total:
            percent = int(100 * done / self.total)
            if percent == self._last:
                return
            self._last = percent
            filled = percent // 4
            bar = "#" * filled + "." * (25 - filled)
            self._stream.write(f"\r{self.label} [{bar}] {done}/{self.total}")
        else:
            self._stream.write(f"\r{self.label} {done}")
        self._stream.flush()

    def close(self) -> None:
        """End the line."""
        if self._live:
            self._stream.write("\n")
            self._stream.flush()
