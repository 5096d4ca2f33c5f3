"""A server on an s3:// warehouse: its scheduled tiering commits to the bucket, fetches
below the hot tier are answered from the Parquet files there, and consumer groups'
committed offsets are a Delta table in the same bucket."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from consumer_groups.offsets import offsets_uri
from lakelog.views import register_views
from log_tables.spark.session import attach
from log_tables.storage import filesystem, storage_options
from tests.ingest_api.test_tiered import _create, _produce, tier_then_fetch
from tests.s3.conftest import S3Bucket
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def test_fetch_of_tiered_offsets_from_s3(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    server = ServerProcess(tmp_path / "data", env={
        **s3_bucket.env, "LAKELOG_WAREHOUSE": s3_bucket.warehouse,
        "LAKELOG_TIER_INTERVAL_MS": "1000", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}).start()
    try:
        with server.client() as client:
            tier_then_fetch(server, client)
            # Deleting the topic deletes its table from the bucket (a new topic of the
            # same name would otherwise find an old table there and not tier).
            fs, table = filesystem(f"{s3_bucket.warehouse}/topics/cold")
            assert fs.get_file_info(pafs.FileSelector(table, recursive=True))
            assert client.delete("/topics/cold").status_code == 204
            deadline = time.monotonic() + 60
            while fs.get_file_info(pafs.FileSelector(table, recursive=True,
                                                     allow_not_found=True)):
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.2)
        assert s3_bucket.env["AWS_SECRET_ACCESS_KEY"] not in server.log()
    finally:
        server.stop(timeout_s=90)


def test_group_offsets_and_their_lag_live_in_the_same_bucket(
        spark: SparkSession, tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """``_consumer_offsets`` is a Delta table in the s3:// warehouse too, and the lag views
    read it from there."""
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir, env={**s3_bucket.env,
                                          "LAKELOG_WAREHOUSE": s3_bucket.warehouse}).start()
    try:
        with server.client() as client:
            _create(client, "clicks", 1)
            _produce(client, "clicks", 0, [f"c{i}" for i in range(12)])
            r = client.post("/consumer-groups/reader/offsets", json={"offsets": [
                {"topic_name": "clicks", "partition_id": 0, "offset": 5}]})
            assert r.status_code == 200, r.text
            attach(spark, data_dir, s3_bucket.warehouse)
            deadline = time.monotonic() + 120
            while True:  # the server writes committed offsets to Delta in the background
                register_views(spark, topics=[])
                lag = [tuple(row) for row in spark.sql(
                    "SELECT `group`, topic, partition, committed_offset, high_watermark, lag "
                    "FROM consumer_lag").collect()]
                if lag:
                    break
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.2)
            assert lag == [("reader", "clicks", 0, 5, 12, 7)]
        dt = DeltaTable(offsets_uri(s3_bucket.warehouse),
                        storage_options=storage_options(s3_bucket.warehouse))
        assert dt.to_pyarrow_table().num_rows >= 1
    finally:
        server.stop(timeout_s=90)
