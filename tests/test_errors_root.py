"""Every error convmem raises on purpose comes from the one root, `ConvmemError` (convmem/errors.py)."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import convmem
import convmem.errors

PACKAGE = Path(convmem.__file__).resolve().parent

PYTHON_PROTOCOL = frozenset(
    {
        "AttributeError",  # a module's __getattr__
        "ImportError",  # an optional dependency missing (the message names the extra to install)
        "ModuleNotFoundError",
        "KeyboardInterrupt",
        "StopIteration",
        "StopAsyncIteration",
        "SystemExit",
        "GeneratorExit",
    }
)
"""What Python's own protocols raise: not convmem's errors, and callers expect these types."""

BUILTIN_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException) and name not in PYTHON_PROTOCOL
)
"""Raising one of these by name is raising outside the tree."""

INTERNAL_SIGNALS = {
    ("adapters/backends/summarizers/_process.py", "TimeoutError"),  # `_read` tells `_exchange`, which catches
    ("adapters/backends/summarizers/_process.py", "OSError"),  # the same: a closed pipe, caught there
    ("adapters/backends/summarizers/_recommended.py", "KeyError"),  # `Mapping.__getitem__`'s own protocol
    ("adapters/frontends/service/_requests.py", "NotImplementedError"),  # the abstract `_call` of a mixin
    ("adapters/frontends/cli/_demo.py", "ConnectionError"),  # the demo's flaky summarizer, a user's callable
    ("adapters/frontends/cli/_common.py", "ValueError"),  # `_once`, caught by `read_document` (CliError)
}
"""(module, builtin) raises that never reach a caller of convmem, or are left to work under way."""


def builtin_raises(package: Path) -> set[tuple[str, str, int]]:
    """Every ``raise Builtin(...)`` / ``raise Builtin`` in the package, as (module, name, line)."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in BUILTIN_ERRORS:
                    found.add((path.relative_to(package).as_posix(), target.id, node.lineno))
    return found


def test_no_error_is_raised_outside_the_tree() -> None:
    """No module raises a bare ValueError, TypeError, RuntimeError, ... where a caller could see it."""
    assert {r for r in builtin_raises(PACKAGE) if r[:2] not in INTERNAL_SIGNALS} == set()


def test_the_check_sees_a_bare_raise(tmp_path: Path) -> None:
    """The walk finds both forms, and leaves a convmem error alone."""
    (tmp_path / "m.py").write_text(
        "def f():\n    raise ValueError('x')\ndef g():\n    raise TimeoutError\n"
        "def h():\n    raise InvalidInput('f', 'p')\n"
    )
    assert builtin_raises(tmp_path) == {("m.py", "ValueError", 2), ("m.py", "TimeoutError", 4)}


def test_every_error_class_is_under_the_root() -> None:
    """Each class convmem.errors exports descends from ConvmemError; NotBuilt, never raised, is gone."""
    for name in convmem.errors.__all__:
        assert issubclass(getattr(convmem.errors, name), convmem.errors.ConvmemError), name
    assert not hasattr(convmem.errors, "NotBuilt")
    assert issubclass(convmem.errors.WrongThread, RuntimeError)
    assert issubclass(convmem.errors.InternalError, RuntimeError)
