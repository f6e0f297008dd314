"""The public surface: sorted, duplicate-free __all__ lists whose names resolve, and the issue's names."""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import pytest

import convmem


def _modules() -> list[str]:
    names = ["convmem", "convmem.errors"]
    for info in pkgutil.walk_packages(convmem.__path__, "convmem."):
        if not info.name.endswith("__main__"):  # running it is the CLI, not an import
            names.append(info.name)
    return sorted(set(names))


def _isort_key(name: str) -> tuple[int, list[object]]:
    """ruff's RUF022 order: CONSTANTS, then Classes, then everything else; natural order within."""
    group = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return group, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _with_all() -> list[ModuleType]:
    modules = []
    for name in _modules():
        module = importlib.import_module(name)
        if hasattr(module, "__all__"):
            modules.append(module)
    return modules


@pytest.mark.parametrize("module", _with_all(), ids=lambda m: m.__name__)
def test_all_is_sorted_unique_and_resolves(module: ModuleType) -> None:
    """Each module's __all__ is sorted (constants, classes, functions), unique, and every name exists."""
    names = list(module.__all__)
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert names == sorted(names, key=_isort_key)
    missing = [name for name in names if not hasattr(module, name)]
    assert missing == []


@pytest.mark.parametrize(
    "package", ["convmem.events", "convmem.projections", "convmem.actors", "convmem.adapters"]
)
def test_every_layer_package_declares_its_surface(package: str) -> None:
    """Every layer package has an __all__."""
    assert hasattr(importlib.import_module(package), "__all__")


EVENTS_NAMES = {
    "MemoryKey",
    "ConversationTurn",
    "TrajectoryDigest",
    "MessageItem",
    "EntityMention",
    "ShortTermMemoryConfig",
    "MemoryBudget",
    "MemoryIsolation",
    "MemoryHealth",
    "HealthPolicy",
    "Event",
    "TurnAdded",
    "SummaryProduced",
    "HealthChanged",
    "SessionStarted",
    "SessionCleared",
    "SessionRestored",
    "SessionErased",
    "BacklogTrimmed",
    "EVENT_TYPES",
    "UPCASTERS",
    "encode_event",
    "decode_event",
    "encode_event_json",
    "decode_event_json",
}
PROJECTIONS_NAMES = {
    "SessionState",
    "evolve",
    "replay",
    "decide",
    "AddTurn",
    "Clear",
    "Restore",
    "StartSession",
    "SummarySucceeded",
    "SummaryFailed",
    "SummaryRequest",
    "summary_due",
    "next_due_at",
    "llm_context",
    "estimate_tokens",
    "default_token_estimator",
    "to_dict",
    "parse_export",
    "encode_state",
    "decode_state",
    "state_hash",
}


@pytest.mark.parametrize(
    ("package", "expected"), [("convmem.events", EVENTS_NAMES), ("convmem.projections", PROJECTIONS_NAMES)]
)
def test_the_core_packages_expose_the_names_the_issue_names(package: str, expected: set[str]) -> None:
    """convmem.events and convmem.projections export at least the names the foundation issue names."""
    exported = set(importlib.import_module(package).__all__)
    assert expected - exported == set()


def test_implementation_modules_are_private() -> None:
    """Modules inside the layer packages are private (a leading underscore); packages re-export."""
    for name in _modules():
        parts = name.split(".")
        if len(parts) == 3 and parts[1] in ("events", "projections"):
            assert parts[2].startswith("_"), name


def test_the_sort_rule_is_constants_then_classes_then_functions() -> None:
    """The order checked above is ruff's isort-style order, so a misplaced name fails."""
    names = ["decide", "AddTurn", "EXPORT_VERSION", "Command", "item2", "item10"]
    assert sorted(names, key=_isort_key) == [
        "EXPORT_VERSION",
        "AddTurn",
        "Command",
        "decide",
        "item2",
        "item10",
    ]
