"""The summary's shape: facts, how they are written, and how any previous summary is read back.

The RFC's tagged shape, with the key facts grouped under the day they were
said (undated facts first)::

    <session_summary>
    42 turns summarized, from 8 May 2023 to 25 May 2023.
    <key_facts>
    8 May 2023:
    - User: I went to a support group yesterday (7 May 2023).
    25 May 2023:
    - Assistant: I ran a charity race last Sunday (21 May 2023).
    </key_facts>
    <tools_used>
    - search_pricing: Retrieved 3 pricing tier options.
    </tools_used>
    </session_summary>

`parse` reads this back to the same facts, and reads anything else too: a
summary written by a model, a person or an older convmem keeps its bullets
and its prose as (undated) facts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from convmem.adapters.backends.summarizers._dates import format_day, parse_day
from convmem.adapters.backends.summarizers._text import (
    Terms,
    body_key,
    body_terms,
    clean,
    fact_key,
    is_identity,
    is_question,
    sentences,
    speaker_label,
    split_label,
    terms,
)

__all__ = [
    "FACTS",
    "IDENTITY",
    "MINIMAL",
    "PLAIN",
    "ROLES",
    "SECTIONS",
    "WEAK",
    "Fact",
    "Parsed",
    "make_fact",
    "parse",
    "prose",
    "render",
]

FACTS = "key_facts"
SECTIONS = (FACTS, "tools_used", "pending")
_NO_FACTS = "No facts yet."
MINIMAL = f"<session_summary>\n{_NO_FACTS}\n</session_summary>"
OPEN, CLOSE = "<session_summary>", "</session_summary>"

_TAG = re.compile(r"</?[A-Za-z_][\w.-]*>")
_SECTION = re.compile(r"<(key_facts|tools_used|pending)>(.*?)</\1>", re.DOTALL)
_LIST_MARKER = re.compile(r"^(?:[-*•]|\d{1,2}[.)])\s+")
_HEADER = re.compile(r"(\d{1,2} [A-Z][a-z]+ \d{1,4}):")
_PROSE = re.compile(r"(\d+) turns? summarized(?:, from (.+?) to (.+?)|, on (.+?))?\.")
_NAMES = re.compile(r"The (user|assistant)'s name is ([^\n:]{1,40})\.")
_OLD_GIST = re.compile(r"The conversation so far \((\d+) turns?\)")
_OLD_QUOTE = re.compile(r"Most recently the (?:user|assistant) said: ")


ROLES = ("user", "assistant")
"""The conversation's two speakers, as the turns' fields name them."""
WEAK, PLAIN, IDENTITY = 0, 1, 2
"""A fact's kind: a question or a photo's caption gives way to statements; who someone is stays."""
_CAPTION = "[image: "


def caption_text(label: str, caption: str) -> str:
    """The fact of a shared photo: its caption, marked so that a reader (and `parse`) knows it."""
    return f"{label}: {_CAPTION}{caption}]"


@dataclass(frozen=True, slots=True)
class Fact:
    """One bullet: its section, text and day (None: undated), with what selection needs of it."""

    section: str
    text: str
    day: int | None
    key: str
    terms: Terms
    cost: int
    """Characters of its line: ``- `` + text + line break."""
    kind: int = PLAIN
    label: str = ""
    """Its speaker label ("Alice" of "Alice: I paint."; "" for none): facts are grouped by it."""


def make_fact(section: str, text: str, day: int | None) -> Fact:
    """The fact for a cleaned bullet text; a pure function of its three arguments."""
    if section != FACTS:
        key = section + ":" + _item_key(section, text)
        return Fact(section, text, None, key, terms(text), len(text) + 3)
    label, body = split_label(text)
    if body.startswith(_CAPTION) or is_question(body):
        kind = WEAK
    elif is_identity(body):
        kind = IDENTITY
    else:
        kind = PLAIN
    return Fact(
        section, text, day, body_key(body), body_terms(body), len(text) + 3, kind, speaker_label(label)
    )


def _item_key(section: str, text: str) -> str:
    """Tools are keyed by name (a newer result replaces the older), pending items by their words."""
    if section == "tools_used":
        return text.split(":", 1)[0].strip()
    return fact_key(text)


@dataclass(frozen=True, slots=True)
class Parsed:
    """What a previous summary holds: its facts in order, and the turns it says it covers."""

    facts: tuple[Fact, ...]
    turns: int
    first_day: int | None
    last_day: int | None
    names: dict[str, str]
    """The speakers' names it gives ("The user is Alice."), by role."""


