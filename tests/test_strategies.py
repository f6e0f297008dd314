"""One entry per strategy: the three vocabularies' tables, how they relate, and mypy's closing check."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

import convmem
from convmem.adapters.frontends.service._operations import _VIEWS
from convmem.adapters.frontends.service._protocol import VIEWS, ViewName
from convmem.errors import InvalidConfig
from convmem.events import (
    AgentsMemoryConfig,
    AgentsStrategy,
    ShortTermMemoryConfig,
    Strategy,
    strategy_reads_summaries,
    strategy_summarizes,
)
from convmem.projections import (
    AGENTS_STRATEGIES,
    CONTEXT_STRATEGIES,
    MEMORY_VIEWS,
    MemoryType,
    Shown,
    _strategies,
    create_memory,
    strategy_table,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(convmem.__file__).resolve().parent


def _rendered_table() -> list[tuple[str, str, str, str]]:
    return [
        (shown.value, context or "", agents or "", memory.value if memory is not None else "")
        for shown, context, agents, memory in strategy_table()
    ]


def test_every_name_of_each_vocabulary_has_exactly_one_entry() -> None:
    """Each table holds every name of its vocabulary once, under its own name."""
    assert tuple(CONTEXT_STRATEGIES) == get_args(Strategy)
    assert tuple(AGENTS_STRATEGIES) == get_args(AgentsStrategy)
    assert tuple(MEMORY_VIEWS) == tuple(MemoryType)
    assert all(entry.name == name for name, entry in CONTEXT_STRATEGIES.items())
    assert all(entry.name == name for name, entry in AGENTS_STRATEGIES.items())
    assert all(entry.memory_type is kind for kind, entry in MEMORY_VIEWS.items())


def test_each_vocabulary_names_each_idea_at_most_once_and_every_idea_is_named() -> None:
    """A reader maps names across vocabularies by what they show: no idea has two names in one."""
    for table in (CONTEXT_STRATEGIES, AGENTS_STRATEGIES, MEMORY_VIEWS):
        counts = collections.Counter(entry.shown for entry in table.values())
        assert max(counts.values()) == 1, counts
    named = {
        entry.shown
        for table in (CONTEXT_STRATEGIES, AGENTS_STRATEGIES, MEMORY_VIEWS)
        for entry in table.values()
    }
    assert named == set(Shown)


def _markdown_rows(text: str, header: str) -> list[tuple[str, ...]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        rows.append(tuple(cells))
    return rows


def test_the_readme_table_is_the_code_table() -> None:
    """README's table of the three vocabularies says what the strategy tables say."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _markdown_rows(readme, "| what the model sees |") == _rendered_table()


def test_the_strategies_docstring_table_is_the_code_table() -> None:
    """The table a reader meets first, in ``_strategies``' docstring, is the tables' own."""
    doc = _strategies.__doc__ or ""
    lines = doc.splitlines()
    rule = [i for i, line in enumerate(lines) if line.startswith("====")]
    columns = [match.span() for match in re.finditer(r"=+", lines[rule[0]])]
    rows = []
    for line in lines[rule[1] + 1 : rule[2]]:
        cells = [line[a : b + 3].strip().strip("`") for a, b in columns[:-1]] + [line[columns[-1][0] :]]
        rows.append(tuple(cell.strip().strip("`") for cell in cells))
    assert rows == _rendered_table()


def test_only_rolling_summary_summarizes_and_summarizing_needs_it() -> None:
    """README: only rolling_summary asks for summaries; summarizing needs strategy='rolling_summary'."""
    assert [name for name in get_args(Strategy) if strategy_summarizes(name)] == ["rolling_summary"]
    assert [name for name in get_args(AgentsStrategy) if strategy_reads_summaries(name)] == ["summarizing"]
    summarizing = AgentsMemoryConfig(strategy="summarizing")
    for strategy in ("none", "truncation"):
        with pytest.raises(InvalidConfig, match="summarizing needs strategy='rolling_summary'"):
            ShortTermMemoryConfig(strategy=strategy, agents=summarizing)
    assert ShortTermMemoryConfig(strategy="rolling_summary", agents=summarizing).summarizes


