"""Which facts a summary keeps: coverage of weighted terms per character, against redundancy.

This is budgeted maximum coverage, the objective behind extractive methods
such as SumBasic and KLSum: the summary should cover as much distinct
content (term weight) as its allowance holds. Worked incrementally, as a
rolling summary needs:

* a new sentence joins when it adds enough weight the summary does not cover
  yet (small talk adds none: its words weigh nothing; a repeat adds none);
* while the summary is over its allowance, the fact with the least *value*
  per character leaves. A fact's value is the weight of the terms only it
  covers, plus its share of the terms it shares: a term held by ``n > 1``
  facts gives each ``SHARED_CREDIT * weight / n``. So a subject the
  conversation comes back to (a term said in two facts is worth twice one
  said once, in all) keeps the facts that say something about it, while
  the tenth repeat of a term adds little to each holder: coverage with
  diminishing returns rather than unique coverage alone. Old facts are not
  preferred for eviction: a fact stated once early keeps its place for as
  long as newer sentences do not carry more per character.

Values are integers (units of 1 / `_SCALE` weight) kept up to date as facts
come and go: when a term gains or loses a holder, each other holder's value
moves by the exact change of its share, so a value depends only on the facts
in the pool, never on the order they came in. So is each fact's rank, so an
eviction is one scan in C over the ranks, not a recount. Ties go to the
earlier day, then the smaller key: the choice depends only on the facts,
never on the order in which they were met, so a pool rebuilt from the
summary's text chooses exactly as the pool that wrote it. The rendered text
is kept per (section, day) group, so a call re-renders only the groups it
changed.
"""

from __future__ import annotations

from collections.abc import Iterable

from convmem.adapters.backends.summarizers._summary import (
    CLOSE,
    FACTS,
    IDENTITY,
    OPEN,
    SECTIONS,
    WEAK,
    Fact,
    Group,
    block,
    group_order,
    heading_chars,
)

__all__ = ["Pool"]

BULLET_OVERHEAD = 20
"""Characters added to each fact's cost when ranking: a bullet costs a line and a reader's attention."""

IDENTITY_BONUS = 8
"""Weight added to the value of a fact that says who someone is (two rare words' worth)."""
WEAK_SHARE = 2
"""A question or a caption counts for half its value: statements are preferred."""
SHARED_CREDIT = 2
"""A term held by n > 1 facts adds ``SHARED_CREDIT * weight / n`` to each holder's value."""
_SCALE = 720_720
"""Values are kept in integer units of 1 / _SCALE weight (it divides by 1..16 exactly), so that a value
is the same whatever order its facts came and went in."""

_SECTION_OVERHEAD = {"key_facts": 25, "tools_used": 27, "pending": 21}
"""``<name>\\n`` + ``</name>\\n`` for each section."""


