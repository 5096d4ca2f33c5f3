"""The SQL endpoint of ``lakelog serve`` (``python -m bench.sql``).

One server (``LAKELOG_AUTH=none``) on a fresh data directory with the SQL endpoint on
free ports (Spark Connect through lakelog's front, and JDBC), the tiering job on
(every 5 s and on each roll; the other jobs off). Measured, in this order:

1. **Cold start**: from ``lakelog serve``'s start to the endpoint's state file
   (``sql-endpoint.json``) saying ``ready``, and to a first ``SELECT 1`` answered
   through Spark Connect (lakelog's one-call client). The job process's Spark is not
   up yet then: it starts on the first run with work.
2. **Fill**: ``--records`` records (4 partitions, 16 B keys, 100 B values) with the
   ``Producer`` (acks=1), then every partition rolled (``segments:roll``) and the
   wait until the ``partitions`` view shows ``tiered_offset == high_watermark``, so the
   count reads Parquet files only (the wait includes the job process's Spark start). A
   consumer group commits offsets (half way) so ``consumer_lag`` has rows.
3. **Warm latency**, p50 and p99 (of 30 runs: about the slowest) over ``--runs`` runs
   after 3 warm-ups, of
   ``SELECT count(*) FROM <topic>`` and ``SELECT * FROM consumer_lag``:
   PySpark's own Connect client (``SparkSession.builder.remote``, one session reused,
   ``spark.sql(q).collect()``); ``lakelog.endpoint.client.query`` (what ``lakelog sql``
   uses; one session per user, kept between calls); JDBC (lakelog's JDBC front, Thrift over HTTP, the URL
   from the endpoint's state file) through ``beeline`` from pyspark's jars, one beeline
   process running all the statements with ``--showElapsedTime=true`` (its
   "(N seconds)" lines: execute to last row fetched, as beeline times it, ms
   resolution; no JVM start counted); and ``lakelog sql`` end to end (process start to
   exit). The **baseline** runs in the same run in a process of its own (this one holds
   a Connect session, and a process cannot also hold a classic one): one warm local
   SparkSession (``local[2]``, 1 g driver, as the endpoint's) running
   ``spark.read.parquet(<the topic's Delta data files>).count()`` and, for
   ``consumer_lag``, ``spark.read.parquet(<the offsets table's files>)`` grouped by
   group, topic and partition with ``max_by(offset, seq)`` (the core of
   ``consumer_offsets``; the lag view also joins ``partitions``, which lakelog builds
   from its files). Ratios: endpoint p50 / baseline p50.
4. **Memory**: RSS summed over a process tree read from /proc (the process, its JVM,
   PySpark's daemon and workers), also PSS (shared pages split between the processes
   that map them, so forked workers are not counted twice): the endpoint idle just
   after its first ``SELECT 1``, and after all the queries; the job process after
   tiering (its Spark up: what the resident Spark that an endpoint inside the job
   process would share costs); the HTTP server's own process.
5. **Produce latency**: ``bench.jobs_latency``'s open-loop load (100-record batches,
   acks=1, ``--rate`` requests/s from 8 senders; topics ``events`` and ``state`` with
   ``delta.target.lag.ms=-1``, so nothing rolls or tiers meanwhile) for
   ``--load-seconds`` with the endpoint idle, then as long again while another process
   runs the count on the big topic back to back through Spark Connect. Reported:
   p50, p99, max, p99 busy / p99 idle, the queries done and their p50, and the
   endpoint's CPU (its process tree's CPU seconds per second of the phase: what an
   idle endpoint costs, and a busy one).

Every count answered is checked against ``--records``. Options: ``--records``
(1,000,000), ``--runs`` (30), ``--rate`` (200), ``--load-seconds`` (20); ``--quick``:
20,000 records, 5 runs, 5 s of load (a smoke run); ``--keep`` keeps the data and
``serve.log``. Progress goes to stderr, the tables to stdout, JSON to
``bench/results/sql.json`` (``sql-quick.json`` with ``--quick``) or ``--json PATH``.
Run it on a quiet machine: every number here moves with other load on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.jobs_latency import PORT, load
from bench.produce import wait_up
from bench.report import print_table, write_json
from consumer_groups.offsets import offsets_uri
from lakelog.client import Producer
from lakelog.endpoint.client import query
from lakelog.endpoint.state import read_state
from lakelog.local import free_port
from log_tables.layout import Layout, delta_path

BIN = Path(sys.executable).parent
URL = f"http://127.0.0.1:{PORT}"  # bench.jobs_latency's load posts to this port
BASE = f"{URL}/v3/clusters/lakelog"
TOPIC = "sqlbench"
GROUP = "sqlbench-readers"
PARTITIONS = 4
WARMUPS = 3
COUNT_SQL = f"SELECT count(*) AS n FROM {TOPIC}"
LAG_SQL = "SELECT * FROM consumer_lag"
QUERIES = (("count", COUNT_SQL), ("lag", LAG_SQL))
READY_WAIT_S = 300.0
TIER_WAIT_S = 900.0


def say(line: str) -> None:
    print(f"bench.sql: {line}", file=sys.stderr, flush=True)


def wait_for(check: Callable[[], Any], what: str, timeout_s: float, every_s: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true; its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = check()
        except Exception:  # not up yet: try again until the deadline
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done in {timeout_s:.0f} s")
        time.sleep(every_s)


# ---- processes and memory -------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def memory_mb(pid: int) -> dict[str, Any]:
    """RSS and PSS (MB) summed over ``pid``'s process tree, and how many processes."""
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
            rss += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            pss += int(re.search(r"Pss:\s+(\d+)", rollup).group(1))  # type: ignore[union-attr]
        except (OSError, AttributeError):  # gone, or a kernel thread
            continue
    return {"rss_MB": rss / 1024, "pss_MB": pss / 1024, "processes": len(pids)}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid``'s process tree so far (its live processes)."""
    total = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def child_running(parent: int, module: str) -> int | None:
    for pid in _children().get(parent, []):
        try:
            if module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


