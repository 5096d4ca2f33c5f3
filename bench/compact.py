"""Compaction and retention benchmark (``python -m bench.compact``).

1. Compact: 1,000,000 records (16 B keys from 10,000 distinct, 100 B values) in
   2 partitions, tiered into Delta, then compacted by the compaction job on
   local Spark (plan, Spark rewrite, stats, guarded commit). The floor, in the
   same run, is a single-process pyarrow dedupe of the same Parquet files:
   read, latest offset per (partition, key), filter, sort, write one file per
   partition.
2. Retention: a topic tiered into many files; the retention job deletes whole
   files (a metadata-only commit). Reported per commit, against delta-rs's own
   metadata-only ``DeltaTable.delete`` of whole files on a copy of the table.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable

from bench.report import print_table, write_json
from compaction_jobs.compact import CompactJob
from compaction_jobs.retention import RetentionJob
from compaction_jobs.tier import TierJob
from log_tables.cold.rows import FILE_SCHEMA
from log_tables.cold.table import open_table, snapshot
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, local_path
from log_tables.records import RECORD_SCHEMA, null_headers
from log_tables.spark.session import lakelog_session

PARTITIONS, PER_BATCH, SEGMENT_RECORDS = 2, 1000, 50_000
DAY_MS = 24 * 3600 * 1000


def fill(data_dir: Path, topic: str, records: int, keys: int, configs: dict[str, str],
         ts_step_ms: int = 0, segment_records: int = SEGMENT_RECORDS) -> int:
    """Append ``records`` with keys drawn from ``keys`` distinct ones; returns the base time."""
    rng = np.random.default_rng(11)
    key_pool = [b"key-%012d" % k for k in range(keys)]
    manager = LogManager(data_dir)
    manager.create_topic(topic, PARTITIONS, {"segment.bytes": str(1 << 30), **configs})
    t0 = int(time.time() * 1000) - 2 * DAY_MS
    for i in range(records // PER_BATCH):
        p = i % PARTITIONS
        plog = manager.log(topic, p)
        picks = rng.integers(0, keys, PER_BATCH)
        values = [bytes(v) for v in rng.integers(0, 256, (PER_BATCH, 100), dtype=np.uint8)]
        ts = t0 + (i // PARTITIONS) * ts_step_ms
        plog.append(pa.RecordBatch.from_arrays([
            pa.array(np.full(PER_BATCH, ts, np.int64)),
            pa.array([key_pool[k] for k in picks], pa.binary()),
            pa.array(values, pa.binary()),
            null_headers(PER_BATCH)], schema=RECORD_SCHEMA))
        if plog.high_watermark % segment_records == 0:
            plog.roll()
    for p in range(PARTITIONS):
        manager.log(topic, p).roll()
    manager.close()
    return t0


def floor_dedupe(files_by_partition: dict[int, list[str]], out: Path) -> tuple[float, int]:
    """Single-process pyarrow: the same dedupe the job does, one file per partition."""
    started = time.perf_counter()
    kept = 0
    out.mkdir(parents=True, exist_ok=True)
    for p, files in files_by_partition.items():
        table = ds.dataset(files, schema=FILE_SCHEMA, format="parquet").to_table()
        latest = table.group_by("key").aggregate([("offset", "max")])
        keep = pc.is_in(table.column("offset"), value_set=latest.column("offset_max"))
        result = table.filter(keep).sort_by("offset")
        pq.write_table(result, out / f"p{p}.parquet", compression="snappy")
        kept += result.num_rows
    return time.perf_counter() - started, kept


def bench_compact(work: Path, records: int, keys: int, spark: Any) -> dict[str, Any]:
    data = work / "compact"
    t0 = fill(data, "state", records, keys, {"cleanup.policy": "compact"})
    layout = Layout.of(data)
    TierJob(layout, progress=lambda _line: None).run(spark)
    states = snapshot(open_table(layout.table_uri("state")), PARTITIONS)
    files = {p: [local_path(f.path) for f in st.files] for p, st in enumerate(states)}
    floor_s, floor_kept = floor_dedupe(files, work / "floor")
    started = time.perf_counter()
    report = CompactJob(layout, now_ms=t0 + DAY_MS, progress=lambda _line: None).run(spark)
    job_s = time.perf_counter() - started
    kept = sum(r.records_out for r in report.runs)
    assert kept == floor_kept, (kept, floor_kept)
    return {"case": f"compact {records:,} records, {keys:,} keys", "lakelog_s": job_s,
            "floor_s": floor_s, "ratio": floor_s / job_s, "out": f"{kept:,} records left"}


def bench_retention(work: Path, records: int, spark: Any) -> dict[str, Any]:
    data = work / "retention"
    fill(data, "old", records, 1000, {"retention.ms": str(DAY_MS)}, ts_step_ms=1,
         segment_records=5000)
    layout = Layout.of(data)
    TierJob(layout, progress=lambda _line: None).run(spark)
    uri = layout.table_uri("old")
    copy = work / "copy"
    shutil.copytree(local_path(uri), copy)
    states = snapshot(open_table(uri), PARTITIONS)
    files = sum(len(st.files) for st in states)
    # Delete the older half of every partition's files, in a few commits.
    steps = 4
    ours, theirs = [], []
    for s in range(1, steps + 1):
        k = len(states[0].files) * s // (2 * steps)
        cut_ts = states[0].files[k - 1].max_timestamp_ms
        started = time.perf_counter()
        RetentionJob(layout, now_ms=cut_ts + DAY_MS + 1, progress=lambda _line: None).run()
        ours.append(time.perf_counter() - started)
        starts = [st.start_offset for st in snapshot(open_table(uri), PARTITIONS)]
        dt = DeltaTable(str(copy))
        predicate = " OR ".join(f"(partition = {p} AND offset < {c})" for p, c in enumerate(starts))
        started = time.perf_counter()
        dt.delete(predicate)
        theirs.append(time.perf_counter() - started)
    left = [len(st.files) for st in snapshot(open_table(uri), PARTITIONS)]
    assert sum(left) == len(DeltaTable(str(copy)).file_uris()), "both deleted the same files"
    our_s, their_s = statistics.median(ours), statistics.median(theirs)
    return {"case": f"retention: {files} files, half deleted in {steps} commits",
            "lakelog_s": our_s, "floor_s": their_s, "ratio": their_s / our_s,
            "out": f"{sum(left)} files left"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lakelog-bench-") as tmp:
        work = Path(tmp)
        spark = lakelog_session(work / "spark", master="local[2]",
                                conf={"spark.driver.memory": "2g"})
        try:
            rows = [bench_compact(work, args.records, args.keys, spark),
                    bench_retention(work, args.records // 4, spark)]
        finally:
            spark.stop()
    print_table(rows, ["case", "lakelog_s", "floor_s", "ratio", "out"])
    path = write_json("compact", rows, {"records": args.records, "keys": args.keys})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
