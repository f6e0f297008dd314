"""The README's test command names every system package CI installs for the tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_test_command_installs_what_ci_installs() -> None:
    """Each package `.ci/run` gets with apt-get is in the README's test command, installed the same way."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    wanted = set()
    for line in re.findall(r"apt-get install ([^\n>]*)", ci):
        wanted |= {word for word in line.split() if not word.startswith("-")}
    assert wanted == {"chromium"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme[readme.index("# 2. the tests") :]
    block = block[: block.index("```")]
    installed = set(re.search(r"apt-get install -y (.*)", block).group(1).split())  # type: ignore[union-attr]
    assert wanted <= installed
    assert 'pip install -e ".[dev]"' in block
    assert "-m pytest" in block
