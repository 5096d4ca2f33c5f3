"""``lakelog sql``: Spark SQL over the topics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lakelog.cli.root import DataDir, Master, Warehouse, app


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="Spark SQL; every topic is a view, plus "
                                              "`partitions`.")],
    data_dir: DataDir = Path("lakelog-data"),
    warehouse: Warehouse = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON lines.")] = False,
    max_rows: Annotated[int, typer.Option(help="Most rows to print.")] = 1000,
    master: Master = None,
    zookeeper: Annotated[str | None, typer.Option(
        help="A cluster's ZooKeeper (HOST:PORT/chroot), for the leaders in `partitions` "
             "[LAKELOG_ZOOKEEPER].")] = None,
) -> None:
    """Run Spark SQL over the topics (cold and hot tiers) and print the result."""
    from lakelog.sql import run_sql

    for line in run_sql(query, data_dir, warehouse, master, as_json, max_rows, zookeeper):
        typer.echo(line)

