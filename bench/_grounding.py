"""Grounded answer recall: the stricter quality metric (issue 25, item 4), one a word list cannot win.

Counting an answer as recalled when its content words appear *anywhere* in a context
rewards a bag of words: the history's distinct words, rarest first, "recall" most answers.
Here an answer counts only where the context states it. The answer is split into parts
(at commas, semicolons and the word "and": a list's items may sit in different places),
and each part needs ONE unit of the context that

* holds all the part's content words (the unit's headings included: a date heading over a
  day's facts, a turn's ``date``);
* relates to the question: it, or the unit just before it (the line it may answer: "What
  are your plans for the summer?" before "Researching adoption agencies."), shares a content
  word with the question, other than the answer's own words and the names of the people
  the question names (words compared on their first five letters, so "adopt" meets
  "adoption", and a question's four-letter word meets a unit's word that begins with it:
  "name" meets "named"); and
* where the question names one of the conversation's people, is attributed to them: it names
  them (first name or full name, in the unit or a heading over it), or it is a line of theirs
  (a turn's ``user`` / ``assistant`` text where that role is theirs, or a line opening
  ``Name:`` / ``User:`` / ``Assistant:``).

A **unit** is a line of a text in the context when the line has at most `MAX_UNIT_WORDS`
words, else each of its sentences; a stretch of more than `MAX_UNIT_WORDS` words with no
sentence end is read as pieces of that many words (99% of LoCoMo's sentences are shorter). A
**heading** is a line of at most `MAX_HEADING_WORDS` words ending in ``:``; it covers the lines
after it up to the next heading at the same or a lesser indent.

Nothing here knows a data set, its questions or its names: the conversation's people and
which role each plays are the caller's (in the LoCoMo bench: the two speakers, the first
played as the user).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench._locomo import content_words

__all__ = ["MAX_HEADING_WORDS", "MAX_UNIT_WORDS", "Grounding", "Question", "Unit"]

MAX_UNIT_WORDS = 30
"""Words in one unit at most: a longer line is read as sentences, a longer sentence as pieces."""
MAX_HEADING_WORDS = 8
STEM = 5
"""Letters compared when a unit's words meet the question's."""

_TOKEN = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_BULLET = re.compile(r"^[-*\u2022]\s*")
_OWNER = re.compile(r"^([A-Za-z][\w.'-]*(?: [A-Z][\w.'-]*){0,2})\s?:\s+(\S.*)$")
_ANSWER_PARTS = re.compile(r"[,;]|\band\b", re.IGNORECASE)


def _stems(words: Iterable[str]) -> frozenset[str]:
    """What a question's word is looked up as: its first `STEM` letters (the whole of a shorter word)."""
    return frozenset(w[:STEM] for w in words)


def _unit_stems(words: Iterable[str]) -> frozenset[str]:
    """A unit's words as a question's may meet them: `_stems`, and one letter shorter ("named" meets
    "name")."""
    return frozenset(s for w in words for s in ((w[:STEM], w[: STEM - 1]) if len(w) >= STEM else (w,)))


@dataclass(frozen=True)
class Unit:
    """One sentence or line of a context, read with its headings."""

    words: frozenset[str]
    """Content words of the unit and its headings."""
    stems: frozenset[str]
    tokens: frozenset[str]
    """Every lowercase word of the unit and its headings (names of two letters included)."""
    owner: str | None
    """The person whose line it is (as the caller spells them), when known."""
    text: str
    before: frozenset[str] = frozenset()
    """Stems of the unit read just before this one (the line it may answer)."""


@dataclass(frozen=True)
class Question:
    """A question and its answer, read for grounding."""

    parts: tuple[frozenset[str], ...]
    """The content words of each part of the answer (parts with none left out)."""
    relate: frozenset[str]
    """Stems of the question's content words a unit must share one of."""
    named: tuple[str, ...]
    """The conversation's people the question names."""


