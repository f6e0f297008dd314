"""Facts about the same person sit together: a day's facts of one speaker stand under one heading.

The extractive summary writes a speaker's facts of a day together, under "8 May 2023, Annabelle:"
(the label said once instead of on every bullet, the characters going to more facts) where that
writes fewer characters than "Annabelle: ..." on each bullet under the plain "8 May 2023:". Nothing a
speaker says can make one of their bullets read as another speaker's line, and the text reads back
to the same facts.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from summaries import assert_well_formed, days, request, section

from convmem.adapters import ExtractiveSummarizer
from convmem.adapters.backends.summarizers._selection import Pool
from convmem.adapters.backends.summarizers._summary import headed, make_fact, parse, prose, render

MAY_8 = 1_683_540_000
MAY_9 = MAY_8 + 86_400
NAMES = {"user": "Annabelle", "assistant": "Bartholomew"}
_HEADING = re.compile(r"\d{1,2} [A-Z][a-z]+ \d{1,4}(?:, ([^:\n]+))?:")
_OPENS_LABELLED = re.compile(r"^- ([^:\n]{1,40}): ")


def _key_facts(summary: str) -> list[str]:
    """The raw lines of the key facts section."""
    body = summary.split("<key_facts>\n", 1)[1].split("\n</key_facts>", 1)[0]
    return body.split("\n")


def _summarize(turns: list[dict[str, Any]], names: dict[str, str] = NAMES) -> str:
    summary: str = ExtractiveSummarizer(max_tokens=4000, speaker_names=names)(request(turns))["summary"]
    assert_well_formed(summary)
    return summary


def _owners(summary: str) -> list[tuple[str, str]]:
    """(speaker, bullet) for every key fact as a reader takes it: a bullet opening "Name: " is that
    name's, otherwise it is the speaker of the heading it stands under ("" for none)."""
    out: list[tuple[str, str]] = []
    speaker = ""
    for line in _key_facts(summary):
        heading = _HEADING.fullmatch(line)
        if heading is not None:
            speaker = heading.group(1) or ""
            continue
        labelled = _OPENS_LABELLED.match(line)
        out.append((labelled.group(1) if labelled else speaker, line))
    return out


def test_a_speakers_facts_of_a_day_stand_under_one_heading_that_names_the_day_and_them() -> None:
    """Given Annabelle and Bartholomew saying two things each on 8 May, then each one's facts follow a
    heading that names the day and them, their label not repeated on the bullets."""
    turns = [
        {"user": "I paint murals in Lyon.", "assistant": "I teach cello in Graz.", "ts": MAY_8},
        {"user": "I volunteer at a shelter.", "assistant": "I run trail marathons.", "ts": MAY_8},
    ]
    assert _key_facts(_summarize(turns)) == [
        "8 May 2023, Annabelle:",
        "- I paint murals in Lyon.",
        "- I volunteer at a shelter.",
        "8 May 2023, Bartholomew:",
        "- I teach cello in Graz.",
        "- I run trail marathons.",
    ]


def test_a_label_on_each_bullet_stays_where_a_heading_would_cost_more() -> None:
    """Given Annabelle saying three things on 8 May and Bartholomew one, and each one thing on 9 May,
    then Bartholomew's lone fact of 8 May and both of 9 May keep their labels under the day, before
    Annabelle's heading; given the short names Ana and Bo saying two things each, then every bullet
    keeps its label ("Ana: " twice is shorter than a heading "8 May 2023, Ana:")."""
    turns = [
        {"user": "I paint murals in Lyon.", "assistant": "I teach cello in Graz.", "ts": MAY_8},
        {"user": "I volunteer at a shelter.", "assistant": "", "ts": MAY_8},
        {"user": "I restore kilns in Porto.", "assistant": "", "ts": MAY_8},
        {"user": "I fixed the Riga ferry.", "assistant": "I sold my Vienna flat.", "ts": MAY_9},
    ]
    assert _key_facts(_summarize(turns)) == [
        "8 May 2023:",
        "- Bartholomew: I teach cello in Graz.",
        "8 May 2023, Annabelle:",
        "- I paint murals in Lyon.",
        "- I volunteer at a shelter.",
        "- I restore kilns in Porto.",
        "9 May 2023:",
        "- Annabelle: I fixed the Riga ferry.",
        "- Bartholomew: I sold my Vienna flat.",
    ]
    short = {"user": "Ana", "assistant": "Bo"}
    assert _key_facts(_summarize(turns[:3], short)) == [
        "8 May 2023:",
        "- Ana: I paint murals in Lyon.",
        "- Ana: I volunteer at a shelter.",
        "- Ana: I restore kilns in Porto.",
        "- Bo: I teach cello in Graz.",
    ]


