"""Hot-log append and read throughput against raw file writes of the same bytes.

Run: ``python -m bench.hot_log`` (add ``--quick`` for a short run). Prints a
table and writes ``bench/results/hot_log.json``.

For every case (value size x records per batch x flush policy) the same run
measures:

* ``append``: from Python lists of keys and values to bytes in the segment
  file: ``build_batch`` (Arrow arrays, server-assigned timestamp, as the HTTP
  layer does) + ``PartitionLog.append`` (+ ``flush()`` per batch when flushing);
* ``arrow append``: ``PartitionLog.append`` of a record batch already in Arrow
  form (what an Arrow-native producer hands over): encode, CRC, write, index;
* ``raw``: the same key and value bytes joined and written with one
  ``os.write`` per batch to a plain file (+ ``os.fdatasync`` per batch when flushing);
* ``read``: a sequential ``PartitionLog.read`` of everything appended, to Arrow
  record batches, CRC-checked.

Raw and lakelog alternate over several repetitions and the median is kept,
because these machines are shared and whole runs differ.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import print_table, write_json
from log_tables.config import TopicConfig
from log_tables.hot.partition_log import PartitionLog
from log_tables.records import build_batch

KEY_BYTES = 16


def make_batches(value_bytes: int, per_batch: int, batches: int) -> list[tuple[list[bytes], list[bytes]]]:
    pool_values = [os.urandom(value_bytes) for _ in range(max(per_batch, 64))]
    pool_keys = [os.urandom(KEY_BYTES) for _ in range(max(per_batch, 64))]
    out = []
    for b in range(min(batches, 16)):
        rot = b % len(pool_values)
        vals = (pool_values[rot:] + pool_values[:rot])[:per_batch]
        keys = (pool_keys[rot:] + pool_keys[:rot])[:per_batch]
        out.append((keys, vals))
    return out


def run_raw(workdir: Path, data: list[tuple[list[bytes], list[bytes]]], batches: int, flush: bool) -> float:
    path = workdir / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    start = time.perf_counter()
    for i in range(batches):
        keys, values = data[i % len(data)]
        os.write(fd, b"".join(keys) + b"".join(values))
        if flush:
            os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    path.unlink()
    return elapsed


# 1,000 records of 1 KiB are over Kafka's default max.message.bytes (1 MiB).
CONFIG = TopicConfig(max_message_bytes=4 << 20)


def run_lakelog(workdir: Path, data: list[tuple[list[bytes], list[bytes]]], batches: int,
                flush: bool, prebuilt: bool) -> tuple[float, PartitionLog]:
    directory = workdir / "log"
    shutil.rmtree(directory, ignore_errors=True)
    plog = PartitionLog.open(directory, CONFIG)
    now_ms = int(time.time() * 1000)
    arrow = [build_batch(values, keys=keys, timestamps=now_ms) for keys, values in data]
    start = time.perf_counter()
    for i in range(batches):
        if prebuilt:
            plog.append(arrow[i % len(arrow)])
        else:
            keys, values = data[i % len(data)]
            plog.append(build_batch(values, keys=keys, timestamps=now_ms))
        if flush:
            plog.flush()
    elapsed = time.perf_counter() - start
    return elapsed, plog


def run_read(plog: PartitionLog) -> tuple[float, int]:
    start = time.perf_counter()
    offset = 0
    rows = 0
    end = plog.high_watermark
    while offset < end:
        result = plog.read(offset, max_bytes=1 << 20)
        for batch in result.batches:
            rows += batch.records.num_rows
        offset = result.next_offset or end
    return time.perf_counter() - start, rows


def run_raw_read(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    start = time.perf_counter()
    pos = 0
    while chunk := os.pread(fd, 1 << 20, pos):
        pos += len(chunk)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


def warm_up(workdir: Path, megabytes: int) -> None:
    """Touch page-cache memory once: first-touch memory is slow on these VMs."""
    block = os.urandom(1 << 20)
    path = workdir / "warm.bin"
    with path.open("wb") as f:
        for _ in range(megabytes):
            f.write(block)
    path.unlink()


def bench_case(workdir: Path, value_bytes: int, per_batch: int, flush: bool, quick: bool,
               reps: int) -> dict[str, Any]:
    budget_bytes = (16 if quick else 96) * (1 << 20)
    record_bytes = KEY_BYTES + value_bytes
    batches = max(1, budget_bytes // (record_bytes * per_batch))
    batches = min(batches, 300 if flush else (5_000 if quick else 30_000))
    data = make_batches(value_bytes, per_batch, batches)
    records = batches * per_batch
    payload = records * record_bytes
    raw_times, log_times, arrow_times, read_times, raw_read_times = [], [], [], [], []
    for _ in range(reps):
        raw_times.append(run_raw(workdir, data, batches, flush))
        elapsed, plog = run_lakelog(workdir, data, batches, flush, prebuilt=True)
        arrow_times.append(elapsed)
        plog.close()
        elapsed, plog = run_lakelog(workdir, data, batches, flush, prebuilt=False)
        log_times.append(elapsed)
        if not flush:
            read_elapsed, rows = run_read(plog)
            assert rows == records, (rows, records)
            read_times.append(read_elapsed)
            raw_read_times.append(run_raw_read(plog.active_segment.path))
        plog.close()
        shutil.rmtree(workdir / "log")
    raw_t, log_t = statistics.median(raw_times), statistics.median(log_times)
    arrow_t = statistics.median(arrow_times)
    row: dict[str, Any] = {
        "value_bytes": value_bytes, "batch": per_batch, "flush": "per batch" if flush else "none",
        "records": records,
        "raw_rec_s": records / raw_t, "append_rec_s": records / log_t,
        "append_MB_s": payload / log_t / 1e6, "append_vs_raw": raw_t / log_t,
        "arrow_append_rec_s": records / arrow_t, "arrow_append_vs_raw": raw_t / arrow_t,
    }
    if read_times:
        read_t = statistics.median(read_times)
        row["read_rec_s"] = records / read_t
        row["read_MB_s"] = payload / read_t / 1e6
        row["read_vs_append"] = log_t / read_t
        row["read_vs_raw"] = raw_t / read_t
        row["raw_read_MB_s"] = payload / statistics.median(raw_read_times) / 1e6
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller volumes, one repetition")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lakelog-bench-", dir=args.dir))
    reps = 1 if args.quick else 3
    try:
        warm_up(workdir, 64 if args.quick else 512)
        rows = []
        for flush in (False, True):
            for value_bytes in (100, 1024):
                for per_batch in (1, 100, 1000):
                    row = bench_case(workdir, value_bytes, per_batch, flush, args.quick, reps)
                    rows.append(row)
                    print(f"  {value_bytes} B x {per_batch}, flush {row['flush']}: "
                          f"append {row['append_vs_raw']:.2f}, arrow append {row['arrow_append_vs_raw']:.2f} "
                          "of raw", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    columns = ["value_bytes", "batch", "flush", "raw_rec_s", "append_rec_s", "append_MB_s",
               "append_vs_raw", "arrow_append_rec_s", "arrow_append_vs_raw", "read_rec_s",
               "read_MB_s", "read_vs_append"]
    print()
    print_table(rows, columns)
    path = write_json("hot_log", rows, {"key_bytes": KEY_BYTES, "repetitions": reps})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
