"""Shared test settings: hypothesis profiles and the fixtures every suite may use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from nats_fixtures import *  # noqa: F403
from runtime_helpers import Harness

# CI machines are noisy: no deadlines, a fixed example budget, derandomized so a
# failure reproduces. "dev" explores more when run by hand.
# tiktoken's cl100k_base offline (tests/test_token_counter.py): the copy in the shared data folder
# beside the repository, unless TIKTOKEN_CACHE_DIR says otherwise.
if "TIKTOKEN_CACHE_DIR" not in os.environ:
    for _parent in Path(__file__).resolve().parents:
        if (_parent / "shared" / "data" / "tiktoken").is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(_parent / "shared" / "data" / "tiktoken")
            break

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _export_registry_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Exports the tests write are recorded in a registry of the run's own, not the user's."""
    path = tmp_path_factory.mktemp("exports") / "exports.json"
    previous = os.environ.get("CONVMEM_EXPORTS")
    os.environ["CONVMEM_EXPORTS"] = str(path)  # child processes inherit it
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CONVMEM_EXPORTS", None)
        else:
            os.environ["CONVMEM_EXPORTS"] = previous


@pytest.fixture
def harness() -> Iterator[Harness]:
    """A `Harness` (one log, snapshot store and manual clock) closed after the test, also on failure."""
    h = Harness()
    try:
        yield h
    finally:
        h.close()
