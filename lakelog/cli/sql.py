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
    connect: Annotated[str | None, typer.Option(
        help="The SQL endpoint (Spark Connect URL) to ask; default: the one the server of "
             "--data-dir runs [LAKELOG_SQL_CONNECT].")] = None,
    local: Annotated[bool, typer.Option(
        "--local", help="Start Spark in this process even if an endpoint answers.")] = False,
) -> None:
    """Run Spark SQL over the topics (cold and hot tiers, the live tail included) and print
    the result: on the SQL endpoint of `lakelog serve` when one answers (under a second
    when warm), else on a Spark started here (a line on stderr says so)."""
    from lakelog.cli.root import options
    from lakelog.sql import run_sql

    for line in run_sql(query, data_dir, warehouse, master, as_json, max_rows, zookeeper,
                        connect=connect, api_key=options.api_key, local=local):
        typer.echo(line)

