"""The ``lakelog`` command line."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from lakelog import __version__
from lakelog.cli_help import LakelogGroup
from log_tables.errors import LakelogError

if TYPE_CHECKING:
    from lakelog.console import ConsoleRecord
    from lakelog.profile import ApiKey

app = typer.Typer(help="lakelog: a Kafka-style event log stored in Delta Lake tables.",
                  no_args_is_help=True, add_completion=False, cls=LakelogGroup)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lakelog {__version__}")
        raise typer.Exit()


DEFAULT_RETRY_TIMEOUT_MS = 30_000


@dataclass(slots=True)
class _Options:
    """The root command's options, for every command that calls the server."""

    api_key: str | None = None
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS


_options = _Options()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    api_key: Annotated[str | None, typer.Option(
        help="API key '<key id>:<secret>' for commands that call the server. Else "
             "LAKELOG_API_KEY, else api_key in the profile ($XDG_CONFIG_HOME/lakelog/"
             "config.toml, for its url), else the admin key in "
             "$LAKELOG_DATA_DIR/security/admin.key (a server on this machine).")] = None,
    retry_timeout_ms: Annotated[int, typer.Option(
        envvar="LAKELOG_RETRY_TIMEOUT_MS", show_envvar=False, min=0,
        help="How long a command keeps trying a server it cannot reach (a restart takes "
             "seconds) before it gives up [LAKELOG_RETRY_TIMEOUT_MS].")
    ] = DEFAULT_RETRY_TIMEOUT_MS,
) -> None:
    """lakelog: a Kafka-style event log stored in Delta Lake tables."""
    _options.api_key = api_key
    _options.retry_timeout_ms = retry_timeout_ms


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
) -> None:
    """Run the HTTP server (uvicorn) on the data directory, with the jobs scheduled;
    SIGTERM/SIGINT stop it cleanly."""
    import uvicorn
    from pydantic import ValidationError

    from compaction_jobs.scheduler import Intervals, JobProcess
    from ingest_api.app import create_app
    from lakelog.settings import Settings

    flags: dict[str, Any] = {k: v for k, v in {
        "data_dir": data_dir, "host": host, "port": port, "log_level": log_level,
        "warehouse": warehouse, "tier_interval_ms": tier_interval_ms,
        "spark_master": spark_master, "auth": auth, "tls_cert": tls_cert, "tls_key": tls_key,
        "allow_insecure_non_loopback": allow_insecure_non_loopback}.items() if v is not None}
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise LakelogError(f"invalid settings: {where + ': ' if where else ''}"
                           f"{first['msg'].removeprefix('Value error, ')}") from None
    typer.echo("lakelog settings:", err=True)
    for name, value in settings.describe().items():
        typer.echo(f"  {name} = {value}", err=True)
    scheduler = JobProcess(settings.layout, Intervals(
        settings.tier_interval_ms, settings.retention_interval_ms, settings.compact_interval_ms,
        settings.upkeep_interval_ms, settings.vacuum_retention_hours), settings.spark_master,
        settings.log_level)
    services = [scheduler] if scheduler.enabled else []
    from ingest_api.http_protocol import bounded_protocol

    http = bounded_protocol(settings.max_request_head_bytes,
                            settings.request_head_timeout_ms / 1000,
                            settings.request_body_idle_timeout_ms / 1000)
    uvicorn.run(create_app(settings, services), host=settings.host, port=settings.port,
                log_level=settings.log_level, loop="uvloop", http=http,
                limit_concurrency=settings.limit_concurrency, timeout_graceful_shutdown=10,
                access_log=False, ssl_certfile=settings.tls_cert, ssl_keyfile=settings.tls_key)


@app.command("dump-log")
def dump_log(
    path: Annotated[Path, typer.Argument(help="A partition directory or one .log segment file.")],
    records: Annotated[bool, typer.Option("--records", help="Print every record too.")] = False,
) -> None:
    """Print the batches of hot segments (like kafka-dump-log): offsets, sizes, CRC validity."""
    from log_tables.dump import dump

    for line in dump(path, records):
        typer.echo(line)


DataDir = Annotated[Path, typer.Option(help="Data directory [LAKELOG_DATA_DIR].",
                                       envvar="LAKELOG_DATA_DIR")]
Warehouse = Annotated[str | None, typer.Option(help="Delta warehouse [LAKELOG_WAREHOUSE]; "
                                               "default <data-dir>/warehouse.",
                                               envvar="LAKELOG_WAREHOUSE")]
Master = Annotated[str | None, typer.Option("--master", help="Spark master (default local[*]).",
                                            envvar="LAKELOG_SPARK_MASTER")]

