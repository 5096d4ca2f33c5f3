"""A bounded soak: producers at a steady rate and a consumer group for minutes while the
server's jobs tier, retire hot segments, compact and apply retention. No errors, the
server's memory (RSS) flat, produce latency stable (p50; p99 without stalls), every
record delivered.

The length is ``LAKELOG_SOAK_SECONDS`` (60 by default, which keeps CI bounded; set
it to 1800 for a longer run). The numbers per window are printed (``pytest -s``) and
written to ``soak.json`` in the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from lakelog.client import Consumer
from tests.ingest_api.helpers import string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
SECONDS = float(os.environ.get("LAKELOG_SOAK_SECONDS", "60"))
WARMUP_S = 20.0  # the jobs' JVM starts and the first tiering runs
WINDOWS = 4
PRODUCERS = 3
BATCH = 50
INTERVAL_S = 0.1  # per producer: 3 x 50 records every 100 ms = 1,500 records/s
PARTITIONS = 3
BASE = "/v3/clusters/lakelog"


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _tree(pid: int) -> list[int]:
    out = [pid]
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        out += _tree(int(child))
    return out


class Producer(threading.Thread):
    """One batch of ``BATCH`` records every ``INTERVAL_S`` (acks=all), timing each request."""

    def __init__(self, url: str, index: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.index, self.stop = url, index, stop
        self.acked: set[str] = set()
        self.latencies: list[tuple[float, float]] = []  # (time sent, seconds)
        self.errors: list[str] = []

    def run(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url + BASE, timeout=30) as client:
            next_at = time.monotonic()
            while not self.stop.is_set():
                values = [f"{self.index}-{n + i}" for i in range(BATCH)]
                started = time.monotonic()
                try:
                    r = client.post("/topics/soak/records:batch", params={"acks": "all"},
                                    json={"entries": [{"id": v, "value": string(v)}
                                                      for v in values]})
                    elapsed = time.monotonic() - started
                    if self.index == 0:  # and a few keyed updates to the compacted topic
                        s = client.post("/topics/soak-state/records:batch", json={"entries": [
                            {"id": str(i), "key": string(f"k{(n + i) % 50}"),
                             "value": string(str(n + i))} for i in range(10)]})
                        if s.status_code != 207 or s.json()["failures"]:
                            self.errors.append(f"state: {s.status_code} {s.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    return
                self.latencies.append((started, elapsed))
                body = r.json()
                if r.status_code != 207 or body["failures"]:
                    self.errors.append(f"{r.status_code}: {r.text[:300]}")
                    return
                self.acked.update(s["id"] for s in body["successes"])
                n += BATCH
                next_at += INTERVAL_S
                self.stop.wait(max(0.0, next_at - time.monotonic()))


class Member(threading.Thread):
    """A consumer group member that polls until told to stop; auto-commit on."""

    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, stop
        self.delivered: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            with Consumer(self.url, "soak-group", ["soak"], auto_offset_reset="earliest",
                          auto_commit_interval_ms=1000, session_timeout_ms=15_000,
                          format="STRING", timeout_s=30) as consumer:
                while not self.stop.is_set():
                    self.delivered += [r.value for r in consumer.poll(timeout_s=0.5)]
        except Exception as exc:  # surfaced by the test
            self.errors.append(f"{type(exc).__name__}: {exc}")


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", env={
        "LAKELOG_TIER_INTERVAL_MS": "2000", "LAKELOG_RETENTION_INTERVAL_MS": "5000",
        "LAKELOG_COMPACT_INTERVAL_MS": "5000", "LAKELOG_UPKEEP_INTERVAL_MS": "30000",
        "LAKELOG_ROLL_CHECK_INTERVAL_MS": "200"})
    yield proc.start()
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill_all()


@pytest.mark.timeout(SECONDS + 300)
def test_soak(server: ServerProcess, tmp_path: Path) -> None:
    assert server.proc is not None
    with server.client() as c:
        for body in ({"topic_name": "soak", "partitions_count": PARTITIONS, "configs": [
                         {"name": "segment.bytes", "value": str(256 * 1024)},
                         {"name": "local.retention.ms", "value": "0"}]},
                     {"topic_name": "soak-state", "partitions_count": 1, "configs": [
                         {"name": "segment.bytes", "value": str(64 * 1024)},
                         {"name": "cleanup.policy", "value": "compact"},
                         {"name": "min.cleanable.dirty.ratio", "value": "0.1"}]}):
            assert c.post("/topics", json=body).status_code == 201
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    producers = [Producer(server.url, i, stop_producing) for i in range(PRODUCERS)]
    members = [Member(server.url, stop_consuming) for _ in range(2)]
    samples: list[tuple[float, int, int]] = []  # (time, server RSS, jobs' tree RSS)
    started = time.monotonic()
    try:
        for t in [*producers, *members]:
            t.start()
        while (now := time.monotonic()) - started < SECONDS:
            tree = _tree(server.proc.pid)
            jobs = sum(_rss_bytes(p) for p in tree[1:] if Path(f"/proc/{p}").exists())
            samples.append((now - started, _rss_bytes(server.proc.pid), jobs))
            errors = [e for t in [*producers, *members] for e in t.errors]
            assert not errors, errors
            time.sleep(1)
        stop_producing.set()
        for p in producers:
            p.join(60)
        acked = {v for p in producers for v in p.acked}
        deadline = time.monotonic() + 90
        while not acked <= {v for m in members for v in m.delivered}:
            assert time.monotonic() < deadline, "not every acknowledged record was delivered"
            time.sleep(0.5)
    finally:
        stop_producing.set()
        stop_consuming.set()
        for t in [*producers, *members]:
            t.join(60)
    errors = [e for t in [*producers, *members] for e in t.errors]
    assert not errors, errors
    delivered = [v for m in members for v in m.delivered]
    duplicates = len(delivered) - len(set(delivered))

    # Per window after the warm-up: produce p99 and the server's median RSS.
    span = (SECONDS - WARMUP_S) / WINDOWS
    windows = []
    for w in range(WINDOWS):
        lo, hi = WARMUP_S + w * span, WARMUP_S + (w + 1) * span
        lat = [s for p in producers for at, s in p.latencies if lo <= at - started < hi]
        rss = [r for at, r, _ in samples if lo <= at < hi]
        jobs = [j for at, _, j in samples if lo <= at < hi]
        windows.append({"from_s": round(lo), "to_s": round(hi), "requests": len(lat),
                        "p50_ms": round(statistics.median(lat) * 1000, 1),
                        "p99_ms": round(_p99(lat) * 1000, 1),
                        "server_rss_mb": round(statistics.median(rss) / 2**20, 1),
                        "jobs_rss_mb": round(statistics.median(jobs) / 2**20, 1)})
    with server.client() as c:
        parts = [c.get(f"/topics/soak/partitions/{p}").json() for p in range(PARTITIONS)]
    result = {"seconds": SECONDS, "records_acked": len(acked), "delivered": len(delivered),
              "duplicates": duplicates, "windows": windows, "partitions": parts}
    (tmp_path / "soak.json").write_text(json.dumps(result, indent=2))
    print(f"\nsoak: {SECONDS:.0f} s, {len(acked):,} records acked and delivered "
          f"({duplicates} duplicates)")
    print(f"{'window':>12} {'requests':>9} {'p50 ms':>7} {'p99 ms':>7} {'server MB':>10} "
          f"{'jobs MB':>8}")
    for w in windows:
        print(f"{w['from_s']:>5}-{w['to_s']:<5} s {w['requests']:>9} {w['p50_ms']:>7} "
              f"{w['p99_ms']:>7} {w['server_rss_mb']:>10} {w['jobs_rss_mb']:>8}")

    # The jobs ran all along: every partition tiered, hot segments retired, the compacted
    # topic compacted.
    assert all(p["tiered_offset"] > 0 and p["hot_log_start_offset"] > 0 for p in parts), parts
    state = server.data_dir / "warehouse" / "topics" / "soak-state"
    assert "compact" in [h.get("lakelog.job") for h in DeltaTable(str(state)).history()]
    # Steady: every window served its requests, memory did not grow, latency did not
    # climb: the median against the first window's, the p99 only against a stall (the
    # suite's other worker shares these two cores, and one of its Spark jobs alone puts a
    # few hundred milliseconds into a window's p99).
    expected = span / INTERVAL_S * PRODUCERS
    assert all(w["requests"] > 0.8 * expected for w in windows), (expected, windows)
    first, last = windows[0], windows[-1]
    assert last["server_rss_mb"] <= first["server_rss_mb"] * 1.10 + 16, windows
    assert last["p50_ms"] <= max(3 * first["p50_ms"], 50), windows
    assert last["p99_ms"] <= max(3 * first["p99_ms"], 1000), windows
    # With the members steady, nothing is delivered twice but a rebalance at the start.
    assert duplicates <= 2 * BATCH * PRODUCERS, duplicates
    server.stop(timeout_s=90)
