"""The floors of the house: no package imports one above it (or beside it).

Every import counts, at any depth: top level, inside functions (lazy imports) and
under ``if TYPE_CHECKING``, since each is a dependency someone has to keep working.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAY_IMPORT: dict[str, frozenset[str]] = {
    # The table "Packages" of docs/architecture.md and the shared DESIGN.md: arrows
    # point only down. ``cluster/`` sits between log_tables and ingest_api.
    "log_tables": frozenset(),
    "cluster": frozenset({"log_tables"}),
    "consumer_groups": frozenset({"log_tables"}),
    "compaction_jobs": frozenset({"log_tables"}),
    "ingest_api": frozenset({"log_tables", "cluster", "consumer_groups"}),
    "lakelog": frozenset({"log_tables", "cluster", "consumer_groups", "compaction_jobs",
                          "ingest_api"}),
}


def imported_modules(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in a module of ``package``, at any depth;
    relative imports stay in their package. ``importlib.import_module("x")`` counts."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, package if node.level else (node.module or "")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            yield node.lineno, node.args[0].value


def upward_imports(root: Path) -> list[str]:
    """``file:line: package -> package`` for each import that does not point down."""
    found: list[tuple[str, int, str]] = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in imported_modules(tree, package):
                target = module.split(".")[0]
                if target in MAY_IMPORT and target != package and target not in allowed:
                    found.append((str(path.relative_to(root)), line, f"{package} -> {target}"))
    return [f"{path}:{line}: {arrow}" for path, line, arrow in sorted(found)]


def test_no_import_goes_up_a_floor() -> None:
    found = upward_imports(ROOT)
    assert not found, ("imports that go up (or across) a floor; move the code that needs "
                       "both to the package above them:\n" + "\n".join(found))


def test_the_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    (tmp_path / "log_tables").mkdir()
    (tmp_path / "log_tables" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from ingest_api.http.app import App\n"
        "def f():\n"
        "    import consumer_groups.views\n"
        "    importlib.import_module('lakelog.cli')\n")
    (tmp_path / "consumer_groups").mkdir()
    (tmp_path / "consumer_groups" / "b.py").write_text(
        "from log_tables import a\nfrom compaction_jobs.job import Job\n")
    assert upward_imports(tmp_path) == [
        "consumer_groups/b.py:2: consumer_groups -> compaction_jobs",
        "log_tables/a.py:4: log_tables -> ingest_api",
        "log_tables/a.py:6: log_tables -> consumer_groups",
        "log_tables/a.py:7: log_tables -> lakelog",
    ]
