"""Every Python snippet in the README runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _snippets() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_readme_has_snippets() -> None:
    """The README shows code a newcomer can run (and this suite runs it)."""
    assert len(_snippets()) >= 3


@pytest.mark.parametrize(
    ("line", "code"), _snippets(), ids=lambda v: f"line{v}" if isinstance(v, int) else ""
)
def test_readme_snippet_runs(line: int, code: str) -> None:
    """A README snippet executes without error; its asserts are the documented behaviour."""
    namespace: dict[str, object] = {"__name__": f"readme_line_{line}"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)
