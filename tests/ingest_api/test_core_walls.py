"""The walls of the broker core, and no circles anywhere.

1. Nothing under ``ingest_api/broker/`` imports a web framework, an HTTP client or the
   HTTP front (fastapi, starlette, httpx, uvicorn, ``ingest_api.http``): every import
   counts, at any depth (lazy and ``if TYPE_CHECKING`` ones too), as in
   ``tests/test_layers.py``.
2. No import circles among the modules of the repo's packages. The graph's edges are
   the imports a module makes when it is loaded, plus those under ``if TYPE_CHECKING``
   (a circle a type checker needs is a circle in the design too); imports inside
   functions are left out (they run later, and are this check's one way around a
   circle: each is a dependency someone chose to make late). ``from a.b import c``
   is an edge to the module ``a.b.c`` when there is one, else to ``a.b``; a package's
   ``__init__`` is an edge only when it is named.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_layers import MAY_IMPORT, ROOT, imported_modules

FORBIDDEN = ("fastapi", "starlette", "httpx", "uvicorn", "ingest_api.http")
CORE = Path("ingest_api") / "broker"


def _forbidden(module: str) -> str | None:
    for name in FORBIDDEN:
        if module == name or module.startswith(name + "."):
            return name
    return None


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The module a (possibly relative) ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def core_wall_breaches(root: Path) -> list[str]:
    """``file:line: module`` for each import of the core that goes to HTTP."""
    found = []
    for path in sorted((root / CORE).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        module = _module_name(root, path)
        lines = {(line, name) for line, name in imported_modules(tree, "ingest_api")}
        for node in ast.walk(tree):  # relative imports, resolved (imported_modules
            if isinstance(node, ast.ImportFrom) and node.level:  # names the package only)
                lines.add((node.lineno, _absolute(module, node, path.name == "__init__.py")))
        for line, name in sorted(lines):
            if _forbidden(name) is not None:
                found.append(f"{path.relative_to(root)}:{line}: {name}")
    return found


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when loaded (and those under ``if TYPE_CHECKING``):
    its top level, into ``if``/``try``/``with`` blocks, never into functions or classes."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt
        elif isinstance(stmt, ast.If):
            yield from _load_time_imports(stmt.body)
            yield from _load_time_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody,
                          *(h.body for h in stmt.handlers)):
                yield from _load_time_imports(block)
        elif isinstance(stmt, ast.With):
            yield from _load_time_imports(stmt.body)


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports at load time."""
    paths = {_module_name(root, p): p for package in packages
             for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(module, set())
        for node in _load_time_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(module, node, is_package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                           for a in node.names]
            edges.update(t for t in targets if t in paths and t != module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_core_imports_no_http() -> None:
    found = core_wall_breaches(ROOT)
    assert not found, ("the broker core imports HTTP; move the code to ingest_api/http "
                       "behind a protocol of the core (ingest_api.broker.peers):\n"
                       + "\n".join(found))


def test_no_import_circles() -> None:
    found = circles(import_graph(ROOT, sorted(MAY_IMPORT)))
    assert not found, "import circles (each line one circle):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_wall_check_sees_every_import(tmp_path: Path) -> None:
    core = tmp_path / "ingest_api" / "broker"
    (core / "produce").mkdir(parents=True)
    (core / "clean.py").write_text("import msgspec\nfrom ingest_api.broker import fetch\n"
                                   "from ingest_api.httpish import x\n")
    (core / "produce" / "dirty.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from fastapi import Request\n"
        "if TYPE_CHECKING:\n"
        "    from ingest_api.http.state import AppState\n"
        "def f():\n"
        "    import httpx\n"
        "    from starlette.types import Scope\n"
        "from ...http import models\n"
        "import uvicorn.config\n")
    assert core_wall_breaches(tmp_path) == [
        "ingest_api/broker/produce/dirty.py:2: fastapi",
        "ingest_api/broker/produce/dirty.py:4: ingest_api.http.state",
        "ingest_api/broker/produce/dirty.py:6: httpx",
        "ingest_api/broker/produce/dirty.py:7: starlette.types",
        "ingest_api/broker/produce/dirty.py:8: ingest_api.http",
        "ingest_api/broker/produce/dirty.py:9: uvicorn.config",
    ]


def test_the_circle_check_finds_circles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    # a -> b at load time, b -> a only for the type checker: a circle all the same.
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from pkg.a import A\n")
    # c -> sub.d -> sub.e -> c, through a relative import and a try block.
    (pkg / "c.py").write_text("from pkg.sub import d\n")
    (pkg / "sub" / "d.py").write_text("try:\n    from .e import E\nexcept ImportError:\n"
                                      "    E = None\n")
    (pkg / "sub" / "e.py").write_text("import pkg.c\n")
    # Late imports (in a function) make no circle: f -> a only.
    (pkg / "f.py").write_text("import pkg.a\n")
    (pkg / "a2.py").write_text("def g():\n    import pkg.f\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub.d"] == {"pkg.sub.e"} and graph["pkg.a2"] == set()
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub.d", "pkg.sub.e"]]
