"""HTTP produce and fetch throughput against a bare endpoint, driven by wrk.

Run: ``python -m bench.produce`` (``--quick`` for short runs; needs ``wrk``:
``apt-get install wrk``). Prints a table and writes ``bench/results/produce.json``.

Setup: one uvicorn worker (uvloop, httptools) pinned to CPU 0 and wrk pinned to
CPU 1, on 127.0.0.1. Bodies: 16-byte keys and 100-byte values (BINARY,
base64), 1 record per request on ``/records``, 100 and 1,000 on
``/records:batch``. The baseline is a FastAPI endpoint in the same server setup
that decodes the same body with the same msgspec types and discards it. The
floor (``bench.floor_app``) is a second FastAPI server in the same setup that
does only the work the request asks for (partition, write each partition's
bytes to its file, fdatasync for acks=all, answer with every offset) and none
of what makes a log a log (framing, checksums, indexes, validation, recovery):
the most a server in this framework can expect, and a measure of how much of the
bare endpoint's rate the request's own work leaves.
Reported: records/s, MB/s (key+value bytes), p50/p99 latency (wrk), server
CPU seconds per million records, and the ratios to the baseline's and the
floor's records/s.

The Python client (``--client-records``, default 1,000,000; 0 skips it): the
``Producer`` with its defaults (acks=all) against wrk posting bodies of as many records
per request as the Producer's requests held, 5 connections, to the same server; and
``lakelog produce`` of the same lines (from a file, process start to exit) against the
Producer.
"""

from __future__ import annotations

import argparse
import base64
import json
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

