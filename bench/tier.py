"""Tiering, scan and freshness benchmark (``python -m bench.tier``).

1. Tier: 1,000,000 records (16 B keys, 100 B values) in 8 partitions, sealed,
   rolled into Delta by the tiering job on local Spark; the floor, measured in
   the same run on the same store, is ``pyarrow.parquet.write_table`` of the same
   rows (one file per partition, the same columns the job writes). The table is
   deleted between repeats. ``--warehouse`` picks the store:

   - ``local`` (the default): a warehouse directory beside the data directory; the
     floor writes local files. The run also reports what the stage-and-rename
     protocol costs beyond writing straight to final names: the time between the
     job's ``staged`` and ``moved`` steps (step 3: manifest and renames) as a
     share of the run.
   - ``s3``: beside the local run, repeat by repeat, the benchmark starts
     ``moto_server`` on a free loopback port (a subprocess: moto's in-process
     server deadlocks with delta-rs), makes a bucket and sets the AWS variables
     before Spark starts; the warehouse is
     ``s3://<bucket>/warehouse`` and the job writes each file straight to its final
     name. The floor writes the same rows to the same endpoint through
     ``log_tables.storage.filesystem`` (pyarrow's ``S3FileSystem``). moto keeps
     objects in memory in one Python process, so these numbers rate lakelog
     against pyarrow on that endpoint, not against AWS.
2. Scan (local warehouse only): ``read_topic`` over the tiered topic against
   ``spark.read.parquet`` over the same files; both write every column to Spark's
   ``noop`` sink.
3. Freshness (local warehouse only): a real server; produce one record (acks=1),
   then query ``read_topic`` until the record is in the answer; time from the
   produce acknowledgement to the answer.
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
from typing import Any, NamedTuple

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from bench.moto import aws_env, make_bucket, start_moto, stop_moto
from bench.produce import wait_up
from bench.report import print_table, write_json
from compaction_jobs import job as jobs
from compaction_jobs.tier import TierJob
from log_tables.cold.rows import ROW_GROUP_ROWS, to_table_rows
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, delta_path
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.spark.read import read_topic
from log_tables.spark.session import attach, lakelog_session
from log_tables.storage import filesystem

TOPIC, PARTITIONS, PER_BATCH, REPEATS = "bench", 8, 1000, 3
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


def remove(uri: str) -> None:
    """Delete a directory or prefix, local or on the object store, if it is there."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


# -- tier ----------------------------------------------------------------------------
def floor_tables(batches: list[pa.RecordBatch]) -> dict[int, pa.Table]:
    """The rows the job writes, per partition (built once, outside the timing)."""
    per_partition: dict[int, list[pa.RecordBatch]] = {p: [] for p in range(PARTITIONS)}
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    for i, b in enumerate(batches):
        p = i % PARTITIONS
        per_partition[p].append(to_table_rows(next_offset[p], b, False))
        next_offset[p] += b.num_rows
    return {p: pa.Table.from_batches(rows) for p, rows in per_partition.items()}


def floor_seconds(tables: dict[int, pa.Table], out: str) -> float:
    """pyarrow.parquet.write_table of the same rows, one file per partition, under ``out``
    (a local directory or an ``s3://`` prefix, through ``log_tables.storage.filesystem``)."""
    fs, root = filesystem(out)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(root, recursive=True)
    started = time.perf_counter()
    for p, table in tables.items():
        pq.write_table(table, f"{root}/{p}.parquet", row_group_size=ROW_GROUP_ROWS,
                       compression="snappy", filesystem=fs)
    seconds = time.perf_counter() - started
    remove(out)
    return seconds


class TierRun(NamedTuple):
    seconds: float
    records: int
    move_seconds: float
    """Between the job's ``staged`` and ``moved`` steps (step 3; skipped on an object store)."""


def tier_run(spark: Any, layout: Layout) -> TierRun:
    """One TierJob run on an emptied warehouse (table and ``_job_runs`` deleted first)."""
    remove(layout.warehouse)
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks.setdefault(name, time.perf_counter())

    previous = jobs.step_hook
    jobs.step_hook = mark
    try:
        started = time.perf_counter()
        report = TierJob(layout).run(spark)
        seconds = time.perf_counter() - started
    finally:
        jobs.step_hook = previous
    return TierRun(seconds, report.records, marks["moved"] - marks["staged"])


