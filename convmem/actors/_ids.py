"""Command ids for writes made without an idempotency key: unique across the log, cheap to make."""

from __future__ import annotations

import itertools
import os

__all__ = ["new_command_id"]


class _CommandIds:
    """Log-wide unique command ids: 64 random bits drawn once per process, then a counter.

    As unique as `uuid4().hex` for the log's deduplication (same 32 hex digits)
    without reading the system's random source on every write. A forked child
    draws its own random bits, or parent and child would repeat each other's ids.
    """

    def __init__(self) -> None:
        self._draw()
        os.register_at_fork(after_in_child=self._draw)

    def _draw(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._numbers = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._numbers):016x}"


new_command_id = _CommandIds()
