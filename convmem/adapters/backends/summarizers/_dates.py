"""Dates for summaries: a turn's day, a compact way to write it, and relative words made absolute.

All in UTC and pure: a turn's ``ts`` (epoch seconds, 0 for unknown) is the
only clock. Days are proleptic Gregorian ordinals (`datetime.date.toordinal`).

`resolve` appends the absolute date after the relative expressions whose
meaning the turn's date fixes: "yesterday (7 May 2023)", "last week (week of
1 May 2023)", "last Friday (5 May 2023)", "two days ago (6 May 2023)", "next
month (June 2023)". What the date does not fix is left as said: "next Friday"
(this coming one, or the one after?), "this weekend" on a weekday, a bare
"Friday", "the last week of June" (the last of something, not the past).
"""

from __future__ import annotations

import re
from datetime import date

from convmem.events._dates import MONTHS, date_of, day_text

__all__ = ["day_of", "format_day", "parse_day", "resolve"]

_MONTH_NUMBER = {name: i + 1 for i, name in enumerate(MONTHS)}
_WEEKDAYS = {
    "monday": 0,
    "mon": 0,
    "tuesday": 1,
    "tue": 1,
    "tues": 1,
    "wednesday": 2,
    "wed": 2,
    "thursday": 3,
    "thu": 3,
    "thur": 3,
    "thurs": 3,
    "friday": 4,
    "fri": 4,
    "saturday": 5,
    "sat": 5,
    "sunday": 6,
    "sun": 6,
}
_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_DAY_TEXT = re.compile(r"(\d{1,2}) ([A-Z][a-z]+) (\d{1,4})")
_TRIGGER = re.compile(r"yesterday|tomorrow|ago\b|last|next|past|from now", re.IGNORECASE)
_AMOUNT = r"(?P<n>\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_UNIT = r"(?P<unit>day|week|month|year)s?"
_WEEKDAY = r"(?P<weekday>" + "|".join(sorted(_WEEKDAYS, key=len, reverse=True)) + r")\.?"
_RELATIVE = re.compile(
    r"\b(?:"
    r"(?P<before_yesterday>the day before yesterday)"
    r"|(?P<after_tomorrow>the day after tomorrow)"
    r"|(?P<yesterday>yesterday|last night)"
    r"|(?P<tomorrow>tomorrow)"
    rf"|{_AMOUNT} {_UNIT} (?P<direction>ago|from now)"
    rf"|(?:last|this past) {_WEEKDAY}"
    r"|(?P<last>last) (?P<last_unit>weekend|week|month|year)"
    r"|(?P<next>next) (?P<next_unit>week|month|year)"
    r")\b",
    re.IGNORECASE,
)
_NOT_THE_PAST = frozenset(
    [
        "the",
        "my",
        "your",
        "his",
        "her",
        "its",
        "our",
        "their",
        "this",
        "that",
        "these",
        "those",
        "a",
        "an",
        "every",
        "each",
        "whole",
        "entire",
        "very",
    ]
)
"""Words that make "last week" mean the last of something ("the last week of June", "my last year")."""


def day_of(ts: object) -> int | None:
    """The UTC day of an epoch time, or None when it is unknown (0, missing, not a number)."""
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return None
    day = date_of(ts)
    return None if day is None else day.toordinal()


def format_day(day: int) -> str:
    """``8 May 2023``, as the context writes a turn's date."""
    return day_text(date.fromordinal(day))


def parse_day(text: str) -> int | None:
    """The day written by `format_day`, or None."""
    match = _DAY_TEXT.fullmatch(text)
    if match is None or match.group(2) not in _MONTH_NUMBER:
        return None
    try:
        return date(int(match.group(3)), _MONTH_NUMBER[match.group(2)], int(match.group(1))).toordinal()
    except ValueError:
        return None


def _month(d: date, shift: int) -> str | None:
    index = d.year * 12 + d.month - 1 + shift
    year, month = divmod(index, 12)
    return f"{MONTHS[month]} {year}" if 1 <= year <= 9999 else None


def _year(year: int) -> str | None:
    return str(year) if 1 <= year <= 9999 else None


def _week(day: int) -> str:
    return "week of " + format_day(day - date.fromordinal(day).weekday())


def _absolute(match: re.Match[str], today: date, day: int) -> str | None:
    """What the matched expression means, said absolutely, or None when the date does not fix it."""
    groups = match.groupdict()
    if groups["before_yesterday"]:
        return format_day(day - 2)
    if groups["after_tomorrow"]:
        return format_day(day + 2)
    if groups["yesterday"]:
        return format_day(day - 1)
    if groups["tomorrow"]:
        return format_day(day + 1)
    if groups["n"]:
        n = int(groups["n"]) if groups["n"].isdigit() else _NUMBERS[groups["n"].lower()]
        if n == 0:
            return None
        sign = -1 if groups["direction"].lower() == "ago" else 1
        unit = groups["unit"].lower()
        if unit == "day":
            return format_day(day + sign * n)
        if unit == "week":
            return _week(day + sign * 7 * n)
        if unit == "month":
            return _month(today, sign * n)
        return _year(today.year + sign * n)
    if groups["weekday"]:
        back = (today.weekday() - _WEEKDAYS[groups["weekday"].lower()]) % 7 or 7
        return format_day(day - back)
    unit = (groups["last_unit"] or groups["next_unit"]).lower()
    sign = -1 if groups["last"] else 1
    if unit == "weekend":
        return "weekend of " + format_day(day - today.weekday() - 2)  # the Saturday before this week
    if unit == "week":
        return _week(day + sign * 7)
    if unit == "month":
        return _month(today, sign)
    return _year(today.year + sign)


def resolve(sentence: str, day: int) -> str:
    """`sentence` with the absolute date after each relative expression its day fixes."""
    if sentence.isascii():  # ASCII: lower() is exact, so `_TRIGGER`'s words are plain substring tests
        lowered = sentence.lower()
        if not (
            "ago" in lowered
            or "last" in lowered
            or "next" in lowered
            or "past" in lowered
            or "yesterday" in lowered
            or "tomorrow" in lowered
            or "from now" in lowered
        ):
            return sentence
    elif not _TRIGGER.search(sentence):
        return sentence
    today = date.fromordinal(day)
    out: list[str] = []
    end = 0
    for match in _RELATIVE.finditer(sentence):
        before = sentence[: match.start()].split()
        if before and before[-1].lower() in _NOT_THE_PAST:
            continue
        if sentence[match.end() : match.end() + 2] == " (":
            continue  # already explained
        try:
            absolute = _absolute(match, today, day)
        except (ValueError, OverflowError):  # beyond year 1 or 9999
            absolute = None
        if absolute is None:
            continue
        out.append(sentence[end : match.end()])
        out.append(f" ({absolute})")
        end = match.end()
    out.append(sentence[end:])
    return "".join(out)
