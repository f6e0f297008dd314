"""The bounds of the runtime's numeric settings, and the checks every entry point shares.

A number from outside (a `MemorySystem` or `connect()` keyword, a handle call's
``timeout``, a CLI flag or ``CONVMEM_*`` variable, a summarizer's option) is
checked where it comes in, against a bound that keeps the process working:

- seconds: above 0 (or 0 where 0 means "none") and at most a day
  (`MAX_TIMEOUT_SECONDS`): past about 9.2e9 seconds a thread's wait overflows
  ``time_t`` (a dead timer thread stops every timer of the system), and a
  longer wait is a hang, not a setting;
- threads: at most `MAX_ACTOR_THREADS` (each is a thread);
- counts of things kept in memory (live sessions, queued summaries): at most
  `MAX_LIVE_SESSIONS` / `MAX_QUEUED`;
- NaN, the infinities and bools (``True`` is an int to Python) are refused.

A refusal is `InvalidConfig` (an `InvalidInput`) naming the setting and its
bound, raised before anything starts or is stored.
"""

from __future__ import annotations

import math

from convmem.errors import InvalidConfig, InvalidInput
from convmem.events import MAX_WAIT_SECONDS
from convmem.events._config import shown

__all__ = [
    "MAX_ACTOR_THREADS",
    "MAX_CACHE_BYTES",
    "MAX_LIVE_SESSIONS",
    "MAX_QUEUED",
    "MAX_REPLICAS",
    "MAX_SNAPSHOT_EVERY",
    "MAX_TIMEOUT_SECONDS",
    "check_count",
    "check_seconds",
    "check_timeout",
]

MAX_TIMEOUT_SECONDS = MAX_WAIT_SECONDS
"""The longest wait a setting or a call may ask for (a day): longer ones overflow the platform's waits."""
MAX_ACTOR_THREADS = 4096
"""The most actor threads (and summarizer workers, and abandoned summarizer calls) a system starts:
each is a thread."""
MAX_LIVE_SESSIONS = 1_000_000
"""The most session actors a system keeps live (each holds its state in memory)."""
MAX_QUEUED = 1_000_000
"""The most summary jobs a system queues (each holds its request in memory)."""
MAX_REPLICAS = 5
"""The most replicas of a stream or bucket (JetStream keeps at most 5)."""
MAX_SNAPSHOT_EVERY = 1_000_000
"""The most events between two snapshots: a reactivation replays up to that many."""
MAX_CACHE_BYTES = 1 << 60
"""The largest byte bound a cache takes (1 EiB: far past any machine's memory, far within an int64)."""


def check_count(field: str, value: object, *, least: int = 1, most: int) -> int:
    """`value` if it is a whole number from `least` to `most` (not a bool); `InvalidConfig` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidConfig(field, f"must be a whole number from {least} to {most:,}, got {shown(value)}")
    return value


def check_seconds(
    field: str,
    value: object,
    *,
    most: float = MAX_TIMEOUT_SECONDS,
    zero: bool = False,
    error: type[InvalidInput] = InvalidConfig,
) -> float:
    """`value` if it is a number of seconds above 0 (or 0, with `zero`) and at most `most` (a day); NaN,
    the infinities and bools are refused with `error` (`InvalidConfig`; a call's own argument:
    `InvalidInput`)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and math.isnan(value))
        or not (value >= 0 if zero else value > 0)
        or value > most
    ):
        least = ">= 0" if zero else "> 0"
        day = " (a day)" if most == MAX_TIMEOUT_SECONDS else ""
        raise error(field, f"must be seconds {least} and <= {most:g}{day}, got {shown(value)}")
    return float(value)


def check_timeout(timeout: object) -> None:
    """`InvalidConfig` unless `timeout` is a number of seconds above 0 and at most a day (NaN refused)."""
    check_seconds("timeout", timeout)