class Grounding:
    """Reads contexts into units and says which questions they ground.

    `people`: the conversation's people (``"Caroline"``, ``"Ada Osei"``); `roles`: the person
    each role of a turn is (``{"user": "Caroline", "assistant": "Melanie"}``).
    """

    def __init__(self, people: Sequence[str], roles: Mapping[str, str]) -> None:
        self.people = tuple(p for p in people if _TOKEN.findall(p.lower()))
        self.roles = {role.lower(): person for role, person in roles.items()}
        self._first = {p: _TOKEN.findall(p.lower())[0] for p in self.people}
        self._full = {p: " ".join(_TOKEN.findall(p.lower())) for p in self.people}
        self._read: dict[tuple[str, str, str | None], Unit] = {}

    # -- questions -------------------------------------------------------------------------

    def question(self, question: str, answer: str) -> Question:
        tokens = set(_TOKEN.findall(question.lower()))
        named = tuple(p for p in self.people if self._first[p] in tokens)
        parts = tuple(
            frozenset(words) for part in _ANSWER_PARTS.split(answer) if (words := content_words(part))
        )
        names = {t for p in named for t in _TOKEN.findall(p.lower())}
        answer_words = set().union(*parts) if parts else set()
        relate = _stems(content_words(question) - names - answer_words)
        return Question(parts, relate, named)

    # -- contexts ---------------------------------------------------------------------------

    def units(self, context: Any) -> list[Unit]:
        """The units of a context object (dicts, lists and strings, as a planner is given them)."""
        out: list[Unit] = []
        self._walk(context, "", None, out)
        return [
            dataclasses.replace(unit, before=out[i - 1].stems) if i else unit for i, unit in enumerate(out)
        ]

    def _walk(self, value: Any, heading: str, owner: str | None, out: list[Unit]) -> None:
        if isinstance(value, str):
            self._text(value, heading, owner, out)
        elif isinstance(value, dict):
            date = value.get("date")
            inner = f"{heading}\n{date}" if isinstance(date, str) else heading
            for key, item in value.items():
                if key == "date" and isinstance(item, str):
                    continue
                role = self.roles.get(str(key).lower())
                self._walk(item, inner, role if role is not None else owner, out)
        elif isinstance(value, list | tuple):
            for item in value:
                self._walk(item, heading, owner, out)
        elif value is not None and not isinstance(value, bool | int | float):
            self._walk(str(value), heading, owner, out)

    def _person(self, label: str) -> str | None:
        """The person a line label (``User``, ``Caroline``, ``Ada Osei``) stands for."""
        lowered = label.lower()
        if lowered in self.roles:
            return self.roles[lowered]
        tokens = _TOKEN.findall(lowered)
        for person in self.people:
            if " ".join(tokens) in (self._full[person], self._first[person]):
                return person
        return None

    def _text(self, text: str, heading: str, owner: str | None, out: list[Unit]) -> None:
        stack: list[tuple[int, str]] = []
        for raw in text.split("\n"):
            indent = len(raw) - len(raw.lstrip())
            line = _BULLET.sub("", raw.strip())
            if not line:
                continue
            if line.endswith(":") and len(line.split()) <= MAX_HEADING_WORDS:
                while stack and stack[-1][0] >= indent:
                    stack.pop()
                stack.append((indent, line[:-1]))
                continue
            line_owner = owner
            match = _OWNER.match(line)
            if match is not None and (person := self._person(match.group(1))) is not None:
                line_owner, line = person, match.group(2)
            over = " ".join([heading, *(h for _, h in stack)])
            for piece in _pieces(line):
                out.append(self._unit(piece, over, line_owner))

    def _unit(self, text: str, heading: str, owner: str | None) -> Unit:
        key = (text, heading, owner)
        unit = self._read.get(key)
        if unit is None:  # the same lines recur in context after context: read each once
            both = f"{heading}\n{text}"
            words = frozenset(content_words(both))
            unit = Unit(words, _unit_stems(words), frozenset(_TOKEN.findall(both.lower())), owner, text)
            self._read[key] = unit
        return unit

    # -- grounding --------------------------------------------------------------------------

    def attributed(self, unit: Unit, person: str) -> bool:
        return unit.owner == person or self._first[person] in unit.tokens

    def grounded(self, question: Question, units: Sequence[Unit], index: Mapping[str, set[int]]) -> bool:
        """Every part of the answer sits in one related unit attributed to the person asked about."""
        if not question.parts:
            return False
        for part in question.parts:
            found = False
            candidates = set.intersection(*(index.get(w, set()) for w in part))
            for i in candidates:
                unit = units[i]
                if not (unit.stems & question.relate or unit.before & question.relate):
                    continue
                if question.named and not any(self.attributed(unit, p) for p in question.named):
                    continue
                found = True
                break
            if not found:
                return False
        return True


def index_of(units: Sequence[Unit]) -> dict[str, set[int]]:
    """Content word -> the units holding it."""
    index: dict[str, set[int]] = {}
    for i, unit in enumerate(units):
        for word in unit.words:
            index.setdefault(word, set()).add(i)
    return index


def _pieces(line: str) -> Iterable[str]:
    """The line if short enough, else its sentences, a long sentence in pieces of `MAX_UNIT_WORDS`."""
    if len(line.split()) <= MAX_UNIT_WORDS:
        yield line
        return
    for sentence in _SENTENCE_END.split(line):
        words = sentence.split()
        for start in range(0, len(words), MAX_UNIT_WORDS):
            yield " ".join(words[start : start + MAX_UNIT_WORDS])