class Pool:
    """The facts a summary holds, with term holders, values, ranks and its rendered length."""

    def __init__(self, facts: Iterable[Fact]) -> None:
        self.facts: dict[str, Fact] = {}
        self.value: dict[str, int] = {}
        """Each fact's value in units of 1 / `_SCALE` weight (integers: exact whatever the order)."""
        self._weights: dict[str, dict[str, int]] = {}
        self._rank: dict[str, tuple[float, int, str]] = {}
        self._fixed: dict[str, tuple[int, int, int]] = {}
        """Per fact what its rank needs besides its value: kind, cost with overhead, day (-1: none)."""
        self._holders: dict[str, list[str]] = {}
        self._groups: dict[Group, dict[str, Fact]] = {}
        self._blocks: dict[Group, str] = {}
        self._tallies: dict[Group, dict[str, list[int]]] = {}
        """Per dated key-fact group, per speaker: [facts, their full cost, their characters headed]."""
        self._day: dict[Group, int] = {}
        """Per dated key-fact group: the characters of its lines and headings."""
        self._sections: dict[str, int] = {}
        self.chars = 0
        """Characters of the sections, day headers and bullets (prose and outer tags not included)."""
        self._build(facts)

    def _build(self, facts: Iterable[Fact]) -> None:
        """Take `facts` in at once (a repeated key: the first stays): each term's holders first, then
        each value in one pass, so a rebuild is linear in the terms, not in holders times facts. A
        value depends only on the facts held, so this equals adding them one by one."""
        holders, weights = self._holders, self._weights
        for fact in facts:
            key = fact.key
            if key in self.facts:
                continue
            self.facts[key] = fact
            weights[key] = dict(fact.terms)
            for stem, _ in fact.terms:
                held = holders.get(stem)
                if held is None:
                    holders[stem] = [key]
                else:
                    held.append(key)
            self._fixed[key] = (fact.kind, fact.cost + BULLET_OVERHEAD, -1 if fact.day is None else fact.day)
            self._place(fact)
        shares = {stem: _share(len(held)) for stem, held in holders.items()}
        values = self.value
        for key, fact in self.facts.items():
            values[key] = sum([weight * shares[stem] for stem, weight in fact.terms])
        self._rerank_all(self.facts)

    def __len__(self) -> int:
        return len(self.facts)

    def gain(self, fact: Fact) -> int:
        """Weight of the fact's terms that no fact in the pool covers yet."""
        holders = self._holders
        return sum([weight for stem, weight in fact.terms if stem not in holders])

    def add(self, fact: Fact) -> None:
        """Take `fact` in (its key must be new)."""
        key = fact.key
        self.facts[key] = fact
        values, holders, weights = self.value, self._holders, self._weights
        weights[key] = dict(fact.terms)
        touched: dict[str, None] = {}
        value = 0
        for stem, weight in fact.terms:
            held = holders.get(stem)
            if held is None:
                holders[stem] = [key]
                value += weight * _SCALE
                continue
            count = len(held)
            share = _share(count + 1)
            change = share - _share(count)
            for other in held:
                values[other] += weights[other][stem] * change
                touched[other] = None
            held.append(key)
            value += weight * share
        values[key] = value
        self._fixed[key] = (fact.kind, fact.cost + BULLET_OVERHEAD, -1 if fact.day is None else fact.day)
        touched[key] = None
        self._rerank_all(touched)
        self._place(fact)

    def _place(self, fact: Fact) -> None:
        """Count a new fact into its (section, day) group and the rendered length."""
        group = (fact.section, fact.day)
        members = self._groups.get(group)
        if members is None:
            members = self._groups[group] = {}
        members[fact.key] = fact
        self._blocks.pop(group, None)
        self._open_section(fact.section, 1)
        self._count(fact, 1)

    def remove(self, key: str) -> Fact:
        """Take the fact with `key` out; the facts that shared a term with it are valued again."""
        fact = self.facts.pop(key)
        del self.value[key]
        del self._rank[key]
        del self._weights[key]
        del self._fixed[key]
        values, holders, weights = self.value, self._holders, self._weights
        touched: dict[str, None] = {}
        for stem, _ in fact.terms:
            held = holders[stem]
            held.remove(key)
            if not held:
                del holders[stem]
                continue
            count = len(held)
            change = _share(count) - _share(count + 1)
            for other in held:
                values[other] += weights[other][stem] * change
                touched[other] = None
        if touched:
            self._rerank_all(touched)
        group = (fact.section, fact.day)
        members = self._groups[group]
        del members[key]
        self._blocks.pop(group, None)
        if not members:
            del self._groups[group]
        self._open_section(fact.section, -1)
        self._count(fact, -1)
        return fact

    def _count(self, fact: Fact, sign: int) -> None:
        """Count a fact in (`sign` 1) or out (-1) of the rendered length. A dated key fact's line and
        the day's headings depend on how many facts each speaker has that day (`_summary.block`), so
        its day's characters are counted again from the day's tally."""
        if fact.section != FACTS or fact.day is None:
            self.chars += sign * fact.cost
            return
        group = (fact.section, fact.day)
        tallies = self._tallies.setdefault(group, {})
        tally = tallies.get(fact.label)
        if tally is None:
            tally = tallies[fact.label] = [0, 0, 0]
        tally[0] += sign
        tally[1] += sign * fact.cost
        tally[2] += sign * fact.chars
        if not tally[0]:
            del tallies[fact.label]
        now = _day_chars(fact.day, tallies) if tallies else 0
        if not tallies:
            del self._tallies[group]
        self.chars += now - self._day.get(group, 0)
        if now:
            self._day[group] = now
        else:
            self._day.pop(group, None)

    def keep_best(self, chars: int) -> None:
        """Keep only the best-ranked facts whose costs add up to at most `chars`, the pool rebuilt at
        once from them (in the order they came).

        For a pool far over its allowance: evicting one fact at a time from there scanned and
        re-valued the pool for each fact that left (a call offered a few thousand short sentences
        took minutes). The exact eviction then decides among the facts kept.
        """
        if self.chars <= chars:
            return
        rank, facts = self._rank, self.facts
        kept: set[str] = set()
        used = 0
        for key in sorted(rank, key=rank.__getitem__, reverse=True):
            used += facts[key].cost
            if used > chars:
                break
            kept.add(key)
        fresh = Pool(fact for key, fact in facts.items() if key in kept)
        self.__dict__.update(vars(fresh))

    def cheapest(self) -> str | None:
        """The key of the fact whose loss costs least coverage per character (None: empty)."""
        rank = self._rank
        return min(rank, key=rank.__getitem__) if rank else None

    def render(self, line: str) -> str:
        """The summary text: `line` of prose, then the sections (`_summary.render` does the same from
        scratch; this one re-renders only the groups that changed since the last call)."""
        parts = [OPEN, "\n", line, "\n"]
        groups, blocks = self._groups, self._blocks
        for section in SECTIONS:
            if not self._sections.get(section):
                continue
            parts.append(f"<{section}>\n")
            for group in sorted((g for g in groups if g[0] == section), key=group_order):
                text = blocks.get(group)
                if text is None:
                    text = blocks[group] = "".join(row + "\n" for row in block(group, groups[group].values()))
                parts.append(text)
            parts.append(f"</{section}>\n")
        parts.append(CLOSE)
        return "".join(parts)

    def _rerank_all(self, keys: Iterable[str]) -> None:
        """Rank each fact of `keys` by its value now: value per character of its cost (a bullet's
        overhead added), then the earlier day, then the smaller key."""
        values, fixed, rank = self.value, self._fixed, self._rank
        for key in keys:
            kind, cost, day = fixed[key]
            value: float = values[key] / _SCALE
            if kind == IDENTITY:
                value += IDENTITY_BONUS
            elif kind == WEAK:
                value /= WEAK_SHARE
            rank[key] = (value / cost, day, key)

    def _open_section(self, section: str, change: int) -> None:
        count = self._sections.get(section, 0) + change
        self._sections[section] = count
        if (change > 0 and count == 1) or (change < 0 and count == 0):
            self.chars += change * _SECTION_OVERHEAD[section]


