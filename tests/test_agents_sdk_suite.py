"""The runner of the SDK's session suites works, and the README lists what it leaves out."""

from __future__ import annotations

import re
from pathlib import Path

import agents_sdk_suite
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

# A stand-in for an SDK checkout, in our own words: one module that uses SQLiteSession as the
# SDK's tests do, one test that needs no session, and one test the plugin must leave out.
FAKE_SESSION_TESTS = """
import asyncio

from agents import SQLiteSession


def test_two_instances_on_one_file_share_a_history(tmp_path):
    first = SQLiteSession("chat", tmp_path / "history.db")
    asyncio.run(first.add_items([{"role": "user", "content": "hi"}]))
    again = SQLiteSession("chat", tmp_path / "history.db", session_settings={"limit": 5})
    assert type(again).__name__ == "SQLiteStandIn"
    assert asyncio.run(again.get_items()) == [{"role": "user", "content": "hi"}]
    assert asyncio.run(SQLiteSession("chat").get_items()) == []  # ":memory:" is a fresh one


def test_that_builds_no_session():
    assert True


def test_sqlite_session_file_lock_is_shared_across_instances():
    raise AssertionError("left out: it must never run")
"""


@pytest.mark.slow  # ~20 s: a pytest run of its own, importing the SDK (`.ci/run` runs it)
def test_the_plugin_swaps_sqlite_for_convmem_and_counts_only_session_tests(tmp_path: Path) -> None:
    """Run on a fake checkout: the session test passes on convmem, the excluded one is deselected."""
    (tmp_path / "tests" / "memory").mkdir(parents=True)
    (tmp_path / "tests" / "memory" / "test_session.py").write_text(FAKE_SESSION_TESTS, encoding="utf-8")
    result = agents_sdk_suite.run(tmp_path, "memory", [])
    assert result["counts"] == {"passed": 1, "failed": 0, "skipped": 0}
    assert list(result["results"]) == [
        "tests/memory/test_session.py::test_two_instances_on_one_file_share_a_history"
    ]


def test_the_readme_lists_every_test_left_out_with_its_reason() -> None:
    """The README's table of left-out SDK tests is exactly the plugin's EXCLUDED."""
    text = README.read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([^`]+::test_[^`]+)` \| (.+) \|$", text, flags=re.MULTILINE))
    expected = {nodeid.removeprefix("tests/"): reason for nodeid, reason in agents_sdk_suite.EXCLUDED.items()}
    assert rows == expected
