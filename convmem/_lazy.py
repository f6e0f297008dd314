"""Lazy exports: a package's public names, each imported from its home module on first use.

A package that keeps its import light writes its table of names and homes and
takes its module ``__getattr__`` and ``__dir__`` from here::

    _LAZY = {"Name": "package._home", ...}
    __getattr__, __dir__ = lazy_exports(globals(), _LAZY)

A name is looked up once: the first access stores it in the package's
namespace, where later lookups find it without reaching ``__getattr__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` that import each name of `homes` on first use."""
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
            namespace[name] = value  # looked up once
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