def test_a_bad_strategy_name_is_refused_naming_the_choices() -> None:
    """Validation lists every name of the vocabulary, from the literal itself."""
    with pytest.raises(InvalidConfig, match="strategy: must be none, truncation or rolling_summary, got 'x'"):
        ShortTermMemoryConfig(strategy="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match="must be none, trimming, summarizing or compacting, got 'x'"):
        AgentsMemoryConfig(strategy="x")  # type: ignore[arg-type]


def test_create_memory_builds_each_type_from_its_entry() -> None:
    """`create_memory` picks the standalone class from the memory's entry; anything else is refused."""
    for kind, entry in MEMORY_VIEWS.items():
        memory = create_memory(kind)
        assert type(memory) is entry.memory_class
        assert memory.memory_type is kind
    with pytest.raises(ValueError, match="unsupported memory type 'buffer'"):
        create_memory("buffer")  # type: ignore[arg-type]


def test_the_service_offers_the_agents_items_and_every_memory_view() -> None:
    """The ``views`` operation's names follow the memory table: a new memory type is served or this fails."""
    expected = ("agents", *(kind.value for kind in MemoryType))
    assert expected == VIEWS
    assert get_args(ViewName) == expected
    assert tuple(_VIEWS) == expected


_NEW_NAMES = {
    "events/_config.py": [
        (
            'Strategy = Literal["none", "truncation", "rolling_summary"]',
            'Strategy = Literal["none", "truncation", "rolling_summary", "sliding"]',
        ),
        (
            'AgentsStrategy = Literal["none", "trimming", "summarizing", "compacting"]',
            'AgentsStrategy = Literal["none", "trimming", "summarizing", "compacting", "pinning"]',
        ),
    ],
    "projections/_memories.py": [('    ENTITY = "entity"\n', '    ENTITY = "entity"\n    GRAPH = "graph"\n')],
}


def _mypy(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--python-version",
            "3.11",
            "--no-incremental",
            "--config-file",
            "",
            "-p",
            "convmem",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_mypy_points_at_every_place_a_new_strategy_must_be_handled(tmp_path: Path) -> None:
    """A name added to a vocabulary fails mypy at its table entry and at the configuration's facts."""
    copy = tmp_path / "convmem"
    copy.mkdir()
    for name in ("errors.py", "py.typed"):
        shutil.copy(PACKAGE / name, copy / name)
    # Not the package's own __init__: the face names (and so imports, for mypy) every layer, and the
    # copy would type-check the whole package and its dependencies (80 s, not 8).
    (copy / "__init__.py").write_text('"""The two pure layers alone."""\n', encoding="utf-8")
    for layer in ("events", "projections"):
        shutil.copytree(PACKAGE / layer, copy / layer, ignore=shutil.ignore_patterns("__pycache__"))
    as_is = _mypy(tmp_path)
    assert as_is.returncode == 0, (
        as_is.stdout
    )  # the copy alone type-checks: what fails below is the new names
    for relative, edits in _NEW_NAMES.items():
        path = copy / relative
        text = path.read_text(encoding="utf-8")
        for old, new in edits:
            assert old in text, f"{relative} no longer holds {old!r}: update this test"
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    result = _mypy(tmp_path)
    assert result.returncode == 1
    found = {
        (Path(match.group(1)).as_posix(), match.group(2))
        for match in re.finditer(
            r"^(convmem/\S+\.py):\d+: error: .*\"(Literal\['\w+'\]|MemoryType)\"", result.stdout, re.M
        )
    }
    assert found >= {
        ("convmem/events/_config.py", "Literal['sliding']"),  # strategy_summarizes
        ("convmem/events/_config.py", "Literal['pinning']"),  # strategy_reads_summaries
        ("convmem/projections/_strategies.py", "Literal['sliding']"),  # its ContextStrategy entry
        ("convmem/projections/_strategies.py", "Literal['pinning']"),  # its AgentsView entry
    }, result.stdout
    assert re.search(r"^convmem/projections/_strategies\.py:\d+: error: .*GRAPH", result.stdout, re.M), (
        result.stdout
    )
