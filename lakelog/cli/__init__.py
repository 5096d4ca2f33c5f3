"""The ``lakelog`` command line: one module per command group, each registering its
commands (and its typer app, for a group of subcommands) on the root app of ``root.py``
as it is imported.
"""

from __future__ import annotations

import importlib
import sys

from lakelog.cli.root import app
from log_tables.errors import LakelogError
from log_tables.imports import without_pandas

COMMAND_MODULES = ("serve", "dump_log", "jobs", "groups", "security", "topics", "records", "sql",
                   "cluster")
"""In this order: ``lakelog --help`` lists the commands as they were registered."""
for _module in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the console script: domain errors become one line on stderr, exit 1.
    (The client and httpx are imported only to say an error: ``lakelog sql`` must start
    fast, and the client's imports take a fifth of a second.)"""
    without_pandas()
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