# ---- the server and its data ----------------------------------------------------------

def start_server(data: Path, log: Path, sql_port: int, jdbc_port: int
                 ) -> tuple[subprocess.Popen[bytes], dict[str, float]]:
    """``lakelog serve`` with the endpoint; seconds to HTTP up, state ready, SELECT 1."""
    env = {**os.environ, "LAKELOG_AUTH": "none", "LAKELOG_SQL_PORT": str(sql_port),
           "LAKELOG_JDBC_PORT": str(jdbc_port), "LAKELOG_TIER_INTERVAL_MS": "5000",
           "LAKELOG_RETENTION_INTERVAL_MS": "0", "LAKELOG_COMPACT_INTERVAL_MS": "0",
           "LAKELOG_UPKEEP_INTERVAL_MS": "0"}
    started = time.perf_counter()
    server = subprocess.Popen([str(BIN / "lakelog"), "serve", "--data-dir", str(data), "--port",
                               str(PORT), "--log-level", "warning"], env=env,
                              stdout=subprocess.DEVNULL, stderr=log.open("w"))
    cold: dict[str, float] = {}
    try:
        wait_up(f"{URL}/healthz")
        cold["http_up_s"] = time.perf_counter() - started
        say(f"server up in {cold['http_up_s']:.1f} s; waiting for the SQL endpoint...")

        def ready() -> bool:
            state = read_state(data)
            if state is not None and state.get("state") == "failed":
                raise SystemExit(f"the SQL endpoint failed: {state.get('error')}")
            if server.poll() is not None:
                raise SystemExit(f"lakelog serve exited ({server.returncode}): see {log}")
            return state is not None and state.get("state") == "ready"

        deadline = time.monotonic() + READY_WAIT_S
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the SQL endpoint was not ready in {READY_WAIT_S:.0f} s")
            time.sleep(0.05)
        cold["state_ready_s"] = time.perf_counter() - started
        url = f"sc://127.0.0.1:{sql_port}"
        wait_for(lambda: query(url, "SELECT 1 AS one", 1).num_rows == 1, "SELECT 1", 60, 0.05)
        cold["select_1_s"] = time.perf_counter() - started
    except BaseException:
        server.kill()
        server.wait()
        sys.stderr.write(log.read_text()[-3000:])
        raise
    return server, cold


