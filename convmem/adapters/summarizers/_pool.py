"""Which facts a summary keeps: coverage of weighted terms per character, against redundancy.

This is budgeted maximum coverage, the objective behind extractive methods
such as SumBasic and KLSum: the summary should cover as much distinct
content (term weight) as its allowance holds. Worked incrementally, as a
rolling summary needs:

* a new sentence joins when it adds enough weight the summary does not cover
  yet (small talk adds none: its words weigh nothing; a repeat adds none);
* while the summary is over its allowance, the fact whose loss uncovers the
  least weight per character leaves (its *value*: the weight of the terms
  only it covers). Old facts are not preferred for eviction: a fact stated
  once early keeps its place for as long as newer sentences do not carry
  more that is new per character.

Values are integer sums kept up to date as facts come and go, so one
eviction costs a scan of the live facts, not a recount. Ties go to the
earlier day, then the smaller key: the choice depends only on the facts,
never on the order in which they were met, so a pool rebuilt from the
summary's text chooses exactly as the pool that wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable

from convmem.adapters.summarizers._dates import format_day
from convmem.adapters.summarizers._summary import FACTS, Fact

__all__ = ["Pool"]

BULLET_OVERHEAD = 20
"""Characters added to each fact's cost when ranking: a bullet costs a line and a reader's attention."""

_SECTION_OVERHEAD = {"key_facts": 25, "tools_used": 27, "pending": 21}
"""``<name>\\n`` + ``</name>\\n`` for each section."""


class Pool:
    """The facts a summary holds, with term counts, values and its rendered length in characters."""

    def __init__(self, facts: Iterable[Fact]) -> None:
        self.facts: dict[str, Fact] = {}
        self.value: dict[str, int] = {}
        self._holders: dict[str, list[str]] = {}
        self._sections: dict[str, int] = {}
        self._days: dict[int, int] = {}
        self.chars = 0
        """Characters of the sections, date headers and bullets (prose and outer tags not included)."""
        for fact in facts:
            if fact.key not in self.facts:
                self.add(fact)

    def __len__(self) -> int:
        return len(self.facts)

    def gain(self, fact: Fact) -> int:
        """Weight of the fact's terms that no fact in the pool covers yet."""
        holders = self._holders
        return sum(weight for stem, weight in fact.terms if stem not in holders)

    def add(self, fact: Fact) -> None:
        """Take `fact` in (its key must be new)."""
        key = fact.key
        self.facts[key] = fact
        facts, values, holders = self.facts, self.value, self._holders
        value = 0
        for stem, weight in fact.terms:
            held = holders.get(stem)
            if held is None:
                holders[stem] = [key]
                value += weight
                continue
            if len(held) == 1:  # its only holder no longer covers it alone
                other = held[0]
                values[other] -= _weight(facts[other], stem)
            held.append(key)
        values[key] = value
        self.chars += fact.cost + self._open(fact, 1)

    def remove(self, key: str) -> Fact:
        """Take the fact with `key` out; a term it shared with one other fact is that fact's alone again."""
        fact = self.facts.pop(key)
        del self.value[key]
        facts, values, holders = self.facts, self.value, self._holders
        for stem, _ in fact.terms:
            held = holders[stem]
            held.remove(key)
            if not held:
                del holders[stem]
            elif len(held) == 1:
                other = held[0]
                values[other] += _weight(facts[other], stem)
        self.chars -= fact.cost + self._open(fact, -1)
        return fact

    def cheapest(self) -> str | None:
        """The key of the fact whose loss costs least coverage per character (None: empty)."""
        if not self.facts:
            return None
        values = self.value
        return min(
            self.facts.values(),
            key=lambda f: (values[f.key] / (f.cost + BULLET_OVERHEAD), -1 if f.day is None else f.day, f.key),
        ).key

    def _open(self, fact: Fact, change: int) -> int:
        """Characters of a section tag pair or date header that `fact` opens (+1) or closes (-1)."""
        opened = 0
        sections = self._sections
        count = sections.get(fact.section, 0) + change
        sections[fact.section] = count
        if (change > 0 and count == 1) or (change < 0 and count == 0):
            opened += _SECTION_OVERHEAD[fact.section]
        if fact.section == FACTS and fact.day is not None:
            days = self._days
            count = days.get(fact.day, 0) + change
            days[fact.day] = count
            if (change > 0 and count == 1) or (change < 0 and count == 0):
                opened += _header_chars(fact.day)
            if count == 0:
                del days[fact.day]
        return opened


def _weight(fact: Fact, stem: str) -> int:
    for term, weight in fact.terms:
        if term == stem:
            return weight
    raise KeyError(stem)


def _header_chars(day: int) -> int:
    return len(format_day(day)) + 2  # "8 May 2023:" and its line break
