"""The ``lakelog`` command line: one module per command group, each registering its
commands (and its typer app, for a group of subcommands) on the root app of ``root.py``
as it is imported.
"""

from __future__ import annotations

import importlib
import sys

from lakelog.cli.root import app
from log_tables.errors import LakelogError

COMMAND_MODULES = ("serve", "dump_log", "jobs", "groups", "security", "topics", "records", "sql",
                   "cluster")
"""In this order: ``lakelog --help`` lists the commands as they were registered."""
for _module in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the console script: domain errors become one line on stderr, exit 1."""
    import httpx

    from lakelog.client import LakelogClientError

    try:
        app()
    except LakelogClientError as exc:  # first: a LakelogError too, but said with its status
        print(f"lakelog: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except LakelogError as exc:
        print(f"lakelog: error: {exc.message}", file=sys.stderr)
        sys.exit(1)
    except httpx.HTTPError as exc:  # a failure no command turned into words: still one line
        print(f"lakelog: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
