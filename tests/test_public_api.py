"""The public surface: sorted, duplicate-free __all__ lists whose names resolve, and the issue's names."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import convmem
import convmem.actors
import convmem.adapters
import convmem.testing


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


FACE_NAMES = {
    "connect",
    "connect_here",
    "connect_remote",
    "recommended",
    "MemorySystem",
    "SessionHandle",
    "AsyncSessionHandle",
    "ConnectOptions",
    "MemoryKey",
    "ConversationTurn",
    "ShortTermMemoryConfig",
    "MemoryBudget",
    "ConvmemError",
    "InvalidInput",
    "ConcurrencyConflict",
    "SessionClosed",
    "ConvmemSession",
    "ConvmemChatMessageHistory",
    "ConvmemShortTermMemory",
    "RemoteSession",
    "MemoryService",
}
"""What `import convmem` must give: the system and its handles, the values, the errors, the integrations."""


def test_the_flat_face_gives_what_a_user_needs() -> None:
    """`convmem.__all__` is about forty names, the issue's among them, each the layer package's own object."""
    assert set(convmem.__all__) >= FACE_NAMES
    assert 35 <= len(convmem.__all__) <= 55
    for name in convmem.__all__:
        value = getattr(convmem, name)
        home = convmem._LAZY.get(name)
        if home is not None:
            assert value is getattr(importlib.import_module(home), name), name
    assert set(dir(convmem)) >= set(convmem.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = convmem.no_such_name  # type: ignore[attr-defined]


def test_every_face_error_is_a_convmem_error() -> None:
    """The errors on the face are the tree's, under the one root."""
    errors = [getattr(convmem, n) for n in convmem.__all__ if n.endswith(("Error", "Conflict", "Closed"))]
    assert errors
    assert all(issubclass(e, convmem.ConvmemError) for e in errors)


def test_the_testing_kit_gives_the_in_memory_log_a_clock_and_the_contracts() -> None:
    """`convmem.testing` holds the in-memory back end, the manual clock and the two contract suites."""
    assert convmem.testing.InMemoryEventLog is convmem.adapters.InMemoryEventLog
    assert convmem.testing.ManualClock is convmem.actors.ManualClock
    assert {"EventLogContract", "SnapshotStoreContract"} <= set(convmem.testing.__all__)
    contract = convmem.testing.EventLogContract
    assert sum(name.startswith("test_") for name in vars(contract)) >= 30


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(out.stdout.split())


HEAVY = {"msgspec", "pykka", "nats", "httpx", "pytest"}


def test_importing_the_face_or_the_testing_kit_loads_nothing_heavy() -> None:
    """`import convmem` and `import convmem.testing` import no runtime, no NATS client and no pytest."""
    assert _loaded_after("import convmem\nimport convmem.testing") & HEAVY == set()
    assert {"pykka", "pytest"} <= _loaded_after("import convmem.testing\nconvmem.testing.EventLogContract")


SAME_CONCEPT_ACROSS_LAYERS = {
    "_audit.py": "auditing: the pure checks (actors) and the CLI's commands",
    "_dates.py": "turn dates: their text (events) and their place in summaries",
    "_fork.py": "forking a session: the runtime's and the CLI's command",
    "_journal.py": "the erasure journal: the port and its JetStream implementation",
    "_retention.py": "retention: the policies, the plan, the sweeper, the CLI's command",
    "_usage.py": "a tenant's stored bytes: as JetStream counts them, as the service holds its quota",
}
"""Basenames that recur because one concept has a module on several floors (each says which)."""


def test_a_module_basename_means_one_thing() -> None:
    """Two modules share a basename only where they are one concept on different floors."""
    root = Path(convmem.__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in root.rglob("_*.py"):
        if path.name not in {"__init__.py", "__main__.py"}:
            seen.setdefault(path.name, []).append(path.relative_to(root).as_posix())
    shared = {name for name, paths in seen.items() if len(paths) > 1}
    assert shared - SAME_CONCEPT_ACROSS_LAYERS.keys() == set(), {n: seen[n] for n in shared}