def fill(records: int) -> float:
    """``records`` records (16 B keys, 100 B values) to ``TOPIC``; records/s."""
    httpx.post(f"{BASE}/topics", json={"topic_name": TOPIC, "partitions_count": PARTITIONS}
               ).raise_for_status()
    value = os.urandom(100)
    keys = [b"key-%012d" % i for i in range(1000)]
    started = time.perf_counter()
    step = 50_000
    with Producer(URL, acks="1") as producer:
        for i in range(0, records, step):
            producer.send_many(TOPIC, [(keys[j % 1000], value)
                                       for j in range(i, min(records, i + step))])
            if i and i % 200_000 == 0:
                say(f"  {i:,} records sent")
        producer.flush()
    return records / (time.perf_counter() - started)


def tier_all(url: str) -> float:
    """Roll every partition and wait for ``partitions`` to show all of it tiered; seconds."""
    started = time.perf_counter()
    httpx.post(f"{BASE}/topics/{TOPIC}/segments:roll", timeout=60).raise_for_status()
    sql = ("SELECT sum(high_watermark) AS hw, sum(tiered_offset) AS tiered FROM partitions "
           f"WHERE topic = '{TOPIC}'")
    last = [0.0]

    def done() -> bool:
        row = query(url, sql, 1).to_pylist()[0]
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            say(f"  tiered {row['tiered'] or 0:,} of {row['hw']:,}")
        return bool(row["hw"]) and row["tiered"] == row["hw"]

    wait_for(done, "tiering", TIER_WAIT_S, 1.0)
    return time.perf_counter() - started