# -- scan and freshness (local warehouse) ---------------------------------------------
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
    parser.add_argument("--warehouse", choices=("local", "s3"), default="local",
                        help="s3: tier to a moto_server this run starts, beside the local run")
    args = parser.parse_args()
    names = ["local", "s3"] if args.warehouse == "s3" else ["local"]
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-tier-"))
    endpoint = None
    try:
        print(f"writing {args.records:,} records to {PARTITIONS} partitions...", flush=True)
        batches = fill(work / "data", args.records)
        layouts: dict[str, Layout] = {}
        floor_roots: dict[str, str] = {}
        if "local" in names:
            layouts["local"] = Layout.of(work / "data")
            floor_roots["local"] = str(work / "floor")
        if "s3" in names:
            endpoint = start_moto()
            bucket = make_bucket(endpoint, "bench")
            # The AWS variables that reach it, set before Spark starts (its workers inherit).
            for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
                os.environ.pop(var, None)
            os.environ.update(aws_env(endpoint.url))
            layouts["s3"] = Layout.of(work / "data", f"s3://{bucket}/warehouse")
            floor_roots["s3"] = f"s3://{bucket}/floor"
            print(f"s3: moto_server at {endpoint.url}, warehouse {layouts['s3'].warehouse}",
                  flush=True)
        spark = lakelog_session(work / "data", master=os.environ.get("LAKELOG_SPARK_MASTER",
                                                                     "local[2]"))
        mb = sum(b.column(1).nbytes + b.column(2).nbytes for b in batches) / 1e6
        tables = floor_tables(batches)
        print("warming up (Spark workers, page cache, connections)...", flush=True)
        for name in names:
            floor_seconds(tables, floor_roots[name])
            tier_run(spark, layouts[name])
        floors: dict[str, list[float]] = {name: [] for name in names}
        tiers: dict[str, list[TierRun]] = {name: [] for name in names}
        for _ in range(REPEATS):
            for name in names:  # side by side, repeat by repeat, so drift hits both alike
                floors[name].append(floor_seconds(tables, floor_roots[name]))
                run = tier_run(spark, layouts[name])
                assert run.records == args.records, (name, run.records)
                tiers[name].append(run)
        n = args.records
        rows: list[dict[str, Any]] = []
        extra: dict[str, Any] = {"records": n, "key_value_mb": mb, "warehouses": names,
                                 "repeats": REPEATS}
        for name in names:
            floor = statistics.median(floors[name])
            tiered = statistics.median(r.seconds for r in tiers[name])
            store = "local files" if name == "local" else "S3FileSystem, same moto_server"
            rows += [
                {"warehouse": name, "case": "tier: TierJob (Spark tasks + delta-rs commit)",
                 "seconds": tiered, "records/s": n / tiered, "MB/s": mb / tiered,
                 "ratio": floor / tiered},
                {"warehouse": name, "case": f"floor: pyarrow.parquet.write_table ({store})",
                 "seconds": floor, "records/s": n / floor, "MB/s": mb / floor, "ratio": 1.0},
            ]
            extra[f"staged_to_moved_{name}"] = {
                "median_s": statistics.median(r.move_seconds for r in tiers[name]),
                "median_share": statistics.median(r.move_seconds / r.seconds
                                                  for r in tiers[name])}
        fresh: list[float] = []
        if "local" in names:
            print("scanning...", flush=True)
            scan_lakelog, scan_parquet = scan_seconds(spark, layouts["local"])
            rows += [
                {"warehouse": "local", "case": "scan: read_topic", "seconds": scan_lakelog,
                 "records/s": n / scan_lakelog, "MB/s": mb / scan_lakelog,
                 "ratio": scan_parquet / scan_lakelog},
                {"warehouse": "local", "case": "scan: spark.read.parquet (same files)",
                 "seconds": scan_parquet, "records/s": n / scan_parquet,
                 "MB/s": mb / scan_parquet, "ratio": 1.0},
            ]
            print("freshness...", flush=True)
            fresh = sorted(freshness(spark, work, args.samples))
        print()
        print_table(rows, ["warehouse", "case", "seconds", "records/s", "MB/s", "ratio"])
        if "local" in names:
            move = extra["staged_to_moved_local"]
            print(f"\nstage-and-rename (local): step 3 (manifest + renames, the job's `staged` "
                  f"to `moved` steps) took {move['median_s'] * 1000:.0f} ms, "
                  f"{move['median_share']:.1%} of the TierJob run (median of {REPEATS})")
        if fresh:
            p50 = fresh[len(fresh) // 2]
            p99 = fresh[min(len(fresh) - 1, int(len(fresh) * 0.99))]
            print(f"freshness (produce ack -> visible to read_topic), {len(fresh)} samples: "
                  f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
            extra["freshness_ms"] = {"p50": p50 * 1000, "p99": p99 * 1000,
                                     "samples": len(fresh)}
        if "s3" in names:
            print("scan and freshness: local warehouse only (not measured on s3)")
        path = write_json("tier", rows, extra)
        print(f"wrote {path}")
        spark.stop()
    finally:
        if endpoint is not None:
            stop_moto(endpoint)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
