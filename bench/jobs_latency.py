"""Produce latency with and without the server's jobs running (``python -m bench.jobs_latency``).

The same server twice, on fresh data directories: once with every job off, once
with tiering, retention and compaction every second and upkeep every 5 s
(Spark started before measuring). Topics: ``events`` (retention.ms 5 s) and
``state`` (compacted); ``segment.ms`` 500 ms, so segments roll, tier, expire and
compact all the time. The load is open-loop: 100-record batches (16 B keys,
100 B values, acks=1) sent at a fixed rate from 8 concurrent senders, so a
slow server shows up as latency, not as a lower rate. Reported: p50, p99 and
max latency per phase, the job runs that finished during the measured window,
and p99 with jobs / p99 without (goal: at most 1.25).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.produce import wait_up
from bench.report import print_table, write_json

BIN = Path(sys.executable).parent
PORT = 18741
BASE = f"http://127.0.0.1:{PORT}/v3/clusters/lakelog"
RECORDS = 100


def entries(keyed: bool) -> dict[str, Any]:
    def enc(data: bytes) -> dict[str, str]:
        return {"type": "BINARY", "data": base64.b64encode(data).decode()}
    return {"entries": [{"id": str(i), "key": enc(b"key-%012d" % (i % 50)) if keyed else None,
                         "value": enc(os.urandom(100))} for i in range(RECORDS)]}


async def load(rate_per_s: float, seconds: float) -> list[float]:
    """Open-loop produce: request i is due at i / rate; latency from when it was due."""
    bodies = [entries(False), entries(True)]
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=8)
    async with httpx.AsyncClient(base_url=BASE, limits=limits, timeout=30) as client:
        start = time.perf_counter()
        total = int(rate_per_s * seconds)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(total):
            queue.put_nowait(i)

        async def sender() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                due = start + i / rate_per_s
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                topic = "state" if i % 2 else "events"
                r = await client.post(f"/topics/{topic}/records:batch", params={"acks": "1"},
                                      json=bodies[i % 2])
                r.raise_for_status()
                latencies.append(time.perf_counter() - due)

        await asyncio.gather(*(sender() for _ in range(8)))
    return latencies


def _runs(params: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.get(f"{BASE}/jobs/runs", params=params, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"/jobs/runs answered {r.status_code}: {r.text}")
    runs: list[dict[str, Any]] = r.json()["runs"]
    return runs


def phase(work: Path, name: str, jobs: bool, rate: float, seconds: float) -> dict[str, Any]:
    data = work / name
    interval = "1000" if jobs else "0"
    env = {**os.environ, "LAKELOG_TIER_INTERVAL_MS": interval,
           "LAKELOG_RETENTION_INTERVAL_MS": interval, "LAKELOG_COMPACT_INTERVAL_MS": interval,
           "LAKELOG_UPKEEP_INTERVAL_MS": "5000" if jobs else "0",
           "LAKELOG_VACUUM_RETENTION_HOURS": "0", "LAKELOG_ROLL_CHECK_INTERVAL_MS": "100"}
    server = subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(data), "--port",
                               str(PORT), "--log-level", "warning"], env=env,
                              stdout=subprocess.DEVNULL, stderr=(work / f"{name}.log").open("w"))
    try:
        wait_up(f"http://127.0.0.1:{PORT}/healthz")
        for topic, configs in (("events", {"retention.ms": "5000"}),
                               ("state", {"cleanup.policy": "compact"})):
            httpx.post(f"{BASE}/topics", json={
                "topic_name": topic, "partitions_count": 2,
                "configs": [{"name": "segment.ms", "value": "500"},
                            *({"name": k, "value": v} for k, v in configs.items())]}
                       ).raise_for_status()
        asyncio.run(load(rate, 3))  # warm up (and, with jobs, start Spark)
        if jobs:
            deadline = time.monotonic() + 120
            while not _runs({"job": "tier"}):
                if time.monotonic() > deadline:
                    raise RuntimeError("the tiering job never ran")
                asyncio.run(load(rate, 1))
        before = len(_runs({"limit": 10000}))
        latencies = np.array(asyncio.run(load(rate, seconds))) * 1000
        runs = _runs({"limit": 10000})
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    return {"case": name, "requests": len(latencies), "rec_s": len(latencies) * RECORDS / seconds,
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)), "max_ms": float(latencies.max()),
            "job_runs": len(runs) - before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-jobs-"))
    try:
        rows = [phase(work, "no jobs", False, args.rate, args.seconds),
                phase(work, "jobs running", True, args.rate, args.seconds)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows[1]["p99_vs_no_jobs"] = rows[1]["p99_ms"] / rows[0]["p99_ms"]
    print_table(rows, ["case", "requests", "rec_s", "p50_ms", "p99_ms", "max_ms", "job_runs",
                       "p99_vs_no_jobs"])
    print(f"wrote {write_json('jobs_latency', rows, {'rate': args.rate, 'seconds': args.seconds})}")


if __name__ == "__main__":
    main()
