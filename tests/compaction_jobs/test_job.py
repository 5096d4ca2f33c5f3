"""What every job shares (job.py), checked on each job without Spark."""

from __future__ import annotations

from pathlib import Path

from compaction_jobs.compact import CompactJob
from compaction_jobs.job import Job
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.layout import Layout

JOBS: list[type[Job]] = [TierJob, RetentionJob, CompactJob, OptimizeJob, VacuumJob]


def test_every_job_covers_the_topics_it_is_given(tmp_path: Path) -> None:
    layout = Layout.of(tmp_path / "data")
    for job in JOBS:
        assert job(layout, ["a", "b"]).only == {"a", "b"}
        assert job(layout).only is None
        assert job(layout).job_id != job(layout).job_id