Url = Annotated[str | None, typer.Option(
    "--url", "--bootstrap-server", envvar="LAKELOG_URL", show_envvar=False, show_default=False,
    help="The server: http(s)://host:port, or host:port as Kafka's --bootstrap-server takes "
         "it [LAKELOG_URL; else url in the profile; else http://127.0.0.1:8080].")]
DEFAULT_URL = None

jobs_app = typer.Typer(help="Run lakelog's PySpark jobs once (from cron, Airflow or spark-submit).",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("tier")
def jobs_tier(
    data_dir: DataDir = Path("lakelog-data"),
    warehouse: Warehouse = None,
    topic: Annotated[list[str] | None, typer.Option(help="Only this topic (repeatable).")] = None,
    master: Master = None,
    skip_damaged: Annotated[bool, typer.Option(
        "--skip-damaged", help="Tier around damaged hot batches: their records are lost "
                               "(see docs/reliability.md).")] = False,
    roll: Annotated[bool, typer.Option(
        "--roll", help="First have the server (--url) seal every partition's records so far, "
                       "so that all of them are tiered now.")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Roll sealed hot segments into the topics' Delta tables, exactly once."""
    from compaction_jobs.tier import TierJob
    from log_tables.layout import Layout
    from log_tables.spark_session import lakelog_session

    layout = Layout.of(data_dir, warehouse)
    if roll:  # the server's admin key, if one is needed, is in this data directory
        import os

        os.environ["LAKELOG_DATA_DIR"] = str(data_dir)
    ends: dict[tuple[str, int], int] = {}  # what the server sealed: all of it must be tiered
    for t in (topic or [m.name for m in layout.topics()]) if roll else ():
        for part in _call("POST", url, f"/topics/{t}/segments:roll")["partitions"]:
            ends[(t, part["partition_id"])] = part["end_offset"]
    report = TierJob(layout, topic, progress=lambda line: typer.echo(line, err=True),
                     skip_damaged=skip_damaged).run(
        lambda: lakelog_session(layout.data_dir, layout.warehouse, master=master,
                                app_name="lakelog-tier"))
    typer.echo(f"tiered {report.records} records in {len(report.tiered)} partition range(s)"
               + (f", {report.conflicts} partition(s) already tiered by another job"
                  if report.conflicts else ""))
    if report.damaged:  # each was printed above; a scheduler sees the exit status
        raise typer.Exit(1)
    if roll:
        from compaction_jobs.tier import untiered

        if late := untiered(layout, ends):
            raise LakelogError(f"not all in Delta after the roll: {', '.join(late)}")
        typer.echo(f"Delta holds every record produced before the roll "
                   f"({len(ends)} partition(s))", err=True)


DryRun = Annotated[bool, typer.Option("--dry-run", help="Print what would be deleted or "
                                     "rewritten; change nothing.")]
Topics = Annotated[list[str] | None, typer.Option("--topic", help="Only this topic (repeatable).")]


def _run_jobs(names: list[str], data_dir: Path, warehouse: str | None, topic: list[str] | None,
              master: str | None, dry_run: bool, target_bytes: int, retention_hours: int) -> None:
    from compaction_jobs.compact import CompactJob
    from compaction_jobs.job import Job, JobReport
    from compaction_jobs.optimize import OptimizeJob
    from compaction_jobs.retention import RetentionJob
    from compaction_jobs.vacuum import VacuumJob
    from log_tables.layout import Layout
    from log_tables.spark_session import lakelog_session

    layout = Layout.of(data_dir, warehouse)
    session: list[Any] = []

    def spark() -> Any:
        if not session:
            session.append(lakelog_session(layout.data_dir, layout.warehouse, master=master,
                                           app_name="lakelog-jobs"))
        return session[0]

    def echo(line: str) -> None:
        typer.echo(line, err=True)

    failed = 0
    for name in names:
        if name == "tier":
            if dry_run:
                typer.echo("tier: skipped (no dry run; it only adds data)")
                continue
            jobs_tier(data_dir, warehouse, topic, master)
            continue
        job: Job
        if name == "retention":
            job = RetentionJob(layout, topic, dry_run=dry_run, progress=echo)
        elif name == "compact":
            job = CompactJob(layout, topic, dry_run=dry_run, progress=echo)
        elif name == "optimize":
            job = OptimizeJob(layout, topic, target_bytes=target_bytes, dry_run=dry_run,
                              progress=echo)
        else:
            job = VacuumJob(layout, topic, retention_hours=retention_hours, dry_run=dry_run,
                            progress=echo)
        report: JobReport = job.run(spark)
        typer.echo(report.summary())
        for run in report.failed:
            typer.echo(f"{name} failed on {run.topic}: {run.error}", err=True)
        failed += len(report.failed)
    if failed:
        raise typer.Exit(1)


TargetBytes = Annotated[int, typer.Option(help="Optimize: merge files up to this size.")]
RetentionHours = Annotated[int, typer.Option(help="Vacuum: keep removed files this long for "
                                                  "readers of older snapshots.")]


@jobs_app.command("retention")
def jobs_retention(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
                   topic: Topics = None, master: Master = None, dry_run: DryRun = False) -> None:
    """Apply retention.ms / retention.bytes: whole files and segments, log start moves."""
    _run_jobs(["retention"], data_dir, warehouse, topic, master, dry_run, 0, 0)


@jobs_app.command("compact")
def jobs_compact(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
                 topic: Topics = None, master: Master = None, dry_run: DryRun = False) -> None:
    """Compact the dirty partitions of compacted topics (latest value per key)."""
    _run_jobs(["compact"], data_dir, warehouse, topic, master, dry_run, 0, 0)


@jobs_app.command("optimize")
def jobs_optimize(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
                  topic: Topics = None, master: Master = None, dry_run: DryRun = False,
                  target_bytes: TargetBytes = 64 << 20) -> None:
    """Merge small Delta files, keeping offset order."""
    _run_jobs(["optimize"], data_dir, warehouse, topic, master, dry_run, target_bytes, 0)


@jobs_app.command("vacuum")
def jobs_vacuum(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
                topic: Topics = None, master: Master = None, dry_run: DryRun = False,
                retention_hours: RetentionHours = 24) -> None:
    """Delete files that commits removed, after the grace period; checkpoint the tables."""
    _run_jobs(["vacuum"], data_dir, warehouse, topic, master, dry_run, 0, retention_hours)


@jobs_app.command("all")
def jobs_all(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
             topic: Topics = None, master: Master = None, dry_run: DryRun = False,
             target_bytes: TargetBytes = 64 << 20, retention_hours: RetentionHours = 24) -> None:
    """Tier, retention, compact, optimize and vacuum, in that order."""
    _run_jobs(["tier", "retention", "compact", "optimize", "vacuum"], data_dir, warehouse, topic,
              master, dry_run, target_bytes, retention_hours)



class _Server(NamedTuple):
    url: str
    key: ApiKey


def _server(url: str | None) -> _Server:
    """The server to call (flag > LAKELOG_URL > profile > default) and its API key
    (--api-key > LAKELOG_API_KEY > profile > local admin key file)."""
    from lakelog.client import http_auth
    from lakelog.profile import find_api_key, resolve_url

    resolved = resolve_url(url)
    found = find_api_key(resolved, _options.api_key, "--api-key")
    try:
        http_auth(found.key)
    except ValueError as exc:
        raise LakelogError(f"bad API key from {found.source}: {exc}") from None
    return _Server(resolved, found)


def _retry_setting() -> str:
    return f"--retry-timeout-ms={_options.retry_timeout_ms} (LAKELOG_RETRY_TIMEOUT_MS)"


def _client_error(exc: Exception, server: _Server, what: str = "") -> LakelogError:
    """A client's error as one line; a 401 says where the key was looked for."""
    from lakelog.client import LakelogClientError
    from lakelog.profile import auth_hint

    if not isinstance(exc, LakelogClientError):
        return LakelogError(f"{what}{exc}")
    if exc.status == 0:  # no answer: the message says what was tried
        setting = "" if "--retry-timeout-ms" in exc.message else (
            f" [the wait is --retry-timeout-ms={_options.retry_timeout_ms} "
            "(LAKELOG_RETRY_TIMEOUT_MS)]")
        return LakelogError(f"{what}{exc.message}{setting}")
    hint = f"; {auth_hint(server.key)}" if exc.status == 401 else ""
    return LakelogError(f"{what}{exc.status}: {exc.message}{hint}")


def _call(method: str, url: str | None, path: str, body: object | None = None,
          ok: tuple[int, ...] = (200,)) -> Any:
    """One call to the server's API, retried while the server cannot be reached (a GET
    after any failure, other methods only when they surely never arrived) for
    --retry-timeout-ms; an error answer becomes a one-line LakelogError."""
    import httpx

    from lakelog.client import CLUSTER, LakelogClientError, http_auth
    from lakelog.client.errors import error_from
    from lakelog.client.retry import Attempts, RetryPolicy, call

    server = _server(url)
    auth = http_auth(server.key.key)
    attempts = Attempts(RetryPolicy(), time.monotonic() + _options.retry_timeout_ms / 1000,
                        f"{method} {path}", server.url, _retry_setting())
    with httpx.Client(auth=auth) as http:
        try:
            # Each attempt may take a minute (a slow answer is not an unreachable server).
            r = call(lambda _: http.request(method, server.url + CLUSTER + path, json=body,
                                            timeout=60), attempts, idempotent=method == "GET")
        except LakelogClientError as exc:
            raise _client_error(exc, server) from None
    if r.status_code not in ok:
        raise _client_error(error_from(r), server)
    return r.json() if r.content else None


groups_app = typer.Typer(help="Consumer groups (like kafka-consumer-groups): list, describe "
                              "with lag, reset offsets, delete.", no_args_is_help=True)
app.add_typer(groups_app, name="groups")


@groups_app.command("list")
def groups_list(url: Url = DEFAULT_URL) -> None:
    """Every group with members or committed offsets."""
    for g in _call("GET", url, "/consumer-groups")["data"]:
        typer.echo(f"{g['consumer_group_id']}\t{g['state']}\tmembers={g['members']}")


@groups_app.command("describe")
def groups_describe(group: Annotated[str, typer.Argument(help="The group.")],
                    url: Url = DEFAULT_URL) -> None:
    """Members and every partition the group reads (its members' subscriptions and its
    committed topics): committed offset (- where none), log end offset and lag (from the
    log start where nothing is committed), as kafka-consumer-groups --describe."""
    d = _call("GET", url, f"/consumer-groups/{group}")
    typer.echo(f"group {group}: {d['state']}, {len(d['members'])} member(s), "
               f"assignor {d['assignor'] or '-'}, epoch {d['group_epoch']}")
    header = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
              "CONSUMER-ID")
    rows = [header] + [tuple("-" if v is None else str(v) for v in (
        group, o["topic_name"], o["partition_id"], o["committed_offset"], o["log_end_offset"],
        o["lag"], o["member_id"])) for o in d["offsets"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@groups_app.command("reset-offsets")
def groups_reset(
    group: Annotated[str, typer.Argument(help="The group (it must have no members).")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    to_datetime: Annotated[str | None, typer.Option(
        "--to-datetime", help="ISO 8601 with a timezone, e.g. 2026-11-21T10:00:00Z")] = None,
    topic: Annotated[list[str] | None, typer.Option(
        help="Topics to reset (repeatable); default: those the group has offsets for.")] = None,
    execute: Annotated[bool, typer.Option(
        "--execute", help="Apply; without it, only show what would be set (dry run).")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Reset committed offsets, as kafka-consumer-groups --reset-offsets (dry run unless
    --execute)."""
    chosen = [k for k, v in (("earliest", to_earliest), ("latest", to_latest),
                             ("offset", to_offset is not None),
                             ("datetime", to_datetime is not None)) if v]
    if len(chosen) != 1:
        raise LakelogError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                           "--to-datetime")
    body: dict[str, Any] = {"to": chosen[0], "dry_run": not execute}
    if to_offset is not None:
        body["offset"] = to_offset
    if to_datetime is not None:
        body["datetime"] = to_datetime.replace("Z", "+00:00")
    if topic:
        body["topics"] = topic
    r = _call("POST", url, f"/consumer-groups/{group}/offsets:reset", body)
    # Kafka's table: GROUP TOPIC PARTITION NEW-OFFSET.
    rows = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")] + [
        (group, o["topic_name"], str(o["partition_id"]), str(o["offset"])) for o in r["offsets"]]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    typer.echo("(dry run: add --execute to apply)" if r["dry_run"] else "offsets reset",
               err=True)


@groups_app.command("skip-corrupt")
def groups_skip_corrupt(
    group: Annotated[str, typer.Argument(help="The group (it must have no members).")],
    topic: Annotated[list[str] | None, typer.Option(
        help="Only this topic (repeatable); default: every topic the group has offsets for.")
    ] = None,
    execute: Annotated[bool, typer.Option(
        "--execute", help="Commit; without it, only show what would be skipped.")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Move committed offsets that stand at a damaged batch (410 corrupt_record) past it;
    the damaged records are lost to the group. Dry run unless --execute."""
    moves = []
    for o in _call("GET", url, f"/consumer-groups/{group}/offsets")["offsets"]:
        t, p, offset = o["topic_name"], o["partition_id"], o["offset"]
        if topic and t not in topic:
            continue
        start = offset
        for _ in range(1000):  # damaged batches in a row: bounded
            r = _call("GET", url, f"/topics/{t}/partitions/{p}/records?offset={offset}"
                      "&max_records=1", ok=(200, 410, 416))
            if r.get("error") != "corrupt_record":
                break
            typer.echo(f"{t}-{p}: offsets {r['first_offset']}..{r['last_offset']} damaged "
                       f"({r['file']} at byte {r['file_position']})", err=True)
            offset = r["next_offset"]
        if offset != start:
            moves.append({"topic_name": t, "partition_id": p, "offset": offset})
            typer.echo(f"{t}-{p}\t{start} -> {offset}")
    if moves and execute:
        _call("POST", url, f"/consumer-groups/{group}/offsets", {"offsets": moves})
    typer.echo("no committed offset stands at a damaged batch" if not moves else
               "(dry run: add --execute to apply)" if not execute else "offsets moved", err=True)


@groups_app.command("delete")
def groups_delete(group: Annotated[str, typer.Argument(help="The group (no members).")],
                  url: Url = DEFAULT_URL) -> None:
    """Delete a group and its committed offsets."""
    _call("DELETE", url, f"/consumer-groups/{group}", ok=(204,))
    typer.echo(f"deleted consumer group {group}")


acls_app = typer.Typer(help="ACLs: who may do what on which topics and groups (admin only).",
                       no_args_is_help=True)
app.add_typer(acls_app, name="acls")
Principal = Annotated[str, typer.Option(help="The principal (the name an API key belongs to).")]


def _acl(principal: str, operation: str, topic: str | None, group: str | None, cluster: bool,
         prefix: bool) -> dict[str, str]:
    if sum((topic is not None, group is not None, cluster)) != 1:
        raise LakelogError("name exactly one of --topic, --group or --cluster")
    kind, name = (("topic", topic) if topic is not None else ("group", group)
                  if group is not None else ("cluster", "lakelog"))
    return {"principal": principal, "operation": operation, "resource_type": kind,
            "resource_name": str(name), "pattern_type": "prefixed" if prefix else "literal"}


Operation = Annotated[str, typer.Option(
    help="produce, consume, describe, alter, delete (topics); consume, commit, describe, alter, "
         "delete (groups); describe or admin (--cluster).")]
AclTopic = Annotated[str | None, typer.Option(help="A topic name (or prefix with --prefix).")]
AclGroup = Annotated[str | None, typer.Option(help="A group name (or prefix with --prefix).")]
AclCluster = Annotated[bool, typer.Option("--cluster", help="The cluster (for admin).")]
Prefix = Annotated[bool, typer.Option("--prefix", help="The name is a prefix.")]


@acls_app.command("add")
def acls_add(principal: Principal, operation: Operation, topic: AclTopic = None,
             group: AclGroup = None, cluster: AclCluster = False, prefix: Prefix = False,
             url: Url = DEFAULT_URL) -> None:
    """Allow PRINCIPAL to do OPERATION on a topic, a group or the cluster."""
    acl = _call("POST", url, "/acls", _acl(principal, operation, topic, group, cluster, prefix),
                ok=(200, 201))
    typer.echo(f"allowed {acl['principal']} to {acl['operation']} on {acl['resource_type']} "
               f"{acl['resource_name']}{'*' if acl['pattern_type'] == 'prefixed' else ''}")


@acls_app.command("remove")
def acls_remove(principal: Principal, operation: Operation, topic: AclTopic = None,
                group: AclGroup = None, cluster: AclCluster = False, prefix: Prefix = False,
                url: Url = DEFAULT_URL) -> None:
    """Remove one ACL (exit 1 if there is no such ACL)."""
    _call("POST", url, "/acls:delete", _acl(principal, operation, topic, group, cluster, prefix),
          ok=(204,))
    typer.echo("removed")


@acls_app.command("list")
def acls_list(principal: Annotated[str | None, typer.Option(help="Only this principal's.")] = None,
              url: Url = DEFAULT_URL) -> None:
    """PRINCIPAL  OPERATION  RESOURCE per line (a trailing * marks a prefix)."""
    query = f"?principal={principal}" if principal else ""
    for a in _call("GET", url, f"/acls{query}")["data"]:
        star = "*" if a["pattern_type"] == "prefixed" else ""
        typer.echo(f"{a['principal']}\t{a['operation']}\t{a['resource_type']}:"
                   f"{a['resource_name']}{star}")


keys_app = typer.Typer(help="API keys (admin only): create, list, delete.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(principal: Annotated[str, typer.Argument(help="Who the key is for.")],
                url: Url = DEFAULT_URL) -> None:
    """Make a key and print it as '<key id>:<secret>' (the secret is shown only now)."""
    key = _call("POST", url, "/api-keys", {"principal": principal}, ok=(201,))
    typer.echo(f"{key['key_id']}:{key['secret']}")


@keys_app.command("list")
def keys_list(url: Url = DEFAULT_URL) -> None:
    """Key ids and their principals (never secrets)."""
    for k in _call("GET", url, "/api-keys")["data"]:
        typer.echo(f"{k['key_id']}\t{k['principal']}")


@keys_app.command("delete")
def keys_delete(key_id: Annotated[str, typer.Argument(help="The key id.")],
                url: Url = DEFAULT_URL) -> None:
    """Revoke a key."""
    _call("DELETE", url, f"/api-keys/{key_id}", ok=(204,))
    typer.echo(f"deleted {key_id}")


topics_app = typer.Typer(help="Topics: create, list, describe, alter, delete.",
                         no_args_is_help=True)
app.add_typer(topics_app, name="topics")


def _configs(items: list[str] | None) -> list[dict[str, str]]:
    out = []
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LakelogError(f"--config {item!r}: expected NAME=VALUE, e.g. retention.ms=3600000")
        out.append({"name": name, "value": value})
    return out


ConfigOpt = Annotated[list[str] | None, typer.Option(
    "--config", help="NAME=VALUE topic config (repeatable), e.g. cleanup.policy=compact.")]


@topics_app.command("create")
def topics_create(name: Annotated[str, typer.Argument(help="The topic.")],
                  partitions: Annotated[int, typer.Option(help="Partition count.")] = 1,
                  config: ConfigOpt = None, url: Url = DEFAULT_URL) -> None:
    """Create a topic."""
    _call("POST", url, "/topics", {"topic_name": name, "partitions_count": partitions,
                                   "configs": _configs(config)}, ok=(201,))
    typer.echo(f"created topic {name} ({partitions} partition(s))")


@topics_app.command("list")
def topics_list(url: Url = DEFAULT_URL) -> None:
    """Every topic and its partition count."""
    for t in _call("GET", url, "/topics")["data"]:
        typer.echo(f"{t['topic_name']}\tpartitions={t['partitions_count']}")


@topics_app.command("describe")
def topics_describe(name: Annotated[str, typer.Argument(help="The topic.")],
                    url: Url = DEFAULT_URL) -> None:
    """Partitions (log start, high watermark, size) and configs that differ from defaults."""
    topic = _call("GET", url, f"/topics/{name}")
    typer.echo(f"topic {name}: {topic['partitions_count']} partition(s)")
    for p in _call("GET", url, f"/topics/{name}/partitions")["data"]:
        typer.echo(f"  partition {p['partition_id']}: log_start_offset={p['log_start_offset']} "
                   f"high_watermark={p['high_watermark']} size_bytes={p['size_bytes']}")
    for c in _call("GET", url, f"/topics/{name}/configs")["data"]:
        if not c.get("is_default", False):
            typer.echo(f"  {c['name']}={c['value']}")


@topics_app.command("alter")
def topics_alter(name: Annotated[str, typer.Argument(help="The topic.")],
                 partitions: Annotated[int | None, typer.Option(
                     help="Raise the partition count (never lower).")] = None,
                 config: ConfigOpt = None,
                 delete_config: Annotated[list[str] | None, typer.Option(
                     help="Reset a config to its default (repeatable).")] = None,
                 url: Url = DEFAULT_URL) -> None:
    """Raise partitions and set or reset configs."""
    if partitions is None and not config and not delete_config:
        raise LakelogError("nothing to alter: give --partitions, --config or --delete-config")
    if partitions is not None:
        _call("PATCH", url, f"/topics/{name}", {"partitions_count": partitions})
    changes = [{**c, "operation": "SET"} for c in _configs(config)] + [
        {"name": n, "operation": "DELETE"} for n in delete_config or ()]
    if changes:
        _call("POST", url, f"/topics/{name}/configs:alter", {"data": changes}, ok=(204,))
    typer.echo(f"altered topic {name}")


@topics_app.command("delete")
def topics_delete(name: Annotated[str, typer.Argument(help="The topic.")],
                  url: Url = DEFAULT_URL) -> None:
    """Delete a topic and its data (both tiers)."""
    _call("DELETE", url, f"/topics/{name}", ok=(204,))
    typer.echo(f"deleted topic {name}")


PROGRESS_EVERY = 100_000
TopicArg = Annotated[str | None, typer.Argument(metavar="TOPIC",
                                                help="The topic (or --topic TOPIC).")]
TopicOpt = Annotated[str | None, typer.Option("--topic", help="The topic (Kafka's spelling).")]


def _topic(argument: str | None, option: str | None, command: str) -> str:
    if argument and option and argument != option:
        raise LakelogError(f"two topics given ({argument!r} and --topic {option!r}): give one")
    if not (argument or option):
        raise LakelogError(f"give the topic: lakelog {command} TOPIC, or --topic TOPIC")
    return str(argument or option)


@app.command()
def produce(
    topic_arg: TopicArg = None,
    topic: TopicOpt = None,
    separator: Annotated[str | None, typer.Option(
        help="Each line is KEY<separator>VALUE (e.g. --separator ':'; the same as "
             "--property parse.key=true --property key.separator=':'); a line without the "
             "separator is an error. Else the line is the value.")] = None,
    prop: Annotated[list[str] | None, typer.Option(
        "--property", help="parse.key=true|false and key.separator=SEP (default TAB), as "
                           "kafka-console-producer takes them (repeatable).")] = None,
    acks: Annotated[str, typer.Option(help="all, 1 or 0.")] = "all",
    url: Url = DEFAULT_URL,
) -> None:
    """Produce lines from stdin (like kafka-console-producer); a progress line every 100,000
    records on stderr; exit 1 if any record failed, with the reasons."""
    from lakelog.client import LakelogClientError, Producer
    from lakelog.console import PRODUCE_PROPERTIES, LineParser, failure_summary, parse_properties

    name = _topic(topic_arg, topic, "produce")
    parser = LineParser.of(parse_properties(prop or (), PRODUCE_PROPERTIES), separator)
    if acks not in ("all", "1", "0"):
        raise LakelogError(f"--acks {acks!r}: use all, 1 or 0")
    server = _server(url)
    failures: list[tuple[int, str, str]] = []
    bad_line: LakelogError | None = None
    sent = 0
    started = time.monotonic()

    def settle(futures: list[Any]) -> None:
        for f in futures:
            exc = f.exception()
            if isinstance(exc, LakelogClientError):
                failures.append((exc.error_code, exc.error, exc.message))
            elif exc is not None:
                failures.append((0, type(exc).__name__, str(exc)))

    wait_ms = max(_options.retry_timeout_ms, 1)
    try:
        with Producer(server.url, acks=acks, api_key=server.key.key,  # type: ignore[arg-type]
                      delivery_timeout_ms=wait_ms, max_block_ms=wait_ms) as producer:
            producer.partitions_for(name)
            futures: list[Any] = []
            for number, line in enumerate(sys.stdin, 1):
                try:
                    key, value = parser.parse(line.rstrip("\n"), number)
                except LakelogError as exc:
                    bad_line = exc  # as kafka-console-producer: stop at the line
                    break
                futures.append(producer.send(name, value, key=key))
                sent += 1
                if sent % PROGRESS_EVERY == 0:
                    typer.echo(f"{sent:,} records sent ({sent / (time.monotonic() - started):,.0f}"
                               "/s)", err=True)
                if len(futures) >= 10_000:
                    settle(futures)
                    futures = []
            settle(futures)
    except LakelogClientError as exc:
        raise _client_error(exc, server, f"{name}: ") from None
    typer.echo(f"{sent - len(failures):,} records produced to {name}"
               + (f", {len(failures):,} failed:" if failures else ""), err=True)
    for line in failure_summary(failures):
        typer.echo(line, err=True)
    if bad_line is not None:
        raise bad_line
    if failures:
        raise typer.Exit(1)


@app.command()
def consume(
    topic_arg: TopicArg = None,
    topic: TopicOpt = None,
    group: Annotated[str | None, typer.Option(
        help="Read as a member of this consumer group (commits its offsets).")] = None,
    from_beginning: Annotated[bool, typer.Option(
        "--from-beginning", help="Start at the log start (else at the end), when there "
                                 "is no committed offset.")] = False,
    max_records: Annotated[int | None, typer.Option(
        "--max", "--max-messages", min=1, help="Stop after N records.")] = None,
    timeout_ms: Annotated[int | None, typer.Option(
        help="Stop after this long without a record.")] = None,
    print_key: Annotated[bool, typer.Option(
        "--print-key", help="Print KEY<TAB>VALUE (the same as --property print.key=true).")
    ] = False,
    prop: Annotated[list[str] | None, typer.Option(
        "--property", help="print.key, print.value, print.timestamp, print.partition, "
                           "print.offset (true|false) and key.separator=SEP (default TAB), "
                           "as kafka-console-consumer takes them (repeatable).")] = None,
    url: Url = DEFAULT_URL,
) -> None:
    """Print records as lines (like kafka-console-consumer); without --group it reads every
    partition directly and commits nothing. A topic that does not exist is an error."""
    from dataclasses import replace

    from lakelog.client import LakelogClientError
    from lakelog.console import CONSUME_PROPERTIES, RecordFormat, parse_properties

    name = _topic(topic_arg, topic, "consume")
    fmt = RecordFormat.of(parse_properties(prop or (), CONSUME_PROPERTIES), print_key)
    server = _server(url)
    partitions = int(_call("GET", server.url, f"/topics/{name}")["partitions_count"])
    if fmt.timestamp:
        configs = _call("GET", server.url, f"/topics/{name}/configs")["data"]
        if any(c["name"] == "message.timestamp.type" and c["value"] == "LogAppendTime"
               for c in configs):
            fmt = replace(fmt, timestamp_type="LogAppendTime")
    count = 0
    idle_since = time.monotonic()
    try:
        for r in _records(server, name, partitions, group, from_beginning, max_records):
            if r is None:  # an empty poll
                if timeout_ms is not None and time.monotonic() - idle_since > timeout_ms / 1000:
                    break
                continue
            idle_since = time.monotonic()
            typer.echo(fmt.line(r))
            count += 1
            if max_records is not None and count >= max_records:
                break
    except LakelogClientError as exc:
        raise _client_error(exc, server, f"{name}: ") from None
    except KeyboardInterrupt:
        typer.echo(f"{count:,} records consumed", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"{count:,} records consumed", err=True)


def _records(server: _Server, topic: str, partitions: int, group: str | None,
             from_beginning: bool, limit: int | None) -> Iterator[ConsoleRecord | None]:
    """The topic's records, with None after each empty poll; stops the group consumer
    (commit + leave) when the caller stops. A group member polls no more than ``limit``
    records, so what it commits is what was printed."""
    from datetime import datetime

    from lakelog.client import Consumer, CorruptRecordError
    from lakelog.console import ConsoleRecord

    if group is not None:
        consumer = Consumer(server.url, group, [topic], format="STRING", api_key=server.key.key,
                            auto_offset_reset="earliest" if from_beginning else "latest",
                            default_api_timeout_ms=max(_options.retry_timeout_ms, 1))
        left = limit
        try:
            while left is None or left > 0:
                try:
                    records = consumer.poll(timeout_s=0.5, max_records=min(500, left or 500))
                except CorruptRecordError as exc:  # commits what was printed, then says so
                    raise LakelogError(f"{exc.message} (once this consumer has stopped: "
                                       f"lakelog groups skip-corrupt {group})") from None
                for r in records:
                    yield ConsoleRecord(r.partition, r.offset,
                                        round(r.timestamp.timestamp() * 1000), r.key, r.value)
                if left is not None:
                    left -= len(records)
                if not records:
                    yield None
        finally:
            consumer.close()
        return
    spec = "earliest" if from_beginning else "latest"
    positions = {p: _call("GET", server.url, f"/topics/{topic}/partitions/{p}/offsets?spec="
                          f"{spec}")["offset"] for p in range(partitions)}
    while True:
        got = False
        for p in range(partitions):
            body = _call("GET", server.url, f"/topics/{topic}/partitions/{p}/records?offset="
                         f"{positions[p]}&format=STRING&max_records=1000")
            for rec in body["records"]:
                got = True
                yield ConsoleRecord(
                    p, rec["offset"],
                    round(datetime.fromisoformat(rec["timestamp"]).timestamp() * 1000),
                    (rec["key"] or {}).get("data"), (rec["value"] or {}).get("data"))
            positions[p] = body["next_offset"]
        if not got:
            time.sleep(0.2)
            yield None


@app.command("delete-records")
def delete_records(
    topic: Annotated[str, typer.Argument(help="The topic.")],
    before: Annotated[list[str], typer.Option(
        help="PARTITION=OFFSET: delete the partition's records below OFFSET (-1: all); "
             "repeatable.")],
    url: Url = DEFAULT_URL,
) -> None:
    """Kafka's DeleteRecords through the server: move log starts forward."""
    partitions = []
    for item in before:
        p, sep, offset = item.partition("=")
        if not sep or not p.strip().isdigit() or not offset.strip().lstrip("-").isdigit():
            raise LakelogError(f"--before {item!r}: expected PARTITION=OFFSET, e.g. 0=1500")
        partitions.append({"partition_id": int(p), "offset": int(offset)})
    body = _call("POST", url, f"/topics/{topic}/records:delete", {"partitions": partitions})
    for part in body["partitions"]:
        typer.echo(f"{topic}-{part['partition_id']}: log start offset {part['low_watermark']}")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="Spark SQL; every topic is a view, plus "
                                              "`partitions`.")],
    data_dir: DataDir = Path("lakelog-data"),
    warehouse: Warehouse = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print rows as JSON lines.")] = False,
    max_rows: Annotated[int, typer.Option(help="Most rows to print.")] = 1000,
    master: Master = None,
) -> None:
    """Run Spark SQL over the topics (cold and hot tiers) and print the result."""
    from lakelog.sql import run_sql

    for line in run_sql(query, data_dir, warehouse, master, as_json, max_rows):
        typer.echo(line)


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
