"""The summary's shape: facts, how they are written, and how any previous summary is read back.

The RFC's tagged shape, with the key facts grouped under the day they were
said (undated facts first) and, within a day, under the person who said them:
a heading names the day and the speaker once, and the speaker's facts of that
day follow it, so what one person said or did sits together and each line is
known to be theirs::

    <session_summary>
    42 turns summarized, from 8 May 2023 to 25 May 2023.
    <key_facts>
    8 May 2023, Caroline:
    - I went to a support group yesterday (7 May 2023).
    - I'm researching adoption agencies.
    25 May 2023, Melanie:
    - I ran a charity race last Sunday (21 May 2023).
    </key_facts>

A fact's text keeps its label ("Caroline: I went ..."); only the rendering
writes it once per group (`heading`, `bullet`). A bullet whose own words open
like a label ("Melanie: ...", said by Caroline) is written with its speaker's
label in front ("- Caroline: Melanie: ..."), so nothing a speaker says can
read as another speaker's line. Undated facts and facts with no speaker keep
the label in the bullet, under the plain day heading.
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
from collections.abc import Iterable, Mapping
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
    "Group",
    "Parsed",
    "block",
    "group_order",
    "headed",
    "heading_chars",
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
_HEADER = re.compile(r"(\d{1,2} [A-Z][a-z]+ \d{1,4})(?:, ([^:\n]{1,40}))?:")
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
    """Characters of the fact written out in full: ``- `` + text (label included) + line break; what
    selection weighs it by, however it is rendered."""
    kind: int = PLAIN
    label: str = ""
    """Its speaker label ("Alice" of "Alice: I paint."; "" for none): facts are grouped by it."""
    chars: int = 0
    """Characters of its rendered line (`bullet`): the label left to the group's heading."""


def make_fact(section: str, text: str, day: int | None) -> Fact:
    """The fact for a cleaned bullet text; a pure function of its three arguments."""
    if section != FACTS:
        key = section + ":" + _item_key(section, text)
        return Fact(section, text, None, key, terms(text), len(text) + 3, chars=len(text) + 3)
    label, body = split_label(text)
    if body.startswith(_CAPTION) or is_question(body):
        kind = WEAK
    elif is_identity(body):
        kind = IDENTITY
    else:
        kind = PLAIN
    speaker = speaker_label(label)
    chars = len(text) + 3 if not speaker or day is None else len(_bullet_text(speaker, body)) + 3
    return Fact(section, text, day, body_key(body), body_terms(body), len(text) + 3, kind, speaker, chars)


Group = tuple[str, int | None]
"""(section, day): the facts rendered together, under the day's headings for dated key facts."""


def group_order(group: Group) -> int:
    """A section's groups by day, undated first."""
    return -1 if group[1] is None else group[1]


def block(group: Group, facts: Iterable[Fact]) -> list[str]:
    """The lines of a group's facts, each speaker's together, in the order given. On a day, a speaker
    `headed` stands under a heading that names the day and them ("8 May 2023, Caroline:"), their
    label left out of each bullet; the day's other facts keep their labels under the plain heading
    "8 May 2023:", before the speakers' headings."""
    section, day = group
    facts = sorted(facts, key=_label_key)
    if section != FACTS or day is None:
        return ["- " + fact.text for fact in facts]
    said = _speakers(facts)
    own = headed(heading_chars(day), said, len(facts) > sum(said.values()))
    plain = [fact for fact in facts if fact.label not in own]
    date = _day_text(day)
    lines = [date + ":", *("- " + fact.text for fact in plain)] if plain else []
    speaker = ""
    for fact in facts:
        if fact.label not in own:
            continue
        if fact.label != speaker:
            speaker = fact.label
            lines.append(f"{date}, {speaker}:")
        body = fact.text[len(speaker) + 2 :]  # a speaker's fact opens with their label and ": "
        lines.append("- " + body if fact.chars == len(body) + 3 else "- " + fact.text)
    return lines


def headed(day_heading: int, said: Mapping[str, int], unlabelled: bool) -> frozenset[str]:
    """The speakers of a day who get their own heading, from how many facts each has that day
    (`said`), whether the day has facts with no speaker, and the characters of its plain heading:
    the choice that writes the fewest characters (counting each label "Name: " on a bullet against a
    heading "8 May 2023, Name:"), ties kept plain. A pure function of its arguments, so the pool that
    counts and the text that renders always agree."""
    each: list[str] = []
    guess_each = day_heading
    guess_all = 0
    for name, count in said.items():
        width = len(name) + 2
        own = day_heading + width
        guess_all += own
        if own < count * width:
            each.append(name)
            guess_each += own
        else:
            guess_each += count * width
    if not unlabelled and len(each) < len(said) and guess_all < guess_each:
        return frozenset(said)
    return frozenset(each)


def heading_chars(day: int) -> int:
    """Characters of the plain heading of `day` ("8 May 2023:" and its line break); a speaker's
    heading adds ", " and the name."""
    known = _heading_chars.get(day)
    if known is None:
        if len(_heading_chars) >= 4096:
            _heading_chars.clear()
        known = _heading_chars[day] = len(_day_text(day)) + 2
    return known


def _day_text(day: int) -> str:
    """`format_day`, cached (a pure function)."""
    known = _day_texts.get(day)
    if known is None:
        if len(_day_texts) >= 4096:
            _day_texts.clear()
        known = _day_texts[day] = format_day(day)
    return known


_heading_chars: dict[int, int] = {}
_day_texts: dict[int, str] = {}


def _speakers(facts: Iterable[Fact]) -> dict[str, int]:
    said: dict[str, int] = {}
    for fact in facts:
        if fact.label:
            said[fact.label] = said.get(fact.label, 0) + 1
    return said


def _label_key(fact: Fact) -> str:
    return fact.label


def _bullet_text(speaker: str, body: str) -> str:
    """`body` under `speaker`'s heading; with the label in front when the body itself opens like a
    label (or is empty), so that it cannot read as another speaker's line."""
    if not body or split_label(body)[0]:
        return f"{speaker}: {body}"
    return body


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
    """The summary text: `line` of prose, then each section's facts (key facts grouped by day, and
    within a day by speaker: `block`)."""
    by_section: dict[str, list[Fact]] = {}
    for fact in facts:
        by_section.setdefault(fact.section, []).append(fact)
    lines = [OPEN, line]
    for section in SECTIONS:
        chosen = by_section.get(section)
        if not chosen:
            continue
        lines.append(f"<{section}>")
        groups: dict[Group, list[Fact]] = {}
        for fact in chosen:
            groups.setdefault((section, fact.day), []).append(fact)
        for group in sorted(groups, key=group_order):
            lines.extend(block(group, groups[group]))
        lines.append(f"</{section}>")
    lines.append(CLOSE)
    return "\n".join(lines)


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
    speaker = ""
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        if section == FACTS and not line.startswith("- "):
            header = _HEADER.fullmatch(line)
            if header is not None and (parsed := parse_day(header.group(1))) is not None:
                named = header.group(2)
                if named is None or speaker_label(named) == named:
                    day, speaker = parsed, named or ""
                    continue
        text = clean(line[2:] if line.startswith("- ") else _LIST_MARKER.sub("", line))
        if text:
            if speaker and day is not None and not text.startswith(speaker + ": "):
                text = f"{speaker}: {text}"
            facts.append(make_fact(section, text, day))
