"""A context (or any JSON-like value) as readable text: one line per line, no JSON escapes.

`replay`, the demo and the timeline page show what a model was given this
way: a summary or a turn that holds newlines is shown as its lines, indented
under its name, instead of one JSON string full of ``\\n``. Keys are sorted
(as the CLI's JSON output sorts them, so the two agree line for line); a
value that is a single line stays beside its name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["readable", "readable_lines"]

_PAD = "  "


def readable(value: Any) -> str:
    """`value` as readable text (see the module docstring)."""
    return "\n".join(readable_lines(value))


def readable_lines(value: Any, depth: int = 0, cache: dict[Any, list[str]] | None = None) -> list[str]:
    """`value` as lines of text, nested values indented two spaces a level.

    `cache` (kept by a caller that renders many contexts sharing their turns,
    as the timeline does) holds the lines of each flat mapping already shown
    at a depth, so a turn is rendered once however many contexts hold it.
    """
    if cache is not None and isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values()):
        found_key = (depth, tuple(value.items()))
        found = cache.get(found_key)
        if found is None:
            found = cache[found_key] = readable_lines(value, depth)
        return found
    pad = _PAD * depth
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        lines: list[str] = []
        for name, item in sorted(value.items(), key=lambda pair: str(pair[0])):
            lines.extend(_named(f"{pad}{name}:", item, depth, cache))
        return lines
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if not value:
            return [pad + "[]"]
        lines = []
        for item in value:
            lines.extend(_named(f"{pad}-", item, depth, cache))
        return lines
    return [pad + line for line in _scalar(value).split("\n")]


def _named(head: str, item: Any, depth: int, cache: dict[Any, list[str]] | None) -> list[str]:
    """`head` (a name or a list dash) with `item` beside it when it is one line, else under it."""
    if isinstance(item, Mapping | list | tuple) and item:
        return [head, *readable_lines(item, depth + 1, cache)]
    text = readable_lines(item, 0)
    if len(text) == 1:
        return [f"{head} {text[0]}"]
    return [f"{head} |", *(_PAD * (depth + 1) + line for line in text)]


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return json.dumps(value, ensure_ascii=False, default=str)
