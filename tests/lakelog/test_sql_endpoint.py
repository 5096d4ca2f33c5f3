"""The SQL endpoint of a real ``lakelog serve`` (API keys on): Spark Connect through
lakelog's front (the one-call client ``lakelog sql`` uses, and PySpark's own client in a
program of its own), JDBC through beeline, and the ACLs in front of both paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lakelog.endpoint.client import query, release, stable_session
from lakelog.endpoint.state import read_state
from lakelog.local import free_port
from log_tables.errors import LakelogError
from tests.server import ServerProcess, process_alive

LAKELOG = Path(sys.executable).parent / "lakelog"
READY_S = 240.0

pytestmark = pytest.mark.slow


class Endpoint:
    def __init__(self, server: ServerProcess, port: int, jdbc_port: int) -> None:
        self.server, self.port, self.jdbc_port = server, port, jdbc_port
        self.admin = (server.data_dir / "security" / "admin.key").read_text().strip()
        self.analyst = ""
        self.first_sql: subprocess.CompletedProcess[str] | None = None
        self.first_state = ""

    def url(self, key: str | None) -> str:
        if key is None:
            return f"sc://127.0.0.1:{self.port}"
        return f"sc://localhost:{self.port}/;token={key.replace(':', '.', 1)}"

    def http(self, key: str) -> httpx.Client:
        key_id, _, secret = key.partition(":")
        return self.server.client(auth=(key_id, secret))

    def produce(self, topic: str, n: int, start: int = 0) -> None:
        with self.http(self.admin) as c:
            for first in range(start, start + n, 500):
                entries = [{"id": str(i), "key": {"type": "STRING", "data": f"k{i % 7}"},
                            "value": {"type": "STRING", "data": f"v{i}"}}
                           for i in range(first, min(first + 500, start + n))]
                r = c.post(f"/topics/{topic}/records:batch", json={"entries": entries})
                assert r.status_code == 207 and not r.json()["failures"], r.text

    def count(self, topic: str, key: str | None = None) -> int:
        table = query(self.url(key or self.admin), f"SELECT count(*) AS n FROM `{topic}`", 10)
        return int(table.column("n")[0].as_py())


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    port, jdbc_port = free_port(), free_port()
    server = ServerProcess(tmp_path_factory.mktemp("sql") / "data", env={
        "LAKELOG_AUTH": "api-key", "LAKELOG_SQL_PORT": str(port),
        "LAKELOG_JDBC_PORT": str(jdbc_port), "LAKELOG_SQL_MASTER": "local[1]"}).start()
    ep = Endpoint(server, port, jdbc_port)
    try:
        with ep.http(ep.admin) as admin:
            for name in ("orders", "secret"):
                assert admin.post("/topics", json={"topic_name": name, "partitions_count": 2}
                                  ).status_code == 201
            made = admin.post("/api-keys", json={"principal": "analyst"}).json()
            ep.analyst = f"{made['key_id']}:{made['secret']}"
            assert admin.post("/acls", json={
                "principal": "analyst", "operation": "consume", "resource_type": "topic",
                "resource_name": "orders"}).status_code == 201
        ep.produce("orders", 1000)
        ep.produce("secret", 10)
        # The first `lakelog sql` comes while the endpoint still starts its Spark.
        deadline = time.monotonic() + 30
        while (state := read_state(server.data_dir)) is None:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        ep.first_state = state["state"]
        ep.first_sql = subprocess.run(
            [LAKELOG, "sql", "--data-dir", str(server.data_dir), "--connect", ep.url(None),
             "--json", "SELECT count(*) AS n FROM orders"],
            capture_output=True, text=True, timeout=READY_S,
            env={**os.environ, "LAKELOG_API_KEY": ep.admin})
        yield ep
    finally:
        server.stop(timeout_s=90)


def test_lakelog_sql_waits_for_a_starting_endpoint_then_answers(endpoint: Endpoint) -> None:
    out = endpoint.first_sql
    assert out is not None and out.returncode == 0, out and out.stderr
    assert json.loads(out.stdout) == {"n": 1000}
    if endpoint.first_state == "starting":  # almost always: Spark takes seconds to start
        assert out.stderr.startswith("lakelog: the SQL endpoint (pid "), out.stderr
        assert "is starting Spark; waiting for it..." in out.stderr


def test_topics_by_name_with_the_live_tail_and_topics_made_later(endpoint: Endpoint) -> None:
    assert endpoint.count("orders") == 1000
    endpoint.produce("orders", 234, start=1000)
    assert endpoint.count("orders") == 1234  # the hot tail as of the query
    with endpoint.http(endpoint.admin) as admin:
        assert admin.post("/topics", json={"topic_name": "late", "partitions_count": 1}
                          ).status_code == 201
    endpoint.produce("late", 5)
    assert endpoint.count("late") == 5  # no restart, no refresh call
    parts = query(endpoint.url(endpoint.admin), "SELECT topic, sum(high_watermark) AS hw "
                  "FROM partitions GROUP BY topic ORDER BY topic", 10).to_pylist()
    assert parts == [{"topic": "late", "hw": 5}, {"topic": "orders", "hw": 1234},
                     {"topic": "secret", "hw": 10}]
    rows = query(endpoint.url(endpoint.admin), "SELECT key, value, partition, offset FROM "
                 "orders WHERE value = 'v1233'", 10).to_pylist()
    assert len(rows) == 1 and rows[0]["key"] == b"k1"
    for view in ("job_runs", "consumer_offsets", "consumer_lag", "consumer_group_lag"):
        # by name too (nothing ran or committed here: empty); a missing view fails
        assert query(endpoint.url(endpoint.admin), f"SELECT count(*) AS n FROM {view}", 10
                     ).to_pylist() == [{"n": 0}]


def test_a_principal_sees_only_the_topics_it_may_consume(endpoint: Endpoint) -> None:
    analyst = endpoint.url(endpoint.analyst)
    assert endpoint.count("orders", endpoint.analyst) >= 1000
    with pytest.raises(LakelogError, match="principal analyst may not consume topic secret"):
        query(analyst, "SELECT count(*) FROM secret", 10)
    topics = query(analyst, "SELECT DISTINCT topic FROM partitions", 10).column("topic")
    assert topics.to_pylist() == ["orders"]
    with pytest.raises(LakelogError, match="may only query"):
        query(analyst, "CREATE TABLE t USING parquet LOCATION '/tmp'", 10)
    with pytest.raises(LakelogError, match="may not call Java methods"):
        query(analyst, "SELECT reflect('java.lang.System', 'getenv', 'HOME')", 10)
    # A path names no topic: the files are still out of reach (runSQLOnFiles is off).
    table_dir = endpoint.server.data_dir / "hot" / "orders"
    with pytest.raises(LakelogError, match=r"SQL failed: .*parquet"):
        query(analyst, f"SELECT * FROM parquet.`{table_dir}`", 10)
    with pytest.raises(LakelogError, match="an API key is needed"):
        query(endpoint.url(None), "SELECT 1", 10)
    key_id = endpoint.analyst.partition(":")[0]
    with pytest.raises(LakelogError, match=f"API key {key_id} is unknown or its secret"):
        query(endpoint.url(f"{key_id}:wrong"), "SELECT 1", 10)


PROGRAM = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    out = {"count": spark.table("orders").count(),
           "per_partition": sorted(r["n"] for r in spark.table("orders").groupBy("partition")
                                   .agg(F.count("*").alias("n")).collect()),
           "views": sorted(r["viewName"] for r in spark.sql("SHOW VIEWS").collect())}
    try:
        spark.read.parquet(sys.argv[2]).count()
        out["direct_read"] = "allowed"
    except Exception as exc:
        out["direct_read"] = str(exc)
    print(json.dumps(out))
""")