from bench.report import print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOPIC = "bench"
PARTITIONS = 8
KEY_BYTES, VALUE_BYTES = 16, 100
LUA = """
local f = io.open(os.getenv("LAKELOG_BENCH_BODY"), "rb")
wrk.body = f:read("*a")
f:close()
wrk.method = os.getenv("LAKELOG_BENCH_METHOD")
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  io.write(string.format(
    '\\nRESULT {"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status
      + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def body(records: int) -> bytes:
    def entry(i: int) -> dict[str, Any]:
        return {"id": str(i), "key": {"type": "BINARY", "data": base64.b64encode(os.urandom(KEY_BYTES)).decode()},
                "value": {"type": "BINARY", "data": base64.b64encode(os.urandom(VALUE_BYTES)).decode()}}
    if records == 1:
        single = entry(0)
        del single["id"]
        return json.dumps(single).encode()
    return json.dumps({"entries": [entry(i) for i in range(records)]}).encode()


def warm_page_cache(directory: Path, gib: float) -> None:
    """Write and delete ``gib`` GiB once: memory the VM touches for the first time is
    slow (FINDINGS.md), and the server's growing log would otherwise pay that cost
    where the bare endpoint, which writes nothing, does not."""
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(1 << 20)
    path = directory / "warm.bin"
    with path.open("wb") as f:
        for _ in range(int(gib * 1024)):
            f.write(block)
    path.unlink()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def quiet_server(work: Path, port: int, *args: str, auth: str | None = "none"
                 ) -> subprocess.Popen[bytes]:
    """``lakelog serve`` on ``work/data`` with no jobs and no SQL endpoint, its log in
    ``work/server.log`` (``auth``: None, the server's default); wait for it with
    ``wait_up``."""
    env = {**os.environ, **{f"LAKELOG_{job}_INTERVAL_MS": "0"
                            for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP")},
           "LAKELOG_SQL_PORT": "0", **({"LAKELOG_AUTH": auth} if auth else {})}
    return subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(work / "data"),
                             "--port", str(port), "--log-level", "warning", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"))


def start(cmd: list[str], port: int, health: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["taskset", "-c", "0", *cmd], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_up(f"http://127.0.0.1:{port}{health}")
    return proc


def wrk(url: str, body_path: Path, method: str, connections: int, seconds: int, lua: Path
        ) -> dict[str, Any]:
    env = {**os.environ, "LAKELOG_BENCH_BODY": str(body_path), "LAKELOG_BENCH_METHOD": method}
    out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
                          "--timeout", "10s", "-s", str(lua), url],
                         env=env, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


def measure(name: str, pid: int, url: str, body_path: Path, method: str, records: int,
            connections: int, seconds: int, lua: Path) -> dict[str, Any]:
    # Each case starts with no dirty pages of the one before: the kernel's writeback of
    # what one case wrote would otherwise slow the next (the bare endpoint writes nothing).
    os.sync()
    wrk(url, body_path, method, connections, 1, lua)  # warm up
    cpu0 = cpu_seconds(pid)
    r = wrk(url, body_path, method, connections, seconds, lua)
    cpu = cpu_seconds(pid) - cpu0
    secs = r["duration_us"] / 1e6
    total = r["requests"] * records
    row = {"case": name, "records_per_request": records, "connections": connections,
           "rec_s": total / secs, "MB_s": total * (KEY_BYTES + VALUE_BYTES) / secs / 1e6,
           "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
           "cpu_s_per_M": cpu / total * 1e6 if total else 0.0, "errors": r["errors"]}
    print(f"  {name:>10} x{records:<5} {row['rec_s']:>12,.0f} rec/s  p99 {row['p99_ms']:.2f} ms"
          f"  errors {r['errors']}", flush=True)
    return row


PRODUCER = """
import json, sys, time
from lakelog.client import Producer
url, topic, path = sys.argv[1], sys.argv[2], sys.argv[3]
records = [line.rstrip("\\n").split(":", 1) for line in open(path)]
with Producer(url) as producer:  # the defaults: acks=all, linger_ms=5, idempotent
    producer.partitions_for(topic)
    started = time.perf_counter()
    for key, value in records:
        producer.send(topic, value, key=key)
    producer.flush()
    elapsed = time.perf_counter() - started
    print(json.dumps({"seconds": elapsed, "records": len(records),
                      "requests": producer.requests_sent}))
"""


def lines_file(path: Path, records: int) -> list[tuple[str, str]]:
    """``records`` lines ``KEY:VALUE``: 16-character keys (10,000 distinct), 100-character
    values; returns the distinct (key, value) pairs of the first 1,000 lines."""
    keys = [os.urandom(8).hex() for _ in range(10_000)]
    values = [os.urandom(50).hex() for _ in range(1000)]
    with path.open("w") as f:
        for i in range(records):
            f.write(f"{keys[i % len(keys)]}:{values[i % len(values)]}\n")
    return [(keys[i % len(keys)], values[i % len(values)]) for i in range(1000)]


def batch_body(pairs: list[tuple[str, str]], records: int) -> bytes:
    """A ``records:batch`` body of ``records`` entries of ``pairs``, spread over the
    partitions as a Producer's request is (each entry names its partition)."""
    return json.dumps({"entries": [
        {"id": str(i), "partition_id": i % PARTITIONS,
         "key": {"type": "STRING", "data": pairs[i % len(pairs)][0]},
         "value": {"type": "STRING", "data": pairs[i % len(pairs)][1]}}
        for i in range(records)]}).encode()


def client_cases(work: Path, port: int, pid: int, records: int, seconds: int, lua: Path
                 ) -> list[dict[str, Any]]:
    """The Python client against wrk on the same server (acks=all, the defaults of both
    ``Producer`` and ``lakelog produce``): the ``Producer`` with its defaults sending
    ``records`` lines' records (client pinned to CPU 1, as wrk is), wrk posting bodies of
    as many records per request as the Producer's requests held on average, with 5
    connections (its requests in flight); and ``lakelog produce`` of the same lines from
    a file, timed from its start to its exit."""
    base = f"http://127.0.0.1:{port}"
    httpx.post(f"{base}/v3/clusters/lakelog/topics",
               json={"topic_name": "client", "partitions_count": PARTITIONS}).raise_for_status()
    path = work / "lines.txt"
    pairs = lines_file(path, records)
    print(f"  Producer: {records:,} records", flush=True)
    # As every wrk case: no dirty pages of the cases before (nor of the lines file) for
    # the kernel to write back while the Producer's acks=all requests wait for fdatasync.
    os.sync()
    out = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", PRODUCER, base, "client",
                          str(path)], capture_output=True, text=True, check=True).stdout
    measured = json.loads(out.splitlines()[-1])
    producer_rate = measured["records"] / measured["seconds"]
    per_request = max(1, round(measured["records"] / measured["requests"]))
    body_path = work / "client-body.json"
    body_path.write_bytes(batch_body(pairs, per_request))
    row_wrk = measure("wrk", pid, f"{base}/v3/clusters/lakelog/topics/client/records:batch"
                      "?acks=all", body_path, "POST", per_request, 5, seconds, lua)
    print(f"  lakelog produce: {records:,} lines", flush=True)
    os.sync()
    started = time.perf_counter()
    with path.open("rb") as stdin:
        subprocess.run(["taskset", "-c", "1", str(BIN / "lakelog"), "produce", "client",
                        "--separator", ":", "--url", base], stdin=stdin, check=True,
                       stdout=subprocess.DEVNULL)
    cli_rate = records / (time.perf_counter() - started)
    return [
        {"case": "Producer (defaults)", "records_per_request": per_request,
         "connections": 5, "rec_s": producer_rate, "vs_wrk": producer_rate / row_wrk["rec_s"]},
        {**row_wrk, "case": "wrk, the Producer's requests"},
        {"case": "lakelog produce (whole run)", "rec_s": cli_rate,
         "vs_producer": cli_rate / producer_rate},
    ]


