"""The layer rule, checked by walking imports: adapters -> actors -> projections -> events; a pure core.

This is the project's one layer checker, and it also finds import circles. The house's quick hook
(``check_layers.py`` among the shared hooks, run before a session stops)
checks the same rule with shorter lists; every kind of violation it reports
is a case below (`HOUSE_HOOK_CASES`), so nothing it could find gets past
this test. Each package also says in its docstring what it holds.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import convmem

LAYERS = ("events", "projections", "actors", "adapters")
"""Lowest first: a layer may import only the layers before it."""

PURE = ("events", "projections")
IMPURE_MODULES = frozenset(
    {
        "pykka",
        "nats",
        "asyncio",
        "threading",
        "logging",
        "time",
        "random",
        "uuid",
        "socket",
        "subprocess",
        "os",
        "httpx",
        "requests",
        "concurrent",
        "secrets",
        "multiprocessing",
    }
)
"""What does I/O, runs threads, keeps time or draws randomness: none of it in the pure layers."""
IMPURE_CALLS = frozenset(
    {"now", "utcnow", "today", "uuid1", "uuid4", "time", "monotonic", "perf_counter", "sleep"}
)
"""Calls that read a clock or make an id (e.g. ``datetime.now()``): time and ids come in as arguments."""


def _layer(module: str, package: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == package and parts[1] in LAYERS:
        return parts[1]
    return None


def _imported(
    node: ast.Import | ast.ImportFrom, module_parts: tuple[str, ...], is_package: bool
) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = list(module_parts if is_package else module_parts[:-1])
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
        return [prefix] if node.module else [f"{prefix}.{alias.name}" for alias in node.names]
    module = node.module or ""
    return [module, *(f"{module}.{alias.name}" for alias in node.names)]


def layer_violations(package_dir: Path) -> list[str]:
    """Every import or call in `package_dir` that breaks the layer rule, as ``path:line: what``."""
    package = package_dir.name
    problems: list[str] = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        is_package = path.name == "__init__.py"
        parts = relative.with_suffix("").parts
        module_parts = parts[:-1] if is_package else parts
        mine = _layer(".".join(module_parts), package)
        if mine is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as exc:
            problems.append(
                f"{relative}:{exc.lineno}: does not parse ({exc.msg}), so its imports are unknown"
            )
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _imported(node, module_parts, is_package):
                    other = _layer(name, package)
                    if other is not None and LAYERS.index(other) > LAYERS.index(mine):
                        problems.append(f"{relative}:{node.lineno}: {mine}/ imports {name}, a higher layer")
                    if mine in PURE and name.split(".")[0] in IMPURE_MODULES:
                        problems.append(
                            f"{relative}:{node.lineno}: {mine}/ imports {name} (I/O, clock or randomness)"
                        )
            elif mine in PURE and isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in IMPURE_CALLS:
                    problems.append(
                        f"{relative}:{node.lineno}: {mine}/ calls {called}() (time and ids are arguments)"
                    )
    return problems


PACKAGE_DIR = Path(convmem.__file__).resolve().parent


def test_the_package_keeps_the_layer_rule() -> None:
    """events/ and projections/ do no I/O and keep no time; no layer imports a higher one."""
    assert layer_violations(PACKAGE_DIR) == []


def test_every_layer_exists_where_the_checker_looks() -> None:
    """The checker walks real layer folders (a renamed folder would make it vacuous)."""
    for layer in LAYERS:
        assert (PACKAGE_DIR / layer / "__init__.py").is_file(), layer
    assert any((PACKAGE_DIR / "events").glob("_*.py"))
    assert any((PACKAGE_DIR / "projections").glob("_*.py"))


def _write(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for layer in LAYERS:
        (package / layer).mkdir(parents=True, exist_ok=True)
        (package / layer / "__init__.py").touch()
    (package / "__init__.py").touch()
    return package


HOUSE_HOOK_IMPURE = (
    "pykka", "nats", "asyncio", "threading", "logging", "time", "random",
    "socket", "subprocess", "os", "httpx", "requests", "concurrent",
)  # fmt: skip
"""The modules the house hook refuses in a pure layer (each must be refused here too)."""
HOUSE_HOOK_CALLS = ("now", "utcnow", "uuid4", "uuid1", "time", "monotonic", "perf_counter")
"""The calls the house hook refuses in a pure layer."""

HOUSE_HOOK_CASES = [
    *(({"events/_bad.py": f"import {name}\n"}, f"events/ imports {name}") for name in HOUSE_HOOK_IMPURE),
    *(
        ({"projections/_bad.py": f"from {name} import x\n"}, f"projections/ imports {name}")
        for name in HOUSE_HOOK_IMPURE
    ),
    *(({"projections/_bad.py": f"y = x.{name}()\n"}, f"calls {name}()") for name in HOUSE_HOOK_CALLS),
    *(({"events/_bad.py": f"y = {name}()\n"}, f"calls {name}()") for name in HOUSE_HOOK_CALLS),
    ({"events/_bad.py": "from pkg.projections import evolve\n"}, "events/ imports pkg.projections"),
    ({"projections/_bad.py": "import pkg.actors\n"}, "projections/ imports pkg.actors"),
    ({"actors/_bad.py": "from pkg.adapters._nats import x\n"}, "actors/ imports pkg.adapters._nats"),
    ({"projections/_bad.py": "from ..adapters import x\n"}, "projections/ imports pkg.adapters"),
    ({"projections/__init__.py": "from ..actors._session import x\n"}, "projections/ imports pkg.actors"),
    ({"events/_bad.py": "def broken(:\n"}, "events/_bad.py:1: does not parse"),
]
"""One case per kind of violation the house hook reports: the project's checker reports each."""


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        *HOUSE_HOOK_CASES,
        ({"events/_bad.py": "import time\n"}, "events/ imports time"),
        ({"events/_bad.py": "from uuid import uuid4\n"}, "events/ imports uuid"),
        ({"projections/_bad.py": "import asyncio\n"}, "projections/ imports asyncio"),
        ({"projections/_bad.py": "import logging.handlers\n"}, "projections/ imports logging.handlers"),
        ({"projections/_bad.py": "from concurrent.futures import Future\n"}, "imports concurrent.futures"),
        ({"events/_bad.py": "import datetime\nx = datetime.datetime.now()\n"}, "events/ calls now()"),
        ({"projections/_bad.py": "from datetime import date\nx = date.today()\n"}, "calls today()"),
        ({"events/_bad.py": "from pkg.projections import evolve\n"}, "events/ imports pkg.projections"),
        ({"events/_bad.py": "from pkg import projections\n"}, "events/ imports pkg.projections"),
        ({"projections/_bad.py": "from ..actors import _session\n"}, "projections/ imports pkg.actors"),
        ({"projections/sub/_bad.py": "from ...adapters import x\n"}, "projections/ imports pkg.adapters"),
        ({"actors/_bad.py": "import pkg.adapters._nats\n"}, "actors/ imports pkg.adapters._nats"),
    ],
)
def test_the_checker_catches_a_bad_package(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    """Run on a small synthetic package, the checker reports each kind of violation."""
    problems = layer_violations(_write(tmp_path, files))
    assert any(expected in problem for problem in problems), problems


def test_the_checker_accepts_a_good_package(tmp_path: Path) -> None:
    """Imports that point down, and pure modules, pass."""
    package = _write(
        tmp_path,
        {
            "events/_ok.py": "import json\nimport msgspec\nfrom datetime import datetime\n",
            "projections/_ok.py": "from pkg.events import x\nfrom ..events import y\nfrom . import _other\n",
            "actors/_ok.py": "import threading\nimport time\nfrom pkg.projections import evolve\n",
            "adapters/_ok.py": "import asyncio\nfrom pkg.actors import System\n",
        },
    )
    assert layer_violations(package) == []


def _packages(root: Path) -> list[Path]:
    return sorted(path.parent for path in root.rglob("__init__.py"))


def test_every_package_says_what_it_holds() -> None:
    """Each package's docstring opens with a sentence of what it holds and names each of its subpackages."""
    problems = []
    for package in _packages(PACKAGE_DIR):
        relative = package.relative_to(PACKAGE_DIR.parent)
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        first = (doc or "").split("\n\n")[0]
        if len(first.split()) < 5 or not first.rstrip().endswith("."):
            problems.append(f"{relative}: no opening sentence saying what it holds ({first!r})")
            continue
        for sub in _packages(package):
            if sub.parent == package and f"{sub.name}/" not in (doc or ""):
                problems.append(f"{relative}: its docstring does not name its subpackage {sub.name}/")
    assert problems == []


# No import circle ---------------------------------------------------------------------------------
# Imports at module level count, those under ``if TYPE_CHECKING:`` too (a type-only import is still
# a dependency a reader must follow); imports inside functions are left out (they cannot form a
# circle at import time). A package's ``__init__`` counts as the module that re-exports its
# submodules, so ``a._x -> b -> a`` through ``a/__init__`` is a circle too. ARCHITECTURE.md
# promises this.


def _load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            for child in ast.walk(node):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    found.append(child)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Each module of `package_dir` -> the package's modules it imports at load time (see above)."""
    modules: dict[str, tuple[Path, tuple[str, ...], bool]] = {}
    for path in package_dir.rglob("*.py"):
        is_package = path.name == "__init__.py"
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        module_parts = parts[:-1] if is_package else parts
        modules[".".join(module_parts)] = (path, module_parts, is_package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, module_parts, is_package) in modules.items():
        for node in _load_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for imported in _imported(node, module_parts, is_package):
                target = imported
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(f"{target}."):
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    assert circles(import_graph(PACKAGE_DIR)) == []


def test_the_check_finds_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg._a import A\n")
    (package / "_a.py").write_text("from pkg._b import B\nA = 1\n")
    (package / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg._c import C\nB = 2\n"
    )
    (package / "_c.py").write_text("from pkg._a import A\nC = 3\n")
    assert circles(import_graph(package)) == [["pkg._a", "pkg._b", "pkg._c"]]


def test_a_function_level_import_is_no_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_a.py").write_text("from pkg._b import B\nA = 1\n")
    (package / "_b.py").write_text("def f():\n    from pkg._a import A\n    return A\nB = 2\n")
    assert circles(import_graph(package)) == []


# Back ends and front ends -------------------------------------------------------------------------
# Inside adapters/, backends/ implements the runtime's ports and frontends/ uses the runtime. A front
# end reaches a back end only through a package's names (``convmem.adapters.backends``,
# ``convmem.adapters.backends.jetstream``), never a private module; a back end never imports a front
# end. Imports inside functions count too: they are still a dependency.

ENDS = ("backends", "frontends")


def _end(module: str, package: str) -> str | None:
    parts = module.split(".")
    if len(parts) >= 3 and parts[0] == package and parts[1] == "adapters" and parts[2] in ENDS:
        return parts[2]
    return None


def end_violations(package_dir: Path) -> list[str]:
    """Every import that crosses between back ends and front ends the wrong way, as ``path:line: what``."""
    package = package_dir.name
    problems: list[str] = []
    for path in sorted((package_dir / "adapters").rglob("*.py")):
        relative = path.relative_to(package_dir.parent)
        is_package = path.name == "__init__.py"
        parts = relative.with_suffix("").parts
        module_parts = parts[:-1] if is_package else parts
        mine = _end(".".join(module_parts), package)
        if mine is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _imported(node, module_parts, is_package)
            if isinstance(node, ast.ImportFrom) and node.module:  # `from .x import _y` may name a module
                names += [f"{names[0]}.{alias.name}" for alias in node.names]
            for name in names:
                other = _end(name, package)
                if other is None or other == mine:
                    continue
                if mine == "backends":
                    problems.append(f"{relative}:{node.lineno}: a back end imports {name}, a front end")
                elif any(part.startswith("_") for part in name.split(".")[3:]):
                    problems.append(
                        f"{relative}:{node.lineno}: a front end imports {name}, a back end's internals"
                    )
    return problems


def test_front_ends_use_back_ends_only_through_their_packages() -> None:
    """No front end imports a back end's private module, and no back end imports a front end."""
    assert end_violations(PACKAGE_DIR) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"adapters/frontends/_x.py": "from pkg.adapters.backends.jetstream._log import Log\n"},
            "a front end imports pkg.adapters.backends.jetstream._log",
        ),
        (
            {"adapters/frontends/cli/_x.py": "def f():\n    from ...backends import _registry\n"},
            "a front end imports pkg.adapters.backends._registry",
        ),
        (
            {"adapters/backends/_x.py": "from pkg.adapters.frontends.service import Service\n"},
            "a back end imports pkg.adapters.frontends.service",
        ),
        (
            {"adapters/backends/jetstream/_x.py": "import pkg.adapters.frontends\n"},
            "a back end imports pkg.adapters.frontends",
        ),
    ],
)
def test_the_end_check_catches_a_crossing(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    """Run on a small package, the check reports each wrong crossing, however it is written."""
    for end in ENDS:
        files = {f"adapters/{end}/__init__.py": "", **files}
    problems = end_violations(_write(tmp_path, files))
    assert any(expected in problem for problem in problems), problems


def test_the_end_check_accepts_package_names(tmp_path: Path) -> None:
    """A front end may use a back end's package names; both may use the shared adapters modules."""
    files = {
        "adapters/backends/__init__.py": "",
        "adapters/frontends/__init__.py": "",
        "adapters/frontends/_ok.py": (
            "from pkg.adapters.backends import InMemoryEventLog\n"
            "from pkg.adapters.backends.jetstream import JetStreamBackend\nfrom pkg.adapters._auth import x\n"
        ),
        "adapters/backends/_ok.py": (
            "from pkg.adapters._loop_thread import x\nfrom pkg.adapters.backends.keys import y\n"
        ),
    }
    assert end_violations(_write(tmp_path, files)) == []


def test_importing_the_in_memory_log_loads_no_nats_client_nor_httpx() -> None:
    """The in-memory back end (and convmem.testing's) imports neither nats-py nor httpx (nor a front end)."""
    probe = (
        "import sys\nfrom convmem.testing import InMemoryEventLog, InMemorySnapshotStore\n"
        "from convmem.adapters.backends import InMemoryBackend\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('nats', 'httpx')"
        " or m.startswith('convmem.adapters.frontends'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.split() == []
