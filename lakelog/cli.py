"""The ``lakelog`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

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


@app.command()
def serve(
    data_dir: Annotated[Path | None, typer.Option(help="Data directory [LAKELOG_DATA_DIR].")] = None,
    host: Annotated[str | None, typer.Option(help="Listen address [LAKELOG_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [LAKELOG_PORT].")] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level [LAKELOG_LOG_LEVEL].")] = None,
) -> None:
    """Run the HTTP server (uvicorn) on the data directory; SIGTERM/SIGINT stop it cleanly."""
    import uvicorn
    from pydantic import ValidationError

    from ingest_api.app import create_app
    from lakelog.settings import Settings

    flags: dict[str, Any] = {k: v for k, v in {"data_dir": data_dir, "host": host, "port": port,
                                               "log_level": log_level}.items() if v is not None}
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        raise LakelogError(f"invalid settings: {exc.errors()[0]['loc']}: "
                           f"{exc.errors()[0]['msg']}") from None
    typer.echo("lakelog settings:", err=True)
    for name, value in settings.describe().items():
        typer.echo(f"  {name} = {value}", err=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level, loop="uvloop", http="httptools",
                limit_concurrency=settings.limit_concurrency, timeout_graceful_shutdown=10,
                access_log=False)


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
