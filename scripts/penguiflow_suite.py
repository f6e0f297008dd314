"""Run PenguiFlow's own short-term-memory tests against convmem's drop-in.

    python scripts/penguiflow_suite.py PATH/TO/penguiflow            # with and without a state store
    python scripts/penguiflow_suite.py PATH/TO/penguiflow --store off

PATH is a checkout of PenguiFlow's repository (its ``tests/`` folder is
enough). The tests run unchanged, with pytest, in this Python environment
(it needs ``pytest`` and ``pytest-asyncio`` beside ``convmem[penguiflow]``):
tests/test_short_term_memory.py whole (14 tests) and the 8 short-term-memory
tests of tests/test_react_planner.py. The plugin beside this script
(`penguiflow_suite_plugin.py`) calls ``convmem.penguiflow.install()`` before
the tests are imported, gives every test a fresh embedded log in its own
temporary folder (PenguiFlow's tests expect each memory to start empty, and
reuse the key ``t:u:s``), and with ``--store on`` gives every ReactPlanner
built without a state store PenguiFlow's ``InMemoryStateStore``.
Exit status: 0 when every selected test passed in every mode.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

PLANNER_TESTS = (
    "test_react_planner_injects_short_term_memory_across_runs",
    "test_react_planner_injects_external_memory_hook_as_system_message",
    "test_react_planner_external_memory_hook_not_called_on_resume",
    "test_react_planner_rolling_summary_uses_llm_summarizer",
    "test_react_planner_extracts_memory_key_from_tool_context",
    "test_react_planner_persists_and_hydrates_short_term_memory",
    "test_react_planner_memory_fail_closed_without_key",
    "test_react_planner_session_isolation_by_memory_key",
)


def node_ids(checkout: Path) -> list[str]:
    tests = checkout / "tests"
    for name in ("test_short_term_memory.py", "test_react_planner.py"):
        if not (tests / name).is_file():
            sys.exit(f"penguiflow_suite: {tests / name} not found: give the path of a PenguiFlow checkout")
    planner = tests / "test_react_planner.py"
    return [str(tests / "test_short_term_memory.py"), *(f"{planner}::{name}" for name in PLANNER_TESTS)]


def run(checkout: Path, store: bool, extra: list[str]) -> int:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    env["CONVMEM_SUITE_STORE"] = "on" if store else "off"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "penguiflow_suite_plugin",
        "--rootdir",
        str(checkout),
        "-o",
        "asyncio_mode=auto",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
        "-q",
        *node_ids(checkout),
        *extra,
    ]
    mode = "with" if store else "without"
    print(f"== PenguiFlow's memory tests on convmem, {mode} a state store", flush=True)
    return subprocess.run(command, cwd=checkout, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of PenguiFlow's repository")
    parser.add_argument("--store", choices=("on", "off", "both"), default="both")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.store]
    codes = [run(args.checkout.resolve(), store, args.pytest_args) for store in modes]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