def test_a_pyspark_program_connects_with_builder_remote(endpoint: Endpoint,
                                                         tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    table_dir = endpoint.server.data_dir / "warehouse" / "topics" / "secret"
    out = subprocess.run([sys.executable, str(program), endpoint.url(endpoint.analyst),
                          str(table_dir)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["count"] >= 1000 and sum(found["per_partition"]) == found["count"]
    assert "orders" in found["views"] and "secret" not in found["views"]
    assert "partitions" in found["views"] and "consumer_lag" in found["views"]
    assert "principal analyst may not read files or data sources directly" in \
        found["direct_read"]


def _beeline(endpoint: Endpoint, key: str | None, sql: str) -> subprocess.CompletedProcess[str]:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    url = f"jdbc:hive2://127.0.0.1:{endpoint.jdbc_port}/default;transportMode=http;" \
          "httpPath=cliservice"
    user, _, password = (key or "").partition(":")
    return subprocess.run(
        ["java", "-cp", f"{jars}/*", "org.apache.hive.beeline.BeeLine", "-u", url,
         *(["-n", user, "-p", password] if key else []), "--outputformat=csv2",
         "--silent=true", "-e", sql], capture_output=True, text=True, timeout=120)


def test_jdbc_through_beeline_with_an_api_key(endpoint: Endpoint) -> None:
    deadline = time.monotonic() + 30
    while True:  # the JDBC session's views are refreshed every few seconds
        out = _beeline(endpoint, endpoint.admin, "SELECT count(*) AS n FROM orders")
        assert out.returncode == 0, out.stderr[-3000:]
        # beeline echoes its prompt before the CSV header
        *_, header, value = [ln for ln in out.stdout.splitlines() if ln.strip()]
        assert header.endswith("> n") or header == "n", out.stdout
        if int(value) == endpoint.count("orders") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert int(value) == endpoint.count("orders")
    # JDBC's one shared session shows every topic: a principal that may not read them
    # all is turned away (it has Spark Connect), as is a call without a key. beeline
    # once, to see it reports the refusal; then the front's answers over plain HTTP.
    refused = _beeline(endpoint, endpoint.analyst, "SELECT count(*) FROM orders")
    assert refused.returncode != 0
    assert "HTTP Response code: 403" in refused.stdout + refused.stderr, \
        (refused.stdout + refused.stderr)[-2000:]
    front = f"http://127.0.0.1:{endpoint.jdbc_port}/cliservice"
    key_id, _, secret = endpoint.analyst.partition(":")
    denied = httpx.post(front, content=b"", auth=(key_id, secret), timeout=30)
    assert denied.status_code == 403
    assert "principal analyst may not consume topic " in denied.json()["message"]
    assert "use Spark Connect" in denied.json()["message"]
    anonymous = httpx.post(front, content=b"", timeout=30)
    assert anonymous.status_code == 401 and "an API key is needed" in anonymous.text
    wrong = httpx.post(front, content=b"", auth=(key_id, "wrong"), timeout=30)
    assert wrong.status_code == 401 and f"API key {key_id} is unknown" in wrong.text


def test_lakelog_sql_on_the_warm_endpoint_says_errors_in_one_line(endpoint: Endpoint) -> None:
    env = {**os.environ, "LAKELOG_API_KEY": endpoint.analyst}
    base = [LAKELOG, "sql", "--data-dir", str(endpoint.server.data_dir), "--connect",
            endpoint.url(None)]
    ok = subprocess.run([*base, "SELECT count(*) AS n FROM orders"], capture_output=True,
                        text=True, timeout=60, env=env)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert ok.stdout.splitlines()[0].strip() == "n" and ok.stdout.endswith("(1 row)\n")
    bad = subprocess.run([*base, "SELECT * FROM no_such_view"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert bad.returncode == 1
    assert bad.stderr.startswith("lakelog: error: SQL failed: [TABLE_OR_VIEW_NOT_FOUND]")
    assert len(bad.stderr.splitlines()) == 1, bad.stderr
    denied = subprocess.run([*base, "SELECT * FROM secret"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert denied.returncode == 1 and len(denied.stderr.splitlines()) == 1
    assert "principal analyst may not consume topic secret" in denied.stderr


def test_lakelog_sql_keeps_its_session_and_takes_a_new_one_once_it_is_closed(
        endpoint: Endpoint) -> None:
    url = endpoint.url(endpoint.admin)
    query(url, "CREATE OR REPLACE TEMP VIEW answer AS SELECT 42 AS n", 10)
    assert query(url, "SELECT n FROM answer", 10).to_pylist() == [{"n": 42}]  # same session
    _, session_id = stable_session(url)
    release(url, "admin", session_id)  # closed for good: Spark keeps its id as a tombstone
    with pytest.raises(LakelogError, match="TABLE_OR_VIEW_NOT_FOUND"):
        query(url, "SELECT n FROM answer", 10)  # answered, in a new session
    assert endpoint.count("orders") >= 1000


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_dead_spark_jvm_stops_the_endpoint_alone_and_says_why(endpoint: Endpoint) -> None:
    """Last in this file: it ends the module's endpoint. A query that exhausts the heap
    kills Spark's JVM; a SIGKILL of the JVM is that, for real."""
    state = read_state(endpoint.server.data_dir)
    assert state is not None and state["state"] == "ready"
    jvms = [c for c in _children(state["pid"])
            if b"java" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(jvms) == 1, jvms
    os.kill(jvms[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (state := read_state(endpoint.server.data_dir)) is None or \
            state["state"] != "failed":
        assert time.monotonic() < deadline, (state, endpoint.server.log())
        time.sleep(0.1)
    assert "Spark's JVM exited" in state["error"]
    deadline = time.monotonic() + 30
    while process_alive(state["pid"]):  # the endpoint's process leaves
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(LakelogError, match="SQL failed"):
        query(endpoint.url(endpoint.admin), "SELECT 1", 10)
    endpoint.produce("orders", 10, start=5000)  # the server goes on
    with endpoint.http(endpoint.admin) as admin:
        rows = admin.get(f"{endpoint.server.url}/ui/data").json()["broker"]["services"]
    sql = next(r for r in rows if r["name"] == "sql")
    assert sql["state"] == "failed" and "Spark's JVM exited" in sql["error"]
