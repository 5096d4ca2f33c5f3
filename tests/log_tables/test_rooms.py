"""The rooms of log_tables: the root, hot/, cold/, typed/ and spark/ import downwards only,
lazy imports included; and no module of any package grows past 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import log_tables
from tests.test_layers import MAY_IMPORT

PACKAGE = Path(log_tables.__file__).parent
ROOMS = {"": 0, "hot": 1, "cold": 2, "typed": 3, "spark": 4}
"""Each room may import its own modules and those of rooms with a lower number."""
MAX_LINES = 400
PACKAGES = tuple(MAY_IMPORT)
"""Every package of the house, as tests/test_layers.py lists its floors (tests/, bench/
and notebooks/ are not held to the bound)."""


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ROOMS else ""


def _modules() -> dict[str, Path]:
    return {".".join(("log_tables", *p.relative_to(PACKAGE).with_suffix("").parts)): p
            for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every ``log_tables`` module named by an import anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("log_tables"))
        elif isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("log_tables"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_the_rooms_exist_and_every_module_is_in_one() -> None:
    rooms = {_room(m) for m in _modules()}
    assert rooms == set(ROOMS)
    for room in ROOMS:
        assert (PACKAGE / room / "__init__.py").exists()


def test_rooms_import_only_themselves_and_the_rooms_below() -> None:
    modules = _modules()
    upward = []
    for module, path in modules.items():
        for imported in _imports(path):
            if imported not in modules:  # a name imported from a module, not a module
                continue
            if ROOMS[_room(imported)] > ROOMS[_room(module)]:
                upward.append(f"{module} imports {imported}")
    assert not upward, upward


def test_no_module_is_over_400_lines() -> None:
    root = PACKAGE.parent
    paths = [p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))]
    assert all((root / package / "__init__.py").exists() for package in PACKAGES)
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in paths}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}