def idempotent_cases(port: int, pid: int, seconds: int) -> list[dict[str, Any]]:
    """Entries with producer fields against the same entries without them, on the
    server (``bench.produce_idempotent``: 1,000 records a request, 8 connections, acks=1),
    in its two layouts: ``partition`` (one producer, a connection per partition: the
    fields' own cost) and ``spread`` (a producer per connection, every partition in each
    request: plain runs of several requests are appended together, a producer's are not):
    records/s and server CPU per record."""
    base = f"http://127.0.0.1:{port}"
    httpx.post(f"{base}/v3/clusters/lakelog/topics",
               json={"topic_name": "idem", "partitions_count": PARTITIONS}).raise_for_status()
    out: list[dict[str, Any]] = []
    for layout in ("partition", "spread"):
        rows: dict[str, dict[str, Any]] = {}
        for kind in ("plain", "idempotent", "plain", "idempotent"):  # twice: load drifts
            os.sync()
            cpu0 = cpu_seconds(pid)
            r = json.loads(subprocess.run(
                ["taskset", "-c", "1", sys.executable, "-m", "bench.produce_idempotent", base,
                 "idem", str(seconds), kind, "1", layout], cwd=ROOT, capture_output=True,
                text=True, check=True).stdout.splitlines()[-1])
            cpu = cpu_seconds(pid) - cpu0
            row = rows.setdefault(kind, {"case": f"{kind} entries ({layout})",
                                         "records_per_request": 1000, "connections": 8,
                                         "errors": 0, "_cpu": 0.0, "_records": 0, "_s": 0.0})
            row["_cpu"] += cpu
            row["_records"] += r["records"]
            row["_s"] += r["seconds"]
            row["errors"] += r["errors"]
            print(f"  {kind:>10} x1000 {layout:>9} {r['records'] / r['seconds']:>12,.0f} rec/s  "
                  f"server {cpu / max(r['records'], 1) * 1e6:.2f} us/record", flush=True)
        for row in rows.values():
            records = row.pop("_records")
            row["rec_s"] = records / row.pop("_s")
            row["cpu_s_per_M"] = row.pop("_cpu") / max(records, 1) * 1e6
        # The goal: an idempotent entry within 10% of a plain one (server CPU per record).
        rows["idempotent"]["vs_plain"] = rows["plain"]["cpu_s_per_M"] / rows["idempotent"][
            "cpu_s_per_M"]
        out += [rows["plain"], rows["idempotent"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="HTTP produce/fetch benchmark")
    parser.add_argument("--quick", action="store_true", help="3 s per case instead of 8")
    parser.add_argument("--sizes", default="1,100,1000",
                        help="records per request to measure, comma-separated (default 1,100,1000)")
    parser.add_argument("--client-records", type=int, default=1_000_000,
                        help="records the Python Producer and lakelog produce send (0: skip)")
    args = parser.parse_args()
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        sys.exit("bench.produce needs wrk and taskset: apt-get install wrk util-linux")
    seconds = 3 if args.quick else 8
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-produce-"))
    lua = work / "bench.lua"
    lua.write_text(LUA)
    port, bare_port, floor_port = 18731, 18732, 18733
    print("warming the page cache...", flush=True)
    warm_page_cache(work / "data", 1.5 if args.quick else 4)
    # The scheduled jobs stay off: this measures the HTTP data path. Left on, the job
    # process works on the gigabytes the produce cases write while later cases run (a
    # --quick run with them on measured fetch at 0.84x produce; off, 1.5x). The jobs
    # have their own benchmarks (bench.tier, bench.compact, bench.jobs_latency).
    for job in ("TIER", "RETENTION", "COMPACT", "UPKEEP"):
        os.environ.setdefault(f"LAKELOG_{job}_INTERVAL_MS", "0")
    server = start([str(BIN / "lakelog"), "serve", "--data-dir", str(work / "data"), "--port",
                    str(port), "--log-level", "warning"], port, "/healthz")
    bare = start([sys.executable, "-m", "bench.bare_app", str(bare_port)], bare_port, "/docs")
    floor = start([sys.executable, "-m", "bench.floor_app", str(floor_port), str(work / "floor"),
                   str(PARTITIONS)], floor_port, "/docs")
    rows: list[dict[str, Any]] = []
    try:
        httpx.post(f"http://127.0.0.1:{port}/v3/clusters/lakelog/topics",
                   json={"topic_name": TOPIC, "partitions_count": PARTITIONS}).raise_for_status()
        for records in sizes:
            path = work / f"body-{records}.json"
            path.write_bytes(body(records))
            route = "records" if records == 1 else "records:batch"
            conns = 32 if records == 1 else 8
            base = f"/v3/clusters/lakelog/topics/{TOPIC}/{route}"
            bare_row = measure("bare", bare.pid, f"http://127.0.0.1:{bare_port}{base}", path, "POST",
                               records, conns, seconds, lua)
            rows.append(bare_row)
            for acks in ("1", "all"):
                row = measure(f"acks={acks}", server.pid, f"http://127.0.0.1:{port}{base}?acks={acks}",
                              path, "POST", records, conns, seconds, lua)
                floor_row = measure(f"floor acks={acks}", floor.pid,
                                    f"http://127.0.0.1:{floor_port}{base}?acks={acks}", path, "POST",
                                    records, conns, seconds, lua)
                for r in (row, floor_row):
                    r["vs_bare"] = r["rec_s"] / bare_row["rec_s"]
                row["vs_floor"] = row["rec_s"] / floor_row["rec_s"]
                rows += [row, floor_row]
        empty = work / "empty"
        empty.write_bytes(b"")
        fetch_url = (f"http://127.0.0.1:{port}/v3/clusters/lakelog/topics/{TOPIC}/partitions/0/"
                     "records?offset=0&max_records=1000&max_bytes=4194304")
        fetch_row = measure("fetch", server.pid, fetch_url, empty, "GET", 1000, 8, seconds, lua)
        produce_1000 = [r for r in rows if r["case"] == "acks=1" and r["records_per_request"] == 1000]
        if produce_1000:
            fetch_row["vs_produce"] = fetch_row["rec_s"] / produce_1000[0]["rec_s"]
        rows.append(fetch_row)
        if 1000 in sizes:
            rows += idempotent_cases(port, server.pid, seconds)
        if args.client_records:
            rows += client_cases(work, port, server.pid, args.client_records, seconds, lua)
    finally:
        for proc in (server, bare, floor):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows, ["case", "records_per_request", "connections", "rec_s", "MB_s", "p50_ms",
                       "p99_ms", "cpu_s_per_M", "vs_bare", "vs_floor", "vs_produce", "vs_plain",
                       "vs_wrk", "vs_producer", "errors"])
    goals = goal_ratios(rows)
    for name, (ratio, goal) in goals.items():
        print(f"{name}: {ratio:.2f} (goal {goal})")
    extra = {"seconds_per_case": seconds, "sizes": sizes,
             "goals": {name: {"ratio": ratio, "goal": goal} for name, (ratio, goal) in goals.items()}}
    print(f"\nwrote {write_json('produce', rows, extra)}")


def goal_ratios(rows: list[dict[str, Any]]) -> dict[str, tuple[float, str]]:
    """The issue's goals, each a ratio measured in this run against its baseline."""
    out: dict[str, tuple[float, str]] = {}
    for r in rows:
        if r["case"] in ("acks=1", "acks=all") and r.get("records_per_request") == 1000:
            out[f"HTTP produce x1000 {r['case']} / floor"] = (r["vs_floor"], ">= 0.85")
        elif r["case"].startswith("idempotent entries"):
            layout = r["case"].split("(")[1].rstrip(")")
            out[f"server CPU a plain entry / an idempotent one ({layout})"] = (r["vs_plain"],
                                                                                ">= 0.91")
        elif r["case"] == "Producer (defaults)":
            out["Producer / wrk posting its requests"] = (r["vs_wrk"], ">= 0.8")
    return out


if __name__ == "__main__":
    main()