def commit_offsets(url: str) -> None:
    """A group's offsets half way into each partition; wait for ``consumer_lag`` to show them."""
    ends = [int(httpx.get(f"{BASE}/topics/{TOPIC}/partitions/{p}").json()["high_watermark"])
            for p in range(PARTITIONS)]
    httpx.post(f"{BASE}/consumer-groups/{GROUP}/offsets", json={"offsets": [
        {"topic_name": TOPIC, "partition_id": p, "offset": end // 2}
        for p, end in enumerate(ends)]}).raise_for_status()
    wait_for(lambda: query(url, f"SELECT count(*) AS n FROM consumer_lag WHERE `group` = "
                                f"'{GROUP}'", 1).to_pylist()[0]["n"] == PARTITIONS,
             "consumer_lag rows", 60, 0.5)


# ---- latency --------------------------------------------------------------------------

def timed(ask: Callable[[str], Any], runs: int, records: int, what: str
          ) -> dict[str, list[float]]:
    """Seconds of each of ``runs`` calls of ``ask`` per query, after ``WARMUPS``; ``ask``
    returns the first cell of the answer, and every count must be ``records``."""
    found: dict[str, list[float]] = {}
    for name, sql in QUERIES:
        found[name] = []
        for i in range(WARMUPS + runs):
            started = time.perf_counter()
            first = ask(sql)
            elapsed = time.perf_counter() - started
            if name == "count" and int(first) != records:
                raise RuntimeError(f"{what} counted {first} records of {records}")
            if i >= WARMUPS:
                found[name].append(elapsed)
    return found


def pyspark_connect(url: str, runs: int, records: int) -> dict[str, list[float]]:
    """PySpark's own client, one session for every run."""
    from pyspark.sql import SparkSession

    saved = dict(os.environ)
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        return timed(lambda sql: spark.sql(sql).collect()[0][0], runs, records,
                     "PySpark's client")
    finally:
        spark.stop()
        # It set SPARK_CONNECT_MODE_ENABLED, which would make the baseline's local
        # session in a child process a remote one.
        os.environ.clear()
        os.environ.update(saved)


def one_call_client(url: str, runs: int, records: int) -> dict[str, list[float]]:
    return timed(lambda sql: query(url, sql, 1000).column(0)[0].as_py(), runs, records,
                 "lakelog.endpoint.client")


def lakelog_sql(data: Path, url: str, runs: int, records: int) -> dict[str, list[float]]:
    """``lakelog sql`` from process start to exit."""
    def ask(sql: str) -> Any:
        out = subprocess.run([str(BIN / "lakelog"), "sql", "--data-dir", str(data), "--connect",
                              url, "--json", sql], capture_output=True, text=True, check=True)
        return next(iter(json.loads(out.stdout.splitlines()[0]).values()))
    return timed(ask, runs, records, "lakelog sql")


def beeline(jdbc_url: str, runs: int, records: int, work: Path) -> dict[str, list[float]]:
    """One beeline process running every statement on ``jdbc_url`` (the endpoint's state
    file names it); the times it prints for each."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    script = work / "beeline.sql"
    statements = [sql for _, sql in QUERIES for _ in range(WARMUPS + runs)]
    script.write_text("".join(f"{sql};\n" for sql in statements))
    out = subprocess.run(
        ["java", "-cp", f"{jars}/*", "org.apache.hive.beeline.BeeLine", "-u",
         jdbc_url, "--showElapsedTime=true",
         "--outputformat=tsv2", "-f", str(script)],
        capture_output=True, text=True, timeout=1800)
    times = [float(s) for s in re.findall(r"\((\d+(?:\.\d+)?) seconds\)", out.stderr)]
    if out.returncode != 0 or len(times) != len(statements):
        raise RuntimeError(f"beeline: exit {out.returncode}, {len(times)} timings of "
                           f"{len(statements)} statements:\n{out.stderr[-3000:]}")
    counted = out.stdout.splitlines().count(str(records))
    if counted != WARMUPS + runs:
        raise RuntimeError(f"JDBC: {counted} of {WARMUPS + runs} counts were {records}")
    n = WARMUPS + runs
    return {"count": times[WARMUPS:n], "lag": times[n + WARMUPS:]}


BASELINE = """
import json, sys, time
from pyspark.sql import functions as F
from log_tables.spark.session import lakelog_session
data, topic_files, offset_files, warmups, runs = sys.argv[1], json.loads(sys.argv[2]), \\
    json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
spark = lakelog_session(data, master="local[2]", app_name="bench-baseline",
                        conf={"spark.driver.memory": "1g"})
def timed(fn):
    for _ in range(warmups):
        fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
def lag():
    return spark.read.parquet(*offset_files).groupBy("group", "topic", "partition").agg(
        F.max_by("offset", "seq").alias("offset")).collect()
found = {"count": timed(lambda: spark.read.parquet(*topic_files).count()), "lag": timed(lag)}
assert spark.read.parquet(*topic_files).count() == int(sys.argv[6])
print(json.dumps(found))
spark.stop()
"""


def baseline(data: Path, records: int, runs: int) -> dict[str, list[float]]:
    """The same files read by ``spark.read.parquet`` in a warm local session of its own."""
    from deltalake import DeltaTable

    layout = Layout.of(data)
    topic_files = [delta_path(u) for u in DeltaTable(layout.table_uri(TOPIC)).file_uris()]
    offset_files = [delta_path(u) for u in DeltaTable(offsets_uri(layout.warehouse)).file_uris()]
    out = subprocess.run([sys.executable, "-c", BASELINE, str(data), json.dumps(topic_files),
                          json.dumps(offset_files), str(WARMUPS), str(runs), str(records)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the baseline failed:\n{out.stderr[-3000:]}")
    found: dict[str, list[float]] = json.loads(out.stdout.splitlines()[-1])
    return found


def latency_rows(cases: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    base = {q: float(np.percentile(cases["baseline"][q], 50)) for q in ("count", "lag")}
    rows = []
    for name, found in cases.items():
        for q, label in (("count", f"count(*) {TOPIC}"), ("lag", "consumer_lag")):
            ms = np.array(found[q]) * 1000
            p50 = float(np.percentile(ms, 50))
            rows.append({"section": "latency", "query": label, "case": name, "runs": len(ms),
                         "p50_ms": p50, "p99_ms": float(np.percentile(ms, 99)),
                         "vs_baseline": p50 / (base[q] * 1000)})
    return rows


# ---- produce latency with the endpoint busy -------------------------------------------

BUSY = """
import json, sys, threading, time
from lakelog.endpoint.client import query
url, sql = sys.argv[1], sys.argv[2]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
query(url, sql, 10)
print("go", flush=True)
times = []
while not stop.is_set():
    t = time.perf_counter()
    query(url, sql, 10)
    times.append(time.perf_counter() - t)
print(json.dumps(times), flush=True)
"""


def produce_phases(sql_url: str, endpoint: int, rate: float, seconds: float
                   ) -> list[dict[str, Any]]:
    """Produce p50/p99 with the endpoint idle, then busy; and the endpoint's CPU seconds
    (its whole process tree) per second of each phase."""
    for topic in ("events", "state"):
        httpx.post(f"{BASE}/topics", json={
            "topic_name": topic, "partitions_count": 2,
            "configs": [{"name": "delta.target.lag.ms", "value": "-1"}]}).raise_for_status()
    asyncio.run(load(rate, 3))  # warm up
    rows: list[dict[str, Any]] = []
    for case in ("endpoint idle", "endpoint busy"):
        busy = None
        queries: list[float] = []
        if case == "endpoint busy":
            busy = subprocess.Popen([sys.executable, "-c", BUSY, sql_url, COUNT_SQL],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert busy.stdin is not None and busy.stdout is not None
            if busy.stdout.readline().strip() != "go":
                raise RuntimeError("the query loop did not start")
        say(f"  produce load, {case}, {seconds:.0f} s")
        cpu = cpu_seconds(endpoint)
        started = time.perf_counter()
        try:
            latencies = np.array(asyncio.run(load(rate, seconds))) * 1000
            cpu_per_s = (cpu_seconds(endpoint) - cpu) / (time.perf_counter() - started)
        finally:
            if busy is not None:
                out, _ = busy.communicate("stop\n", timeout=300)
                queries = json.loads(out.splitlines()[-1])
        rows.append({"section": "produce", "case": case, "requests": len(latencies),
                     "p50_ms": float(np.percentile(latencies, 50)),
                     "p99_ms": float(np.percentile(latencies, 99)),
                     "max_ms": float(latencies.max()), "endpoint_cpu": cpu_per_s,
                     "queries": len(queries),
                     **({"query_p50_ms": float(np.percentile(queries, 50)) * 1000}
                        if queries else {})})
    rows[1]["p99_vs_idle"] = rows[1]["p99_ms"] / rows[0]["p99_ms"]
    return rows


# ---- the run --------------------------------------------------------------------------

def run(work: Path, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    data = work / "data"
    sql_port, jdbc_port = free_port(), free_port()
    url = f"sc://127.0.0.1:{sql_port}"
    say(f"starting lakelog serve (Spark Connect {sql_port}, JDBC {jdbc_port})")
    server, cold = start_server(data, work / "serve.log", sql_port, jdbc_port)
    rows: list[dict[str, Any]] = []
    try:
        say(f"endpoint ready in {cold['state_ready_s']:.1f} s, SELECT 1 at "
            f"{cold['select_1_s']:.1f} s")
        state = read_state(data)
        assert state is not None
        endpoint, jdbc_url = state["pid"], state["jdbc"]
        idle = memory_mb(endpoint)
        say(f"filling {TOPIC} with {args.records:,} records")
        fill_rate = fill(args.records)
        say(f"  {fill_rate:,.0f} records/s; rolling and tiering")
        tier_s = tier_all(url)
        say(f"  tiered in {tier_s:.1f} s; committing a group's offsets")
        commit_offsets(url)
        jobs = child_running(server.pid, "compaction_jobs.scheduler")
        jobs_mem = memory_mb(jobs) if jobs is not None else None
        cases: dict[str, dict[str, list[float]]] = {}
        n = args.records
        measures: list[tuple[str, Callable[[], dict[str, list[float]]]]] = [
                ("PySpark Connect client", lambda: pyspark_connect(url, args.runs, n)),
                ("lakelog one-call client", lambda: one_call_client(url, args.runs, n)),
                ("JDBC (beeline, one process)", lambda: beeline(jdbc_url, args.runs, n, work)),
                ("lakelog sql (process)", lambda: lakelog_sql(data, url, args.runs, n)),
                ("baseline", lambda: baseline(data, args.records, args.runs))]
        for name, measure in measures:
            say(f"latency: {name}")
            cases[name] = measure()
        after = memory_mb(endpoint)
        rows += latency_rows(cases)
        rows += [{"section": "memory", "case": "SQL endpoint, idle after SELECT 1", **idle},
                 {"section": "memory", "case": "SQL endpoint, after the queries", **after}]
        if jobs_mem is not None:
            rows.append({"section": "memory", "case": "job process, Spark up (after tiering)",
                         **jobs_mem})
        rows.append({"section": "memory", "case": "HTTP server alone", **_own(server.pid),
                     "processes": 1})
        say("produce latency")
        rows += produce_phases(url, endpoint, args.rate, args.load_seconds)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    rows.insert(0, {"section": "cold start", "case": "serve -> endpoint ready",
                    "seconds": cold["state_ready_s"]})
    rows.insert(1, {"section": "cold start", "case": "serve -> first SELECT 1 answered",
                    "seconds": cold["select_1_s"]})
    extra = {"records": args.records, "runs": args.runs, "warmups": WARMUPS,
             "rate": args.rate, "load_seconds": args.load_seconds,
             "fill_rec_s": fill_rate, "tier_s": tier_s, "http_up_s": cold["http_up_s"]}
    return rows, extra


def _own(pid: int) -> dict[str, float]:
    """RSS and PSS (MB) of one process, without its children."""
    try:
        rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()
                            ).group(1))  # type: ignore[union-attr]
        pss = int(re.search(r"Pss:\s+(\d+)", Path(f"/proc/{pid}/smaps_rollup").read_text()
                            ).group(1))  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return {}
    return {"rss_MB": rss / 1024, "pss_MB": pss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=None,
                        help="records of the topic counted (default 1,000,000)")
    parser.add_argument("--runs", type=int, default=None, help="measured runs per case (30)")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="produce requests per second of 100 records")
    parser.add_argument("--load-seconds", type=float, default=None,
                        help="produce load per phase (20)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (data, serve.log) and say where")
    args = parser.parse_args()
    quick = {"records": 20_000, "runs": 5, "load_seconds": 5.0}
    full = {"records": 1_000_000, "runs": 30, "load_seconds": 20.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if shutil.which("java") is None:
        sys.exit("bench.sql needs java (17 or 21) on PATH for beeline")
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-sql-"))
    try:
        rows, extra = run(work, args)
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    for section, columns in (
            ("cold start", ["case", "seconds"]),
            ("latency", ["query", "case", "runs", "p50_ms", "p99_ms", "vs_baseline"]),
            ("memory", ["case", "rss_MB", "pss_MB", "processes"]),
            ("produce", ["case", "requests", "p50_ms", "p99_ms", "max_ms", "endpoint_cpu",
                         "queries", "query_p50_ms", "p99_vs_idle"])):
        print(f"\n{section}:")
        print_table([r for r in rows if r["section"] == section], columns)
    name = "sql-quick" if args.quick else "sql"
    path = write_json(name, rows, extra, path=args.json)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
