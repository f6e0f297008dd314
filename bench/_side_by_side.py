"""Two checkouts side by side: child processes in alternating rounds, and the medians of their figures.

Used by the before/after measures (`bench._write_protocol`, `bench._pool`). Each child is
``python -c CODE ARGS... TREE`` run in `TREE` (the last argument) with `TREE` on
`PYTHONPATH`: ``-c`` puts the working directory first on `sys.path`, so a child started from
anywhere else would import that place's convmem; the children check `convmem.__file__`
against `TREE` and refuse another. A child prints its figures as JSON on its last line.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import write_json

__all__ = ["command_line", "run_in_tree", "side_by_side"]


def run_in_tree(tree: Path, code: str, *args: object) -> dict[str, float]:
    """Run `code` with `args` then the tree's path as arguments, in `tree`; the figures it printed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *map(str, args), str(tree.resolve())],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def side_by_side(
    before: Path,
    after: Path,
    child: Callable[[Path], dict[str, float]],
    *,
    rounds: int,
    what: str,
) -> dict[str, Any]:
    """`child(tree)` for both trees each round, which goes first alternating; every round and the medians."""
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    load = [os.getloadavg()[0]]
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        for name, tree in order if r % 2 == 0 else order[::-1]:
            runs[name].append(child(tree))
        load.append(os.getloadavg()[0])
    return {
        "what": what,
        "rounds": rounds,
        "load_average": load,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": runs,
        "median": {
            name: {k: statistics.median(run[k] for run in figures) for k in figures[0]}
            for name, figures in runs.items()
        },
    }


def command_line(module: str, measure: Callable[[Path, Path], dict[str, Any]]) -> None:
    """``python -m MODULE BEFORE AFTER [OUT.json]``: `measure` the two checkouts side by side.

    The result, with the command that made it, goes to ``OUT.json`` when given; its medians and the
    load beside them are printed.
    """
    if len(sys.argv) not in (3, 4):
        raise SystemExit(f"usage: python -m {module} BEFORE_TREE AFTER_TREE [OUT.json]")
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    out = sys.argv[3] if len(sys.argv) == 4 else None
    result = measure(before, after)
    result["command"] = " ".join(["python -m", module, str(before), str(after), *([out] if out else [])])
    write_json(out, result)
    print(json.dumps({"median": result["median"], "load_average": result["load_average"]}, indent=2))
