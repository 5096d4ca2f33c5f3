"""Tiering, scan and freshness benchmark (``python -m bench.tier``).

1. Tier: 1,000,000 records (16 B keys, 100 B values) in 8 partitions, sealed,
   rolled into Delta by the tiering job on local Spark; the floor, measured in
   the same run, is ``pyarrow.parquet.write_table`` of the same rows (one file
   per partition, the same columns the job writes).
2. Scan: ``read_topic`` over the tiered topic against ``spark.read.parquet``
   over the same files; both write every column to Spark's ``noop`` sink.
3. Freshness: a real server; produce one record (acks=1), then query
   ``read_topic`` until the record is in the answer; time from the produce
   acknowledgement to the answer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.produce import wait_up
from bench.report import print_table, write_json
from compaction_jobs.tier import TierJob
from log_tables.cold.rows import ROW_GROUP_ROWS, to_table_rows
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, delta_path, local_path
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.spark.read import read_topic
from log_tables.spark.session import attach, lakelog_session

TOPIC, PARTITIONS, PER_BATCH = "bench", 8, 1000
BIN = Path(sys.executable).parent


def batch(rng: np.random.Generator, n: int, ts: int) -> pa.RecordBatch:
    keys = pa.array([bytes(k) for k in rng.integers(0, 256, (n, 16), dtype=np.uint8)], pa.binary())
    values = pa.array([bytes(v) for v in rng.integers(0, 256, (n, 100), dtype=np.uint8)],
                      pa.binary())
    return pa.RecordBatch.from_arrays(
        [pa.array(np.full(n, ts, np.int64)), keys, values, null_headers(n)],
        schema=RECORD_SCHEMA)


def fill(data_dir: Path, records: int) -> list[pa.RecordBatch]:
    """Append ``records`` to the topic's partitions and roll them; returns the batches."""
    rng = np.random.default_rng(7)
    manager = LogManager(data_dir)
    manager.create_topic(TOPIC, PARTITIONS, {"segment.bytes": str(1 << 30)})
    batches = []
    ts = int(time.time() * 1000)
    for i in range(records // PER_BATCH):
        b = batch(rng, PER_BATCH, ts)
        manager.log(TOPIC, i % PARTITIONS).append(b)
        batches.append(b)
    for p in range(PARTITIONS):
        manager.log(TOPIC, p).roll()
    manager.close()
    return batches


def floor_seconds(batches: list[pa.RecordBatch], out: Path) -> float:
    """pyarrow.parquet.write_table of the same rows, one file per partition."""
    per_partition: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(PARTITIONS)}
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    for i, b in enumerate(batches):
        p = i % PARTITIONS
        per_partition[p].append(to_table_rows(next_offset[p], b, False))
        next_offset[p] += b.num_rows
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for p, rows in per_partition.items():
        pq.write_table(pa.Table.from_batches(rows), out / f"{p}.parquet",
                       row_group_size=ROW_GROUP_ROWS, compression="snappy")
    return time.perf_counter() - started


def tier_seconds(spark: Any, layout: Layout) -> tuple[float, int]:
    shutil.rmtree(local_path(layout.warehouse), ignore_errors=True)
    started = time.perf_counter()
    report = TierJob(layout).run(spark)
    return time.perf_counter() - started, report.records


def scan_seconds(spark: Any, layout: Layout) -> tuple[float, float]:
    from log_tables.cold.table import open_table

    dt = open_table(layout.table_uri(TOPIC))
    assert dt is not None
    files = [delta_path(u) for u in dt.file_uris()]
    lakelog = read_topic(spark, TOPIC)
    plain = spark.read.option("basePath", layout.table_uri(TOPIC)).parquet(*files)
    times: dict[str, list[float]] = {"read_topic": [], "parquet": []}
    for rep in range(6):  # the first round warms up (JIT, page cache) and is not counted
        for name, df in (("read_topic", lakelog), ("parquet", plain)):
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            if rep:
                times[name].append(time.perf_counter() - started)
    return statistics.median(times["read_topic"]), statistics.median(times["parquet"])


def freshness(spark: Any, work: Path, samples: int) -> list[float]:
    port = 18741
    data = work / "fresh"
    proc = subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(data), "--port",
                             str(port), "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v3/clusters/lakelog"
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz")
        httpx.post(f"{base}/topics", json={"topic_name": "fresh", "partitions_count": 1,
                                           "configs": [{"name": "segment.ms", "value": "2000"}]}
                   ).raise_for_status()
        attach(spark, data)
        out = []
        for i in range(samples + 5):  # the first five warm up and are not counted
            r = httpx.post(f"{base}/topics/fresh/records", params={"acks": "1"},
                           json={"value": {"type": "STRING", "data": f"r{i}"}})
            r.raise_for_status()
            acked = time.perf_counter()
            offset = r.json()["offset"]
            while read_topic(spark, "fresh", starting_offsets={0: offset}).where(
                    f"offset = {offset}").count() != 1:
                pass
            out.append(time.perf_counter() - acked)
            time.sleep(0.2)
        return out[5:]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description="tiering / scan / freshness benchmark")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=30, help="freshness samples")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-tier-"))
    try:
        print(f"writing {args.records:,} records to {PARTITIONS} partitions...", flush=True)
        batches = fill(work / "data", args.records)
        layout = Layout.of(work / "data")
        spark = lakelog_session(work / "data", master=os.environ.get("LAKELOG_SPARK_MASTER",
                                                                     "local[2]"))
        mb = sum(b.column(1).nbytes + b.column(2).nbytes for b in batches) / 1e6
        print("warming up (Spark workers, page cache)...", flush=True)
        tier_seconds(spark, layout)
        floors, tiers = [], []
        for i in range(3):
            floors.append(floor_seconds(batches, work / f"floor-{i}"))
            seconds, records = tier_seconds(spark, layout)
            assert records == args.records, records
            tiers.append(seconds)
        floor, tiered = statistics.median(floors), statistics.median(tiers)
        print("scanning...", flush=True)
        scan_lakelog, scan_parquet = scan_seconds(spark, layout)
        print("freshness...", flush=True)
        fresh = sorted(freshness(spark, work, args.samples))
        n = args.records
        rows: list[dict[str, Any]] = [
            {"case": "tier: TierJob (Spark tasks + delta-rs commit)", "seconds": tiered,
             "records/s": n / tiered, "MB/s": mb / tiered, "ratio": floor / tiered},
            {"case": "floor: pyarrow.parquet.write_table", "seconds": floor,
             "records/s": n / floor, "MB/s": mb / floor, "ratio": 1.0},
            {"case": "scan: read_topic", "seconds": scan_lakelog,
             "records/s": n / scan_lakelog, "MB/s": mb / scan_lakelog,
             "ratio": scan_parquet / scan_lakelog},
            {"case": "scan: spark.read.parquet (same files)", "seconds": scan_parquet,
             "records/s": n / scan_parquet, "MB/s": mb / scan_parquet, "ratio": 1.0},
        ]
        print_table(rows, ["case", "seconds", "records/s", "MB/s", "ratio"])
        p50 = fresh[len(fresh) // 2]
        p99 = fresh[min(len(fresh) - 1, int(len(fresh) * 0.99))]
        print(f"\nfreshness (produce ack -> visible to read_topic), {len(fresh)} samples: "
              f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
        path = write_json("tier", rows, {"freshness_ms": {"p50": p50 * 1000, "p99": p99 * 1000,
                                                          "samples": len(fresh)},
                                         "records": n, "key_value_mb": mb})
        print(f"wrote {path}")
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