def prose(
    turns: int, first_day: int | None, last_day: int | None, names: dict[str, str] | None = None
) -> str:
    """The summary's prose: how many turns, over which days; then who the speakers are, when known."""
    said = f"{turns} turn{'' if turns == 1 else 's'} summarized"
    if first_day is None or last_day is None:
        said += "."
    elif first_day == last_day:
        said = f"{said}, on {format_day(first_day)}."
    else:
        said = f"{said}, from {format_day(first_day)} to {format_day(last_day)}."
    if names:
        said += "".join(f"\nThe {role}'s name is {names[role]}." for role in ROLES if role in names)
    return said


def render(line: str, facts: Iterable[Fact]) -> str:
    """The summary text: `line` of prose, then each section's facts (key facts grouped by day)."""
    by_section: dict[str, list[Fact]] = {}
    for fact in facts:
        by_section.setdefault(fact.section, []).append(fact)
    lines = [OPEN, line]
    for section in SECTIONS:
        chosen = by_section.get(section)
        if not chosen:
            continue
        lines.append(f"<{section}>")
        if section == FACTS:
            days: dict[int | None, list[Fact]] = {}
            for fact in chosen:
                days.setdefault(fact.day, []).append(fact)
            for day in sorted(days, key=lambda d: -1 if d is None else d):
                if day is not None:
                    lines.append(format_day(day) + ":")
                lines.extend("- " + fact.text for fact in by_speaker(days[day]))
        else:
            lines.extend("- " + fact.text for fact in chosen)
        lines.append(f"</{section}>")
    lines.append(CLOSE)
    return "\n".join(lines)


def by_speaker(facts: Iterable[Fact]) -> list[Fact]:
    """Facts grouped by speaker (in label order), each speaker's in the order given: what one person
    said or did sits together, so a question about two people finds both in two runs of lines."""
    return sorted(facts, key=_label_key)


def _label_key(fact: Fact) -> str:
    return fact.label


def parse(summary: str) -> Parsed:
    """The facts and coverage of a previous summary, tagged as `render` writes it or free-form."""
    facts: list[Fact] = []
    counted = [0]
    days: list[int] = []
    names: dict[str, str] = {}

    def free_text(text: str) -> None:
        for raw in text.splitlines():
            line = raw.strip()
            own = _PROSE.fullmatch(line)
            if own:
                counted[0] += int(own.group(1))
                for written in own.group(2, 3, 4):
                    day = parse_day(written) if written else None
                    if day is not None:
                        days.append(day)
                continue
            named = _NAMES.fullmatch(line)
            if named:
                names[named.group(1)] = named.group(2)
                continue
            old = _OLD_GIST.match(line)
            if old:
                counted[0] += int(old.group(1))
                continue
            if _OLD_QUOTE.match(line) or line == _NO_FACTS:
                continue  # an older convmem's quote of the latest turn, or the minimal summary

            for sentence in sentences(_LIST_MARKER.sub("", line)):
                facts.append(make_fact(FACTS, sentence, None))

    rest = 0
    for match in _SECTION.finditer(summary):
        free_text(_TAG.sub("\n", summary[rest : match.start()]))
        _section(match.group(1), match.group(2), facts)
        rest = match.end()
    free_text(_TAG.sub("\n", summary[rest:]))
    return Parsed(tuple(facts), counted[0], min(days, default=None), max(days, default=None), names)


def _section(section: str, body: str, facts: list[Fact]) -> None:
    day: int | None = None
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        if section == FACTS and not line.startswith("- "):
            header = _HEADER.fullmatch(line)
            if header is not None and (parsed := parse_day(header.group(1))) is not None:
                day = parsed
                continue
        text = clean(line[2:] if line.startswith("- ") else _LIST_MARKER.sub("", line))
        if text:
            facts.append(make_fact(section, text, day))