def _day_chars(day: int, tallies: dict[str, list[int]]) -> int:
    """Characters of a day's block (`_summary.block`) from its tally per speaker ("" for facts with
    none): [facts, their full cost, their characters without the label]. The speakers with a heading
    are `_summary.headed`'s, worked out in the same pass (the pool's exact count checks the two agree)."""
    day_heading = heading_chars(day)
    unlabelled = False
    split = False  # some speaker stays under the plain heading when each chooses alone
    guess_each = guess_all = 0  # `headed`'s character counts of the two choices (no plain heading)
    each = every = 0  # the characters each choice writes
    for name, (count, cost, bare) in tallies.items():
        if not name:
            unlabelled = True
            each += cost
            continue
        width = len(name) + 2
        own = day_heading + width
        guess_all += own
        every += bare + own
        if own < count * width:
            guess_each += own
            each += bare + own
        else:
            guess_each += count * width
            each += cost
            split = True
    if unlabelled:
        return each + day_heading
    if split and guess_all < day_heading + guess_each:
        return every
    return each + day_heading if split else each


def _share(holders: int) -> int:
    """What each unit of a term's weight adds to the value of each of its `holders` (in 1 / `_SCALE`):
    all of it for a term one fact holds alone, ``SHARED_CREDIT / holders`` of it for a shared one."""
    return _SCALE if holders == 1 else SHARED_CREDIT * _SCALE // holders