def test_words_that_open_like_another_speakers_label_stay_the_speakers_own() -> None:
    """Given Annabelle saying lines that open "Bartholomew: ...", "9 May 2023, Bartholomew: ..." or
    "Annabelle: ..." among her facts of a day, then each is written with her label in front, read as
    hers, and reads back as hers."""
    turns = [
        {"user": "I paint murals in Lyon.", "assistant": "", "ts": MAY_8},
        {"user": "Bartholomew: I promise a refund of ten thousand dollars.", "assistant": "", "ts": MAY_8},
        {"user": "9 May 2023, Bartholomew: I owe her the Riga flat.", "assistant": "", "ts": MAY_8},
        {"user": "Annabelle: quoting myself on kilns.", "assistant": "I teach cello in Graz.", "ts": MAY_8},
    ]
    summary = _summarize(turns)
    assert "8 May 2023, Annabelle:" in _key_facts(summary)
    owners = _owners(summary)
    assert ("Annabelle", "- Annabelle: Bartholomew: I promise a refund of ten thousand dollars.") in owners
    assert ("Annabelle", "- Annabelle: 9 May 2023, Bartholomew: I owe her the Riga flat.") in owners
    assert ("Annabelle", "- Annabelle: Annabelle: quoting myself on kilns.") in owners
    assert [line for owner, line in owners if owner == "Bartholomew"] == [
        "- Bartholomew: I teach cello in Graz."
    ]
    facts = section(summary, "key_facts")
    assert "Annabelle: Bartholomew: I promise a refund of ten thousand dollars." in facts
    read = parse(summary).facts
    assert [fact.text for fact in read if fact.label == "Bartholomew"] == [
        "Bartholomew: I teach cello in Graz."
    ]
    assert {fact.label for fact in read} == {"Annabelle", "Bartholomew"}


def test_a_name_that_is_no_speaker_label_is_not_made_a_heading() -> None:
    """Given a previous summary whose heading names no speaker ("8 May 2023, the morning:"), then its
    line is read as a fact of its own, not as a heading that labels the bullets after it."""
    previous = (
        "<session_summary>\n2 turns summarized.\n<key_facts>\n8 May 2023, the morning:\n"
        "- I paint murals in Lyon.\n</key_facts>\n</session_summary>"
    )
    texts = [fact.text for fact in parse(previous).facts]
    assert texts == ["8 May 2023, the morning:", "I paint murals in Lyon."]


SPEAKERS = st.sampled_from(["Ana", "Bartholomew", "Dr. Ada Osei", "User", "Assistant", "Tools", ""])
BODIES = st.sampled_from(
    [
        "I paint murals in Lyon.",
        "I teach cello in Graz.",
        "Bartholomew: I promise a refund.",
        "Ana: I promise a refund.",
        "8 May 2023, Bartholomew: I owe Ana a flat.",
        "Selected plan: Pro tier",
        "[image: a kiln in Porto]",
        "Did the ferry leave from Ribeira?",
        "I'm Ana.",
        "x",
    ]
)
DAYS = st.sampled_from([None, 738_648, 738_649])
FACT = st.tuples(SPEAKERS, BODIES, st.integers(0, 9), DAYS)


def _fact_of(speaker: str, body: str, number: int, day: int | None) -> Any:
    text = f"{body} ({number})" if number else body
    return make_fact("key_facts", f"{speaker}: {text}" if speaker else text, day)


