"""The ``lakelog`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from lakelog import __version__
from log_tables.errors import LakelogError

app = typer.Typer(help="lakelog: a Kafka-style event log stored in Delta Lake tables.",
                  no_args_is_help=True, add_completion=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lakelog {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """lakelog: a Kafka-style event log stored in Delta Lake tables."""


@app.command("dump-log")
def dump_log(
    path: Annotated[Path, typer.Argument(help="A partition directory or one .log segment file.")],
    records: Annotated[bool, typer.Option("--records", help="Print every record too.")] = False,
) -> None:
    """Print the batches of hot segments (like kafka-dump-log): offsets, sizes, CRC validity."""
    from log_tables.dump import dump

    for line in dump(path, records):
        typer.echo(line)


def main() -> None:
    """Entry point of the console script: domain errors become one line on stderr, exit 1."""
    try:
        app()
    except LakelogError as exc:
        print(f"lakelog: error: {exc.message}", file=sys.stderr)
        sys.exit(1)
