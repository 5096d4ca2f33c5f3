"""What every job shares (job.py), checked on each job without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from compaction_jobs.compact import CompactJob
from compaction_jobs.job import Job
from compaction_jobs.optimize import OptimizeJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from compaction_jobs.vacuum import VacuumJob
from log_tables.errors import StorageError
from log_tables.layout import Layout

JOBS: list[type[Job]] = [TierJob, RetentionJob, CompactJob, OptimizeJob, VacuumJob]


def test_every_job_but_tiering_refuses_an_object_store_warehouse(tmp_path: Path) -> None:
    layout = Layout.of(tmp_path / "data", "s3://bucket/warehouse")
    for job in JOBS:
        if not job.needs_local_warehouse:
            assert job is TierJob  # writes straight to final names there (issue 22)
            job(layout)
            continue
        with pytest.raises(StorageError) as e:
            job(layout)
        assert str(e.value) == (
            f"s3://bucket/warehouse: the {job.name} job stages files on a local or mounted "
            "file system and renames them in under a file lock; on an object-store "
            "warehouse only tiering runs so far")


def test_every_job_covers_the_topics_it_is_given(tmp_path: Path) -> None:
    layout = Layout.of(tmp_path / "data")
    for job in JOBS:
        assert job(layout, ["a", "b"]).only == {"a", "b"}
        assert job(layout).only is None
        assert job(layout).job_id != job(layout).job_id
