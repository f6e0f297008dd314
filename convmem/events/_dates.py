"""Dates of turns as people read them: ``8 May 2023``, in UTC, from an epoch time (no clock read)."""

from __future__ import annotations

from datetime import UTC, date, datetime

__all__ = ["MONTHS", "date_of", "date_text", "day_text"]

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def date_of(ts: float) -> date | None:
    """The UTC date of epoch seconds `ts`; None for 0 (unknown) or a time no date can hold."""
    if not ts > 0:
        return None
    try:
        return datetime.fromtimestamp(ts, UTC).date()
    except (OverflowError, OSError, ValueError):
        return None


def day_text(day: date) -> str:
    """``8 May 2023``: compact, unambiguous in every locale, and read the same by people and models."""
    return f"{day.day} {MONTHS[day.month - 1]} {day.year}"


def date_text(ts: float) -> str:
    """The UTC date of `ts` as `day_text` writes it, or "" when it is unknown."""
    day = date_of(ts)
    return "" if day is None else day_text(day)
