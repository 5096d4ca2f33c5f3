"""The ``lakelog`` command line: one module per command group, each registering its
commands (and its typer app, for a group of subcommands) on the root app of ``root.py``
as it is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

from lakelog.cli.root import app
from log_tables.errors import LakelogError

COMMAND_MODULES = ("serve", "dump_log", "jobs", "groups", "security", "topics", "records", "sql",
                   "cluster")
"""In this order: ``lakelog --help`` lists the commands as they were registered."""
for _module in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["app", "main"]


class _NoPandas(importlib.abc.MetaPathFinder):
    """pandas is not found. Nothing the ``lakelog`` command runs uses it, but pyarrow
    imports it at the first ``pa.array`` when it is installed (PySpark's Connect client
    needs it): a third of a second at the start of every command and server."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"lakelog's commands run without {name}", name=name)


def main() -> None:
    """Entry point of the console script: domain errors become one line on stderr, exit 1.
    (The client and httpx are imported only to say an error: ``lakelog sql`` must start
    fast, and the client's imports take a fifth of a second.)"""
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas())
    try:
        app()
    except LakelogError as exc:
        from lakelog.client import LakelogClientError

        # A client error is said with its status; another domain error by its message.
        print(f"lakelog: error: {exc if isinstance(exc, LakelogClientError) else exc.message}",
              file=sys.stderr)
        sys.exit(1)
    except Exception as exc:
        import httpx

        if not isinstance(exc, httpx.HTTPError):
            raise
        # A failure no command turned into words: still one line.
        print(f"lakelog: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
