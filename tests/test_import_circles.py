"""No module of convmem imports another that imports it back, directly or through others.

Imports at module level count, those under ``if TYPE_CHECKING:`` too (a
type-only import is still a dependency a reader must follow); imports inside
functions are left out (they cannot form a circle at import time). A
package's ``__init__`` counts as the module that re-exports its submodules,
so ``a._x -> b -> a`` through ``a/__init__`` is a circle too. ARCHITECTURE.md promises this.
"""

from __future__ import annotations

import ast
from pathlib import Path

import convmem

PACKAGE_DIR = Path(convmem.__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package under `root` -> the package's modules it imports at load time."""
    modules = {_module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _load_time_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, base] if base else here)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for imported in targets:
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
