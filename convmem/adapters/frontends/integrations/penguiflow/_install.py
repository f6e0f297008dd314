"""`install()`: PenguiFlow's planner builds convmem memories, by rebinding one name.

ReactPlanner builds its per-key memories with the name `DefaultShortTermMemory`
as ``penguiflow.planner.memory_integration`` imported it from
``penguiflow.planner.memory``. `install()` rebinds that name in both modules
to convmem's class (code importing it afterwards gets convmem's too);
`uninstall()` puts PenguiFlow's back. Both are idempotent.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

from convmem.adapters.frontends.integrations.penguiflow._memory import DefaultShortTermMemory
from convmem.adapters.frontends.integrations.penguiflow._values import INSTALL

__all__ = ["MODULES", "install", "installed", "uninstall"]

MODULES = ("penguiflow.planner.memory", "penguiflow.planner.memory_integration")
"""Where the name is rebound."""

_NAME = "DefaultShortTermMemory"
_lock = threading.Lock()
_originals: dict[str, type] = {}


def _modules() -> list[ModuleType]:
    try:
        return [importlib.import_module(name) for name in MODULES]
    except ImportError as exc:
        raise ImportError(f"the PenguiFlow integration needs the penguiflow package: {INSTALL}") from exc


def install() -> None:
    """Make ``ReactPlanner(short_term_memory=ShortTermMemoryConfig(...))`` build convmem memories."""
    with _lock:
        for module in _modules():
            current = getattr(module, _NAME)
            if current is not DefaultShortTermMemory:
                _originals[module.__name__] = current
                setattr(module, _NAME, DefaultShortTermMemory)


def uninstall() -> None:
    """Put PenguiFlow's own class back (memories already built keep working)."""
    with _lock:
        for module in _modules():
            original = _originals.pop(module.__name__, None)
            if original is not None and getattr(module, _NAME) is DefaultShortTermMemory:
                setattr(module, _NAME, original)


def installed() -> bool:
    """Whether PenguiFlow builds convmem memories now (the name is rebound in both modules)."""
    return all(getattr(module, _NAME) is DefaultShortTermMemory for module in _modules())
