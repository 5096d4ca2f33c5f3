"""Keeping pandas out of lakelog's own processes.

Nothing lakelog's processes run uses pandas, but pyarrow imports it at the first
``pa.array`` whenever it is installed (PySpark's Connect client needs it, so it often
is): a third of a second at the start of every command and server. The ``lakelog``
command blocks it before anything imports pyarrow."""

from __future__ import annotations

import importlib.abc
import sys


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"lakelog's processes run without {name}", name=name)


def without_pandas() -> None:
    """Make ``import pandas`` fail in this process from now on (pyarrow then does without
    it). For a process's entry point only: never in a library a user imports."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())
