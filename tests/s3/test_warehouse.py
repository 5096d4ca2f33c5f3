"""An s3:// warehouse at start: accepted, and refused with one clear error naming the
bucket when its credentials are absent or wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest_api.settings import ApiSettings
from log_tables.errors import StorageError
from log_tables.storage import check_warehouse, describe, storage_options
from tests.s3.conftest import SECRET_KEY, S3Bucket, aws_env, start_moto, stop_moto

LAKELOG = Path(sys.executable).with_name("lakelog")


def _serve(tmp_path: Path, warehouse: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LAKELOG_"))}
    return subprocess.run([str(LAKELOG), "serve", "--data-dir", str(tmp_path / "data"),
                           "--warehouse", warehouse, "--auth", "none", "--port", "0"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_s3_warehouse_is_accepted_and_reachable(s3_bucket: S3Bucket) -> None:
    settings = ApiSettings(warehouse=s3_bucket.warehouse)
    assert settings.layout.warehouse == s3_bucket.warehouse
    check_warehouse(s3_bucket.warehouse)
    opts = storage_options(s3_bucket.warehouse)
    assert opts is not None and opts["AWS_ENDPOINT_URL"] == s3_bucket.env["AWS_ENDPOINT_URL"]
    assert SECRET_KEY not in describe(s3_bucket.warehouse)


def test_object_stores_are_accepted_and_other_schemes_refused() -> None:
    for uri in ("gs://bucket/lake", "az://container/lake", "abfss://c@account.dfs.core.windows.net/l"):
        assert ApiSettings(warehouse=uri).layout.warehouse == uri  # through delta-rs, untested
    with pytest.raises(ValueError, match="use a local or mounted path, or an object store"):
        ApiSettings(warehouse="hdfs://namenode/lake")


def test_absent_credentials_one_error_naming_the_bucket(tmp_path: Path,
                                                        s3_bucket: S3Bucket) -> None:
    env = {k: v for k, v in s3_bucket.env.items()
           if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    done = _serve(tmp_path, s3_bucket.warehouse, env)
    assert done.returncode != 0
    assert f"no credentials for bucket '{s3_bucket.name}'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_wrong_credentials_one_error_naming_the_bucket(tmp_path: Path) -> None:
    # A second server that checks signatures: no key is known to it, so every one is wrong.
    endpoint = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        done = _serve(tmp_path, "s3://guarded/lake", aws_env(endpoint.url))
    finally:
        stop_moto(endpoint)
    assert done.returncode != 0
    assert "cannot reach bucket 'guarded' with the credentials at hand" in done.stderr, \
        done.stderr
    assert SECRET_KEY not in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_bucket_is_named(s3_bucket: S3Bucket) -> None:
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
        check_warehouse("s3://no-such-bucket/lake")


def test_the_scheduler_runs_every_job_on_an_object_store(tmp_path: Path) -> None:
    from compaction_jobs.scheduler import Intervals, JobScheduler
    from log_tables.layout import Layout

    for warehouse in ("s3://bucket/lake", str(tmp_path / "warehouse")):
        scheduler = JobScheduler(Layout.of(tmp_path / "data", warehouse),
                                 Intervals(1000, 1000, 1000, 1000), "local[1]")
        assert [name for name, _, _ in scheduler._jobs] == ["tier", "retention", "compact",
                                                            "upkeep"]
