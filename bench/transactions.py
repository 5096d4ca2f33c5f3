"""Transactional produce against the same producer without transactions
(``python -m bench.transactions``).

One server (a broker alone), a topic of 6 partitions; the same Python ``Producer`` sends
100-byte keyed values as fast as it can for ``--seconds``, in the same run, rounds
interleaved:

- the baseline: idempotent, acks=all, no transactions (``send`` in a loop, ``flush`` at
  the end);
- transactional: ``begin_transaction``, sends for ``--commit-every-ms`` (100), then
  ``commit_transaction`` (which flushes), again and again.

Reported: records/s of each and their ratio (goal >= 0.8, issue 37), the commit's
latency (``commit_transaction``, flush included: p50, p99) and how far the last stable
offset trails the high watermark, sampled every 20 ms by a fetch of each partition at
both isolation levels in a transactional run of its own, untimed (records: p50, p99; a
read_committed reader sees a record that much later than a read_uncommitted one, at
most about a transaction's length).
Prints a table; writes ``bench/results/transactions.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.produce import quiet_server, wait_up
from bench.report import print_table, write_json
from lakelog.client import Producer

BIN = Path(sys.executable).parent
PORT = 18762
URL = f"http://127.0.0.1:{PORT}"
BASE = f"{URL}/v3/clusters/lakelog"
TOPIC = "txn-bench"
PARTITIONS = 6
VALUE = b"v" * 100


def idempotent(seconds: float) -> float:
    """Records/s of the producer without transactions."""
    with Producer(URL, linger_ms=5) as producer:
        started = time.perf_counter()
        n = 0
        while time.perf_counter() - started < seconds:
            for _ in range(1000):
                producer.send(TOPIC, VALUE, key=f"k{n % 1000}".encode())
                n += 1
        producer.flush()
        return n / (time.perf_counter() - started)


def transactional(seconds: float, every_ms: float, tid: str) -> tuple[float, list[float]]:
    """Records/s with a commit every ``every_ms``; each commit's seconds."""
    commits: list[float] = []
    with Producer(URL, linger_ms=5, transactional_id=tid) as producer:
        producer.init_transactions()
        started = time.perf_counter()
        n = 0
        while time.perf_counter() - started < seconds:
            producer.begin_transaction()
            until = time.perf_counter() + every_ms / 1000
            while time.perf_counter() < until:
                for _ in range(200):
                    producer.send(TOPIC, VALUE, key=f"k{n % 1000}".encode())
                    n += 1
            t = time.perf_counter()
            producer.commit_transaction()
            commits.append(time.perf_counter() - t)
        return n / (time.perf_counter() - started), commits


class LsoLag(threading.Thread):
    """Samples, per partition, the high watermark minus the last stable offset."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=BASE, timeout=10) as http:
            while not self._halt.wait(0.02):
                for p in range(PARTITIONS):
                    ends = []
                    for isolation in ("read_uncommitted", "read_committed"):
                        r = http.get(f"/topics/{TOPIC}/partitions/{p}/records", params={
                            "offset": 0, "max_records": 1, "isolation_level": isolation})
                        ends.append(int(r.json()["high_watermark"]))
                    self.samples.append(max(0, ends[0] - ends[1]))

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each case's run")
    parser.add_argument("--rounds", type=int, default=3, help="each case's best of this many")
    parser.add_argument("--commit-every-ms", type=float, default=100.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-txn-"))
    server = quiet_server(work, PORT)
    plain: list[float] = []
    txn: list[float] = []
    commits: list[float] = []
    lag = LsoLag()
    try:
        wait_up(f"{URL}/healthz")
        httpx.post(f"{BASE}/topics", json={"topic_name": TOPIC, "partitions_count": PARTITIONS}
                   ).raise_for_status()
        for r in range(args.rounds):  # interleaved, so a slow moment hurts each case alike
            print(f"round {r + 1}: idempotent, transactional", file=sys.stderr)
            os.sync()
            plain.append(idempotent(args.seconds))
            os.sync()
            rate, took = transactional(args.seconds, args.commit_every_ms, f"bench-{r}")
            txn.append(rate)
            commits += took
        # The lag, sampled in a run of its own (its fetches would slow the timed ones).
        print("the last stable offset's lag", file=sys.stderr)
        lag.start()
        transactional(min(args.seconds, 5.0), args.commit_every_ms, "bench-lag")
        lag.stop()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    best_plain, best_txn = max(plain), max(txn)
    rows: list[dict[str, Any]] = [
        {"case": f"transactional, a commit every {args.commit_every_ms:g} ms, records/s",
         "value": best_txn, "baseline": best_plain, "ratio": best_txn / best_plain,
         "goal": 0.8},
        {"case": "idempotent, no transactions, records/s", "value": best_plain},
        {"case": "commit_transaction p50, ms", "value": _pct(commits, 0.5) * 1000},
        {"case": "commit_transaction p99, ms", "value": _pct(commits, 0.99) * 1000},
        {"case": "high watermark - last stable offset p50, records",
         "value": _pct([float(s) for s in lag.samples], 0.5)},
        {"case": "high watermark - last stable offset p99, records",
         "value": _pct([float(s) for s in lag.samples], 0.99)},
    ]
    print_table(rows, ["case", "value", "baseline", "ratio", "goal"])
    path = write_json("transactions", rows, {
        "seconds": args.seconds, "commit_every_ms": args.commit_every_ms,
        "rounds": {"idempotent": plain, "transactional": txn},
        "commits": len(commits), "commit_mean_ms": statistics.fmean(commits) * 1000
        if commits else 0, "lag_samples": len(lag.samples)})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
