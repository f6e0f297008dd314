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


ARCHITECTURE = README.parent / "ARCHITECTURE.md"
_IMPORT = re.compile(r"^\s*(?:from\s+(convmem[\w.]*)\s+import|import\s+(convmem[\w.]*))", re.MULTILINE)
FACE = {"convmem", "convmem.testing", "convmem.penguiflow"}
"""What a README snippet may import of convmem: the face, the testing kit, the PenguiFlow drop-in."""


def test_readme_snippets_use_only_the_public_face() -> None:
    """The README's code imports `convmem` and `convmem.testing` (and the drop-in), never a layer package."""
    imported = {
        (line, match.group(1) or match.group(2))
        for line, code in _snippets()
        for match in _IMPORT.finditer(code)
    }
    assert {name for _, name in imported} >= {"convmem", "convmem.testing"}
    assert sorted((line, name) for line, name in imported if name not in FACE) == []


def test_the_face_check_catches_a_layer_import() -> None:
    """The check above sees a layer import, in either import form."""
    found = {
        m.group(1) or m.group(2)
        for m in _IMPORT.finditer("from convmem.actors import X\nimport convmem.events\n")
    }
    assert found == {"convmem.actors", "convmem.events"}


def _architecture_snippets() -> list[tuple[int, str]]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


@pytest.mark.parametrize(
    ("line", "code"), _architecture_snippets(), ids=lambda v: f"line{v}" if isinstance(v, int) else ""
)
def test_architecture_snippet_runs(line: int, code: str) -> None:
    """ARCHITECTURE.md's pure-core examples (they import the layers, as an extension does) run too."""
    namespace: dict[str, object] = {"__name__": f"architecture_line_{line}"}
    exec(compile(code, f"ARCHITECTURE.md:{line}", "exec"), namespace)
