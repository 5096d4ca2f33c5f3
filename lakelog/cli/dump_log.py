"""``lakelog dump-log``: what hot segment files hold, as kafka-dump-log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lakelog.cli.root import app


@app.command("dump-log")
def dump_log(
    path: Annotated[Path, typer.Argument(help="A partition directory or one .log segment file.")],
    records: Annotated[bool, typer.Option("--records", help="Print every record too.")] = False,
) -> None:
    """Print the batches of hot segments (like kafka-dump-log): offsets, sizes, CRC validity."""
    from log_tables.hot.dump import dump

    for line in dump(path, records):
        typer.echo(line)
