"""pytest plugin for `penguiflow_suite.py`: PenguiFlow's tests, unchanged, on convmem's memory.

* before any test module is imported, ``convmem.penguiflow.install()``;
* each test gets a fresh process-wide log: an embedded nats-server on a
  folder of the test's own ``tmp_path`` (closed after the test);
* with ``CONVMEM_SUITE_STORE=on``, a ReactPlanner built without a state store
  gets PenguiFlow's ``InMemoryStateStore``;
* each test checks that PenguiFlow builds convmem's class, and the run ends by
  saying how many convmem memories the tests built.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from penguiflow.planner import ReactPlanner, memory, memory_integration
from penguiflow.state import InMemoryStateStore

import convmem.penguiflow

_built: list[int] = [0]


def pytest_configure(config: pytest.Config) -> None:
    del config
    convmem.penguiflow.install()
    memory_class = convmem.penguiflow.DefaultShortTermMemory
    original_init = memory_class.__init__

    @functools.wraps(original_init)
    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _built[0] += 1
        original_init(self, *args, **kwargs)

    memory_class.__init__ = counting_init  # type: ignore[method-assign]
    if os.environ.get("CONVMEM_SUITE_STORE") == "on":
        planner_init = ReactPlanner.__init__

        @functools.wraps(planner_init)
        def with_store(self: Any, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("state_store") is None:
                kwargs["state_store"] = InMemoryStateStore()
            planner_init(self, *args, **kwargs)

        ReactPlanner.__init__ = with_store  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def convmem_log(tmp_path: Path) -> Iterator[None]:
    """A fresh embedded log for each test, in the test's own folder (``CONVMEM_SUITE_DATA_DIR``: one
    folder that every test and every run shares, as a user's data folder is)."""
    assert memory.DefaultShortTermMemory is convmem.penguiflow.DefaultShortTermMemory
    assert memory_integration.DefaultShortTermMemory is convmem.penguiflow.DefaultShortTermMemory
    shared = os.environ.get("CONVMEM_SUITE_DATA_DIR")  # one folder for every test (and every run)
    convmem.penguiflow.configure(data_dir=Path(shared) if shared else tmp_path / "convmem")
    try:
        yield
    finally:
        convmem.penguiflow.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    store = os.environ.get("CONVMEM_SUITE_STORE", "off")
    built = _built[0]
    terminalreporter.write_line(f"convmem memories built by the tests: {built} (state store: {store})")
