"""``lakelog jobs``: lakelog's PySpark jobs, once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lakelog.cli.root import DEFAULT_URL, DataDir, Master, Url, Warehouse, admin, app
from log_tables.errors import LakelogError

ROLL_ATTEMPTS = 5
"""Tiering runs of ``jobs tier --roll`` on a cluster's broker before it gives up."""
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
    """Roll sealed hot segments into the topics' Delta tables, exactly once (on a
    cluster's broker, of the partitions it tiers: the leader of partition 0 tiers all the
    topic's partitions it holds a replica of); then the typed and upsert tables follow."""
    from compaction_jobs.job import led_here, settle_here
    from compaction_jobs.tier import TierJob, untiered
    from log_tables.layout import Layout
    from log_tables.spark.session import lakelog_session

    layout = Layout.of(data_dir, warehouse)
    if roll:  # the server's admin key, if one is needed, is in this data directory
        import os

        os.environ["LAKELOG_DATA_DIR"] = str(data_dir)
    rolled = (topic or [m.name for m in layout.topics()]) if roll else []

    def seal() -> dict[tuple[str, int], int]:
        with admin(url) as client:
            return {(t, part["partition_id"]): part["end_offset"]
                    for t in rolled for part in client.roll_segments(t)}

    ends = seal() if rolled else {}  # what the leaders sealed: all of it must be tiered
    led = led_here(layout, tiers=True)
    if led is not None:  # a cluster's broker: the other partitions are tiered by others
        ends = {(t, p): end for (t, p), end in ends.items() if p in led.get(t, ())}
    # A partition tiered here from a follower's replica may lag the leader's roll: sealed
    # again (the replica has caught up meanwhile) and tiered again, a few times.
    for attempt in range(1 if led is None else ROLL_ATTEMPTS):
        if attempt:
            time.sleep(1.0)
            seal()
        report = TierJob(layout, topic, progress=lambda line: typer.echo(line, err=True),
                         skip_damaged=skip_damaged, led=led,
                         settle_ms=0 if led is None else settle_here(layout)).run(
            lambda: lakelog_session(layout.data_dir, layout.warehouse, master=master,
                                    app_name="lakelog-tier"))
        typer.echo(f"tiered {report.records} records in {len(report.tiered)} partition "
                   "range(s)" + (f", {report.conflicts} partition(s) already tiered by "
                                 "another job" if report.conflicts else ""))
        if report.damaged:  # each was printed above; a scheduler sees the exit status
            raise typer.Exit(1)
        if not roll or not (late := untiered(layout, ends)):
            break
    _typed(layout, topic, led)
    if roll:
        if late := untiered(layout, ends):
            raise LakelogError(f"not all in Delta after the roll: {', '.join(late)}")
        typer.echo(f"Delta holds every record produced before the roll "
                   f"({len(ends)} partition(s))", err=True)


def _typed(layout: Any, topic: list[str] | None, led: Any) -> int:
    """The typed and upsert tables follow what was tiered (``delta.table.mode``);
    returns how many partitions failed (suspended at a record)."""
    from compaction_jobs.typed import TypedJob
    from log_tables.typed.catalog import CLUSTER_WAIT_S, Catalog

    # A cluster's broker may wait for a schema its replica of the registry lacks: the
    # runs share one catalog, so that the wait ends (in a dead letter) as in the server.
    catalog = Catalog(layout, None if led is None else CLUSTER_WAIT_S)
    deadline = time.monotonic() + CLUSTER_WAIT_S + 1
    while True:
        job = TypedJob(layout, topic, progress=lambda line: typer.echo(line, err=True),
                       led=led, catalog=catalog)
        report = job.run()
        if not job.waiting or time.monotonic() > deadline:
            break
        typer.echo(f"waiting for schemas of {sorted(job.waiting)} to reach this broker",
                   err=True)
        time.sleep(2)
    for run in report.failed:
        typer.echo(f"typed failed on {run.topic}-{run.partition}: {run.error}", err=True)
    return len(report.failed)


@jobs_app.command("typed")
def jobs_typed(data_dir: DataDir = Path("lakelog-data"), warehouse: Warehouse = None,
               topic: Annotated[list[str] | None, typer.Option(
                   help="Only this topic (repeatable).")] = None) -> None:
    """Decode what is tiered of typed and upsert topics into their tables (``jobs tier``
    does this after tiering; the server's scheduler too)."""
    from compaction_jobs.job import led_here
    from log_tables.layout import Layout

    layout = Layout.of(data_dir, warehouse)
    if _typed(layout, topic, led_here(layout, tiers=True)):
        raise typer.Exit(1)


DryRun = Annotated[bool, typer.Option("--dry-run", help="Print what would be deleted or "
                                     "rewritten; change nothing.")]
Topics = Annotated[list[str] | None, typer.Option("--topic", help="Only this topic (repeatable).")]


def _run_jobs(names: list[str], data_dir: Path, warehouse: str | None, topic: list[str] | None,
              master: str | None, dry_run: bool, target_bytes: int, retention_hours: int) -> None:
    from compaction_jobs.compact import CompactJob
    from compaction_jobs.job import Job, JobReport, led_here
    from compaction_jobs.optimize import OptimizeJob
    from compaction_jobs.retention import RetentionJob
    from compaction_jobs.vacuum import VacuumJob
    from log_tables.layout import Layout
    from log_tables.spark.session import lakelog_session

    layout = Layout.of(data_dir, warehouse)
    led = led_here(layout)  # a cluster's broker: only the partitions it leads
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
            job = RetentionJob(layout, topic, dry_run=dry_run, progress=echo, led=led)
        elif name == "compact":
            job = CompactJob(layout, topic, dry_run=dry_run, progress=echo, led=led)
        elif name == "optimize":
            job = OptimizeJob(layout, topic, target_bytes=target_bytes, dry_run=dry_run,
                              progress=echo, led=led)
        else:
            job = VacuumJob(layout, topic, retention_hours=retention_hours, dry_run=dry_run,
                            progress=echo, led=led)
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

