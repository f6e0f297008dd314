"""Helpers for the summarizer tests: requests, sections, and the shape every summary must have."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from convmem.events import MemoryBudget, ShortTermMemoryConfig
from convmem.projections import summary_problem

SECTION_TAG = re.compile(r"<(/?)(key_facts|tools_used|pending)>")
ANY_TAG = re.compile(r"</?(?:session_summary|key_facts|tools_used|pending)>")
DAY_HEADER = re.compile(r"\d{1,2} [A-Z][a-z]+ \d{1,4}(?:, [^:\n]{1,40})?:")
SPEAKER_HEADER = re.compile(r"(\d{1,2} [A-Z][a-z]+ \d{1,4})(?:, ([^:\n]{1,40}))?:")


def request(turns: list[dict[str, Any]], previous: str = "") -> dict[str, Any]:
    return {"previous_summary": previous, "turns": turns}


def section(summary: str, name: str) -> list[str]:
    """The bullet texts of one section, date headers left out (empty when the section is absent); a
    key fact under a speaker's heading ("8 May 2023, Alice:") read with its speaker's label, as
    "Alice: ..." (once: a bullet that opens with the label already carries it)."""
    match = re.search(rf"<{name}>\n(.*?)\n</{name}>", summary, re.DOTALL)
    if not match:
        return []
    if name == "key_facts":
        return [fact for facts in days(summary).values() for fact in facts]
    return [line[2:] for line in match.group(1).split("\n") if line.startswith("- ")]


def days(summary: str) -> dict[str, list[str]]:
    """Key facts by the day they stand under ("" for undated ones), each with its speaker's label
    (as `section` reads them)."""
    out: dict[str, list[str]] = {}
    match = re.search(r"<key_facts>\n(.*?)\n</key_facts>", summary, re.DOTALL)
    day, speaker = "", ""
    for line in match.group(1).split("\n") if match else []:
        if line.startswith("- "):
            text = line[2:]
            if speaker and not text.startswith(speaker + ": "):
                text = f"{speaker}: {text}"
            out.setdefault(day, []).append(text)
        else:
            header = SPEAKER_HEADER.fullmatch(line)
            assert header is not None, f"not a day heading: {line!r}"
            day, speaker = header.group(1), header.group(2) or ""
    return out


def bullets(summary: str) -> list[str]:
    return [line for line in summary.split("\n") if line.startswith("- ")]


def assert_well_formed(summary: str) -> None:
    """The RFC's tagged shape: tags on their own lines and closed, bullets (and day headers) in sections."""
    lines = summary.split("\n")
    assert summary.splitlines() == lines, "no line breaks other than \\n"
    assert lines[0] == "<session_summary>"
    assert lines[-1] == "</session_summary>"
    assert len(lines) >= 3, "a prose line at least"
    open_section: str | None = None
    seen: list[str] = []
    for line in lines[1:-1]:
        tag = SECTION_TAG.fullmatch(line)
        if tag:
            closing, name = tag.groups()
            if closing:
                assert open_section == name
                open_section = None
            else:
                assert open_section is None
                assert name not in seen
                open_section = name
                seen.append(name)
            continue
        assert not ANY_TAG.search(line), f"a tag inside a line: {line!r}"
        if open_section:
            header = open_section == "key_facts" and DAY_HEADER.fullmatch(line)
            assert header or line.startswith("- "), f"not a bullet: {line!r}"
            assert header or line[2:].strip(), f"an empty bullet: {line!r}"
        else:
            assert line.strip()
            assert not line.startswith("- ")
    assert open_section is None
    assert "\x00" not in summary


def assert_accepted(summary: str, max_tokens: int, estimator: Callable[[str], int]) -> None:
    config = ShortTermMemoryConfig(
        strategy="rolling_summary", budget=MemoryBudget(summary_max_tokens=max_tokens)
    )
    assert summary_problem(summary, config, estimator) is None