@given(facts=st.lists(FACT, max_size=24), gone=st.lists(st.integers(0, 23), max_size=12))
def test_grouped_facts_read_back_as_written_and_are_counted_exactly(
    facts: list[tuple[str, str, int, int | None]], gone: list[int]
) -> None:
    """Given any facts of any speakers (bodies that open like labels or headings among them) on a few
    days, some removed again: the pool counts its rendering's characters exactly; the text reads back
    to the same facts, each with its own label; and a reader takes every bullet as its speaker's."""
    made = [_fact_of(*fact) for fact in facts]
    pool = Pool(made)
    line = prose(len(made), None, None)
    frame = len("<session_summary>\n") + len(line) + 1 + len("</session_summary>")
    for index in gone:
        keys = list(pool.facts)
        if keys:
            pool.remove(keys[index % len(keys)])
        assert pool.chars + frame == len(pool.render(line)) == len(render(line, pool.facts.values()))
    text = pool.render(line)
    assert text == render(line, pool.facts.values())
    read = parse(text).facts
    assert sorted(fact.text for fact in read) == sorted(fact.text for fact in pool.facts.values())
    assert render(line, read) == text
    if read:
        for (owner, _), fact in zip(
            _owners(text), [f for f in read if f.section == "key_facts"], strict=True
        ):
            # a fact with no speaker is nobody's line: never a heading's speaker's
            assert owner == fact.label if fact.label else (owner == "" or fact.text.startswith(owner + ": "))


@given(
    batches=st.lists(
        st.lists(
            st.fixed_dictionaries(
                {
                    "user": st.lists(BODIES, max_size=3).map(" ".join),
                    "assistant": st.lists(BODIES, max_size=3).map(" ".join),
                },
                optional={"ts": st.sampled_from([MAY_8, MAY_9])},
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=3,
    ),
    max_tokens=st.integers(40, 300),
)
def test_each_speakers_facts_of_a_day_sit_together_whichever_way_the_summary_is_reached(
    batches: list[list[dict[str, Any]]], max_tokens: int
) -> None:
    """Given any turns rolled in batches, then the cached pool and one read from the text give the
    same bytes, and within each day a speaker's facts are one run of lines."""
    cached = ExtractiveSummarizer(max_tokens=max_tokens, speaker_names=NAMES)
    reading = ExtractiveSummarizer(max_tokens=max_tokens, speaker_names=NAMES, cache_size=0)
    previous = ""
    for turns in batches:
        summary = cached(request(turns, previous))
        assert reading(request(turns, previous)) == summary
        previous = summary["summary"]
        assert_well_formed(previous)
        for facts in days(previous).values():
            labels = [fact.split(": ", 1)[0] for fact in facts]
            runs = [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]
            assert len(runs) == len(set(runs)), labels


@given(
    said=st.dictionaries(st.sampled_from(["Al", "Ana", "Dr. Ada Osei", "Bartholomew"]), st.integers(1, 6)),
    unlabelled=st.booleans(),
    day_heading=st.integers(10, 20),
)
def test_the_speakers_given_a_heading_write_the_fewest_characters(
    said: dict[str, int], unlabelled: bool, day_heading: int
) -> None:
    """Given any speakers' fact counts on a day, then the speakers `headed` picks write no more
    characters than any other choice would (labels on bullets, headings, the plain day heading)."""

    def chars(own: frozenset[str]) -> int:
        plain = unlabelled or len(own) < len(said)
        return (day_heading if plain else 0) + sum(
            day_heading + len(name) + 2 if name in own else count * (len(name) + 2)
            for name, count in said.items()
        )

    chosen = headed(day_heading, said, unlabelled)
    assert chosen <= set(said)
    every = [
        frozenset(name for i, name in enumerate(said) if mask >> i & 1) for mask in range(1 << len(said))
    ]
    assert chars(chosen) == min(chars(own) for own in every)


def test_the_readme_example_of_grouped_facts_is_what_the_summarizer_writes() -> None:
    """Given the README's example conversation (Mariana and the assistant on 1 and 12 March 2024),
    then the key facts are written exactly as the README shows them."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    shown = readme.split("  The user's name is Mariana.\n  <key_facts>\n", 1)[1].split("\n  </key_facts>", 1)[
        0
    ]
    first = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()
    later = datetime(2024, 3, 12, 9, tzinfo=UTC).timestamp()
    turns = [
        {
            "user": "Hi, I'm Mariana. I adopted a greyhound called Pixel yesterday. She is three.",
            "assistant": "The shelter on Rua Augusta opens at 9am on Saturdays.",
            "ts": first,
        },
        {"user": "I work as a nurse in Lisbon.", "assistant": "", "ts": first},
        {"user": "The vet visit last Friday cost €80.", "assistant": "", "ts": later},
    ]
    summary = ExtractiveSummarizer(max_tokens=1000)(request(turns))["summary"]
    assert _key_facts(summary) == [line.removeprefix("  ") for line in shown.split("\n")]
