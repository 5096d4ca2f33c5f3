"""``lakelog serve``: the server on a data directory, with the jobs scheduled."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lakelog.cli.root import app
from log_tables.errors import LakelogError


def start_lines(settings: Any) -> list[str]:
    """What ``serve`` prints as it starts: where its dashboard and SQL endpoint are, and
    the settings not at their default (all of them at log level debug)."""
    scheme = "https" if settings.tls_cert else "http"
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    url = f"{scheme}://{host}:{settings.port}"
    if settings.sql_port or settings.jdbc_port:
        where = ", ".join(w for w in (
            settings.sql_port and f"sc://{settings.sql_host}:{settings.sql_port}",
            settings.jdbc_port and f"JDBC on 127.0.0.1:{settings.jdbc_port}") if w)
        sql = f"starting ({where}); its Spark takes 10-20 s, the log says when it is ready " \
              "or why not, the dashboard shows its state"
    else:
        sql = "off (--sql-port 0); `lakelog sql` starts Spark itself"
    debug = settings.log_level.lower() == "debug"
    shown = settings.describe() if debug else settings.changed()
    lines = [f"lakelog on {settings.data_dir.absolute()}: {url}",
             f"  dashboard     {url}/ui", f"  SQL endpoint  {sql}",
             f"  Kafka         {host}:{settings.kafka_port}" if settings.kafka_port else
             "  Kafka         off (--kafka-port PORT serves Kafka's protocol)",
             f"  settings      {'all' if debug else 'not at their default'}"
             f" ({len(settings.describe())} in all: --log-level debug prints them; their defaults "
             "are in docs/operations.md)"]
    return lines + [f"    {name} = {value}" for name, value in shown.items()]


@app.command()
def serve(
    data_dir: Annotated[Path | None, typer.Option(help="Data directory [LAKELOG_DATA_DIR].")] = None,
    host: Annotated[str | None, typer.Option(help="Listen address [LAKELOG_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [LAKELOG_PORT].")] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level [LAKELOG_LOG_LEVEL].")] = None,
    warehouse: Annotated[str | None, typer.Option(
        help="Delta warehouse path or URI [LAKELOG_WAREHOUSE].")] = None,
    tier_interval_ms: Annotated[int | None, typer.Option(
        help="Tiering job interval; 0 disables [LAKELOG_TIER_INTERVAL_MS].")] = None,
    spark_master: Annotated[str | None, typer.Option(
        "--master", help="Spark master for jobs [LAKELOG_SPARK_MASTER].")] = None,
    auth: Annotated[str | None, typer.Option(
        help="api-key (default) or none (loopback only) [LAKELOG_AUTH].")] = None,
    allow_insecure_non_loopback: Annotated[bool | None, typer.Option(
        "--allow-insecure-non-loopback", help="Let --auth none listen beyond loopback "
        "[LAKELOG_ALLOW_INSECURE_NON_LOOPBACK].")] = None,
    tls_cert: Annotated[Path | None, typer.Option(
        help="TLS certificate (PEM); with --tls-key, serve HTTPS [LAKELOG_TLS_CERT].")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        help="TLS private key (PEM) [LAKELOG_TLS_KEY].")] = None,
    broker_id: Annotated[int | None, typer.Option(
        help="This broker's id in a cluster, with --zookeeper [LAKELOG_BROKER_ID].")] = None,
    zookeeper: Annotated[str | None, typer.Option(
        help="ZooKeeper HOST:PORT/CHROOT (chroot optional) of the cluster \\[LAKELOG_ZOOKEEPER].")] = None,
    broker_rack: Annotated[str | None, typer.Option(
        help="Rack or zone of this broker [LAKELOG_BROKER_RACK].")] = None,
    sql_port: Annotated[int | None, typer.Option(
        help="Spark Connect port of the SQL endpoint; 0: none [LAKELOG_SQL_PORT].")] = None,
    jdbc_port: Annotated[int | None, typer.Option(
        help="JDBC (Hive Thrift) port on loopback; 0: none [LAKELOG_JDBC_PORT].")] = None,
    kafka_port: Annotated[int | None, typer.Option(
        help="Kafka protocol listener port (a broker alone, --auth none, for now); 0: none "
             "[LAKELOG_KAFKA_PORT].")] = None,
    access_log: Annotated[str | None, typer.Option(
        help="Append one line per HTTP request to this file; - for standard output "
             "[LAKELOG_ACCESS_LOG].")] = None,
) -> None:
    """Run the HTTP server (uvicorn) on the data directory, with the jobs scheduled;
    SIGTERM/SIGINT stop it cleanly."""
    import uvicorn
    from pydantic import ValidationError

    from compaction_jobs.scheduler import Intervals, JobProcess
    from ingest_api.http.app import create_app
    from lakelog.settings import Settings

    flags: dict[str, Any] = {k: v for k, v in {
        "data_dir": data_dir, "host": host, "port": port, "log_level": log_level,
        "warehouse": warehouse, "tier_interval_ms": tier_interval_ms,
        "spark_master": spark_master, "auth": auth, "tls_cert": tls_cert, "tls_key": tls_key,
        "broker_id": broker_id, "zookeeper": zookeeper, "broker_rack": broker_rack,
        "allow_insecure_non_loopback": allow_insecure_non_loopback, "sql_port": sql_port,
        "jdbc_port": jdbc_port, "access_log": access_log,
        "kafka_port": kafka_port}.items() if v is not None}
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise LakelogError(f"invalid settings: {where + ': ' if where else ''}"
                           f"{first['msg'].removeprefix('Value error, ')}") from None
    from log_tables.errors import StorageError
    from log_tables.storage import check_warehouse

    try:
        check_warehouse(settings.layout.warehouse)
    except StorageError as exc:
        raise LakelogError(str(exc)) from None
    for line in start_lines(settings):
        typer.echo(line, err=True)
    scheduler = JobProcess(settings.layout, Intervals(
        settings.tier_interval_ms, settings.retention_interval_ms, settings.compact_interval_ms,
        settings.upkeep_interval_ms, settings.vacuum_retention_hours), settings.spark_master,
        settings.log_level, cluster=settings.zookeeper is not None)
    from lakelog.endpoint.process import EndpointProcess

    endpoint = EndpointProcess(settings.layout, settings)
    services = [s for s in (scheduler, endpoint) if s.enabled]
    from ingest_api.http.http_protocol import bounded_protocol

    http = bounded_protocol(settings.max_request_head_bytes,
                            settings.request_head_timeout_ms / 1000,
                            settings.request_body_idle_timeout_ms / 1000)
    app = create_app(settings, services)
    # Rows of the dashboard's health (ingest_api.http.dashboard.health): one line each.
    app.state.services["jobs"] = scheduler.status
    app.state.services["sql"] = endpoint.state if endpoint.enabled else {"state": "off"}
    uvicorn.run(app, host=settings.host, port=settings.port,
                log_level=settings.log_level, loop="uvloop", http=http,
                limit_concurrency=settings.limit_concurrency, timeout_graceful_shutdown=10,
                access_log=False, ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key)
