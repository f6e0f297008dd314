"""What an "as of" time given on the command line covers (replay and fork --time, inspect --until).

A time names a moment as precisely as it is written. `inspect` and the timeline show event times cut
to milliseconds, so an auditor who reads ``10:00:00.123`` there and asks for the state as of that
time asks for every event shown so: an ISO 8601 time covers its last written digit. Epoch seconds
(what scripts pass, from ``--json``'s ``at``) are exact.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from convmem.adapters.frontends.cli._common import parse_time

__all__ = ["as_of", "moment_through", "parse_through"]

_TIME_OF_DAY = re.compile(r"[T ](\d{2})(?::?(\d{2})(?::?(\d{2})(?:[.,](\d+))?)?)?")


def as_of(text: str) -> tuple[float, float]:
    """The moments a time as written covers, first and last, for "as of" bounds (replay and fork
    --time, inspect --until): epoch seconds exactly (first == last); an ISO 8601 time through its
    last written digit, so ``10:00:00.123Z`` holds every event `inspect` and the timeline show as
    ``10:00:00.123`` (they cut times to milliseconds), ``10:00:00Z`` every event of that second,
    ``10:00Z`` of that minute, a date its whole day."""
    start = parse_time(text)
    try:
        float(text)
    except ValueError:
        pass
    else:
        return start, start
    clock = _TIME_OF_DAY.search(text)
    if clock is None:
        unit = 86400.0
    elif clock.group(4):
        unit = 10.0 ** -len(clock.group(4))
    else:
        unit = 1.0 if clock.group(3) else 60.0 if clock.group(2) else 3600.0
    return start, math.nextafter(start + unit, -math.inf)


def parse_through(text: str) -> float:
    """The last moment a time as written covers (`as_of`)."""
    return as_of(text)[1]


def moment_through(through: float) -> datetime:
    """`through` as a datetime (microseconds) that is not after it: a fork's bound."""
    moment = datetime.fromtimestamp(through, tz=UTC)
    return moment - timedelta(microseconds=1) if moment.timestamp() > through else moment
