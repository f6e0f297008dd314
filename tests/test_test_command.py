"""The README's test command names every system package CI installs for the tests."""

from __future__ import annotations

import re
import tomllib
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


def long_markers() -> list[str]:
    """The markers pyproject registers: each names a kind of long case."""
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]
    return [marker.split(":", 1)[0] for marker in pytest_ini["ini_options"]["markers"]]


def test_the_default_run_leaves_out_every_long_case_and_ci_runs_them_after_it() -> None:
    """addopts deselects each registered marker; `.ci/run` runs the README's command, then exactly those."""
    markers = long_markers()
    assert sorted(markers) == ["chaos", "slow", "soak"]
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]
    addopts = pytest_ini["ini_options"]["addopts"]
    assert f"-m '{' and '.join(f'not {m}' for m in markers)}'" in addopts
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    default = ci.index("\npython -m pytest -q\n")
    long = re.search(r'\n(?:\w+=1 )*python -m pytest -q -m "([^"]*)"\n', ci)
    assert long is not None, "`.ci/run` does not run the long cases"
    assert long.start() > default, "the long cases run after the default run"
    assert long.group(1) == " or ".join(markers)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f'python -m pytest -m "{long.group(1)}"' in readme
