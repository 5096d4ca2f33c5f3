"""The vacuum job: delete files that commits removed once a grace period has passed,
checkpoint the tables, and keep ``_job_runs`` small (typed and dead-letter tables:
``typed_upkeep``).

The grace period (``retention_hours``, 24 by default) must outlast any reader
or job still using an older snapshot: a Spark query planned before a
compaction reads the removed files until it ends. On a local warehouse vacuum
runs in delta-rs' "lite" mode: only files that a commit removed are deleted,
never files a running job has moved in but not yet committed (those are the
stage directories' business). On an object store, where jobs write straight to
final names, it runs in "full" mode: files in no commit (a killed job's, or a
lost commit's the job could not delete) go too once they are older than the
grace period, which must therefore also outlast any job run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from compaction_jobs.checkpoints import checkpoint_if_due
from compaction_jobs.job import JobReport, TopicJob, led_here
from compaction_jobs.typed_upkeep import upkeep_typed
from log_tables.cold import job_runs
from log_tables.cold.commit import open_topic_table
from log_tables.cold.job_runs import SUCCEEDED, JobRun, now_ms
from log_tables.layout import Layout, delta_path, is_local
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 24
class VacuumJob(TopicJob):
    """Vacuum and checkpoint every topic's table."""

    name = "vacuum"

    def __init__(self, layout: Layout, topics: list[str] | None = None, *,
                 retention_hours: int = DEFAULT_RETENTION_HOURS, **kwargs: object) -> None:
        super().__init__(layout, topics, **kwargs)  # type: ignore[arg-type]
        self.retention_hours = retention_hours

    def run_topic(self, meta: TopicMetadata,
                  spark: SparkSession | Callable[[], SparkSession] | None) -> list[JobRun]:
        if meta.config.delta_table_mode != "raw":  # where the typed job writes them
            tiers = led_here(self.layout, tiers=True) if self.led is not None else None
            upkeep_typed(self.layout, meta,
                         lambda p: tiers is None or p in tiers.get(meta.name, ()),
                         self.retention_hours, self.dry_run, self.progress)
        if not self.leads_table(meta.name):
            return []  # another broker's: the leader of partition 0 vacuums the table
        began = now_ms()
        dt = open_topic_table(self.layout.table_uri(meta.name), meta.name, meta.topic_id)
        root = delta_path(dt.table_uri).rstrip("/") + "/"
        full = not is_local(dt.table_uri)  # files in no commit too: see the module's doc
        doomed = dt.vacuum(retention_hours=self.retention_hours, dry_run=True,
                           enforce_retention_duration=False, full=full)
        if not self.dry_run:
            if doomed:
                dt.vacuum(retention_hours=self.retention_hours, dry_run=False,
                          enforce_retention_duration=False, full=full)
            checkpoint_if_due(dt)
        if not doomed:
            return []
        for path in doomed:
            self.progress(f"{'would delete' if self.dry_run else 'deleted'} "
                          f"{root}{path.removeprefix(root)}")
        return [self.row(meta.name, None, began, SUCCEEDED,
                         detail=f"{len(doomed)} removed file(s) older than "
                                f"{self.retention_hours} h deleted")]

    def run(self, spark: SparkSession | Callable[[], SparkSession] | None = None, *,
            record: bool = True) -> JobReport:
        report = super().run(spark, record=record)
        # In a cluster one broker trims the shared _job_runs table: the leader of
        # partition 0 of the first topic by name (every broker mirrors the same topics).
        names = sorted(t.name for t in self.layout.topics())
        trims = self.led is None or (bool(names) and self.leads_table(names[0]))
        if not self.dry_run and trims:
            try:
                job_runs.trim(self.layout.warehouse)
            except Exception:  # bookkeeping must not fail the job
                log.exception("trimming %s failed", job_runs.job_runs_uri(self.layout.warehouse))
        return report
