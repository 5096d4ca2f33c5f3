"""The SQL endpoint of a real ``lakelog serve`` (API keys on): Spark Connect through
lakelog's front (the one-call client ``lakelog sql`` uses, and PySpark's own client in a
program of its own), JDBC through beeline, and the ACLs in front of both paths."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from lakelog.endpoint.client import query, release, stable_session
from lakelog.endpoint.state import read_state
from lakelog.local import free_port
from log_tables.errors import LakelogError
from tests.server import ServerProcess, process_alive

LAKELOG = Path(sys.executable).parent / "lakelog"
READY_S = 240.0
MAX_SESSIONS = 24

pytestmark = pytest.mark.slow


class Endpoint:
    def __init__(self, server: ServerProcess, port: int, jdbc_port: int) -> None:
        self.server, self.port, self.jdbc_port = server, port, jdbc_port
        self.admin = (server.data_dir / "security" / "admin.key").read_text().strip()
        self.analyst = ""
        self.first_sql: tuple[str, str] | None = None
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
        "LAKELOG_JDBC_PORT": str(jdbc_port), "LAKELOG_SQL_MASTER": "local[1]",
        "LAKELOG_SQL_MAX_SESSIONS": str(MAX_SESSIONS)}).start()
    ep = Endpoint(server, port, jdbc_port)
    first_sql: subprocess.Popen[str] | None = None
    try:
        # The first `lakelog sql` comes while the endpoint still starts its Spark: the
        # state file is the endpoint process's first act, Spark takes seconds after it.
        deadline = time.monotonic() + 60
        while (state := read_state(server.data_dir)) is None:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        ep.first_state = state["state"]
        first_sql = subprocess.Popen(
            [LAKELOG, "sql", "--data-dir", str(server.data_dir), "--json",
             "SELECT 6 * 7 AS n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "LAKELOG_API_KEY": ep.admin})
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
        ep.first_sql = first_sql.communicate(timeout=READY_S)
        yield ep
    finally:
        if first_sql is not None and first_sql.poll() is None:
            first_sql.kill()
        server.stop(timeout_s=90)


def test_lakelog_sql_waits_for_a_starting_endpoint_then_answers(endpoint: Endpoint) -> None:
    """Found by the data directory alone (no --connect): its address is in the state."""
    assert endpoint.first_state == "starting"
    assert endpoint.first_sql is not None
    stdout, stderr = endpoint.first_sql
    assert json.loads(stdout) == {"n": 42}, stderr
    assert stderr.startswith("lakelog: the SQL endpoint (pid "), stderr
    assert "is starting Spark; waiting for it..." in stderr


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
    with pytest.raises(LakelogError, match="an API key is needed"):
        query(endpoint.url(None), "SELECT 1", 10)
    key_id = endpoint.analyst.partition(":")[0]
    with pytest.raises(LakelogError, match=f"API key {key_id} is unknown or its secret"):
        query(endpoint.url(f"{key_id}:wrong"), "SELECT 1", 10)


QUERY_ONLY = "may only query"
REFUSED = [
    # writes and DDL, however they are spelled
    ("CREATE TABLE t USING parquet LOCATION '{out}'", QUERY_ONLY),
    ("FROM orders INSERT OVERWRITE DIRECTORY '{out}' USING parquet SELECT *", QUERY_ONLY),
    ("WITH a AS (SELECT * FROM orders) INSERT OVERWRITE DIRECTORY '{out}' USING parquet "
     "SELECT * FROM a", QUERY_ONLY),
    ("/* /* */ SELECT */ SET spark.sql.runSQLOnFiles=true", QUERY_ONLY),
    ("CACHE TABLE orders", QUERY_ONLY),
    ("BEGIN SELECT 1; END", QUERY_ONLY),
    ("SELECT TRANSFORM(value) USING 'touch {out}' AS (v) FROM orders", QUERY_ONLY),
    # reflection, named plainly or not
    ("SELECT reflect('java.lang.System', 'getenv', 'HOME')", "may not call Java methods"),
    ("SELECT `java_method`('java.lang.System', 'getenv', 'HOME')", "may not call Java methods"),
    ("SELECT IDENTIFIER('ref' || 'lect')('java.lang.System', 'getenv', 'HOME')",
     "may not use IDENTIFIER"),
    # other topics, files and other sessions' views
    ("SELECT * FROM IDENTIFIER('sec' || 'ret')", "may not use IDENTIFIER"),
    ("WITH a AS (SELECT * FROM secret) SELECT count(*) FROM a",
     "may not consume topic secret"),
    ("SELECT count(*) FROM orders WHERE key IN (SELECT key FROM SECRET)",
     "may not consume topic secret"),
    ("DESCRIBE secret", "may not consume topic secret"),
    ("SELECT * FROM parquet.`{table}`", "by their names alone, not parquet."),
    ("SELECT * FROM global_temp.shared", "may not use global_temp"),
    ("SELECT * FROM default.orders", "by their names alone, not default.orders"),
    ("SELECT * FROM read_files('{table}')", "may not call the table function read_files"),
    # Spark's own parse error, before anything runs
    ("SELECT count(*) FROM orders WHERE partition =", "PARSE_SYNTAX_ERROR"),
]


@pytest.mark.parametrize(("sql", "refusal"), REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_a_principal_without_admin_may_only_query_its_views(
        endpoint: Endpoint, tmp_path: Path, sql: str, refusal: str) -> None:
    """Checked on Spark's own parse: comments, quoting, CTEs and subqueries are read as
    Spark reads them. Nothing it refused ran: the directory it would write is absent."""
    out = tmp_path / "out"
    table = endpoint.server.data_dir / "warehouse" / "topics" / "secret"
    with pytest.raises(LakelogError, match=re.escape(refusal)):
        query(endpoint.url(endpoint.analyst), sql.format(out=out, table=table), 10)
    assert not out.exists()


ALLOWED = [
    # a string that happens to name a topic it may not consume names no table
    ("SELECT count(*) AS n FROM orders WHERE value = 'secret'", [{"n": 0}]),
    ("WITH a AS (SELECT partition, count(*) AS n FROM orders GROUP BY partition) "
     "SELECT sum(n) >= 1000 AS ok FROM a", [{"ok": True}]),
    ("SELECT max(n) >= 1 AS ok FROM (SELECT count(*) OVER (PARTITION BY partition) AS n "
     "FROM orders)", [{"ok": True}]),
    ("FROM orders |> WHERE partition = 0 |> AGGREGATE count(*) > 0 AS ok", [{"ok": True}]),
    ("SELECT count(*) AS n FROM orders WHERE EXISTS (SELECT 1 FROM partitions)",
     None),
    ("SELECT sum(id) AS n FROM range(4)", [{"n": 6}]),
    ("SELECT c FROM VALUES (1), (2) AS t(c) ORDER BY c LIMIT 1 OFFSET 1", [{"c": 2}]),
    ("SELECT explode(array(7)) AS x", [{"x": 7}]),
    ("SHOW COLUMNS IN orders", None),
    ("DESCRIBE consumer_lag", None),
    ("EXPLAIN SELECT * FROM orders", None),
]


@pytest.mark.parametrize(("sql", "rows"), ALLOWED, ids=[a[0][:40] for a in ALLOWED])
def test_queries_pass_the_check(endpoint: Endpoint, sql: str,
                                rows: list[dict[str, object]] | None) -> None:
    found = query(endpoint.url(endpoint.analyst), sql, 10).to_pylist()
    assert found if rows is None else found == rows


def test_an_acl_taken_away_takes_the_topic_out_of_open_sessions(endpoint: Endpoint) -> None:
    """A session keeps no view of a topic its principal may no longer consume: lakelog's
    view of it and the principal's own (which would read it) go. (The endpoint's process
    sees an ACL change within a second, as every broker does.)"""
    grant = {"principal": "analyst", "operation": "consume", "resource_type": "topic",
             "resource_name": "secret"}
    url = endpoint.url(endpoint.analyst)

    def secret_count() -> int | None:
        try:
            return endpoint.count("secret", endpoint.analyst)
        except LakelogError as exc:
            assert "principal analyst may not consume topic secret" in str(exc)
            return None

    with endpoint.http(endpoint.admin) as admin:
        assert admin.post("/acls", json=grant).status_code == 201
        try:
            deadline = time.monotonic() + 30
            while (found := secret_count()) is None:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert found == 10
            views = {r["viewName"] for r in query(url, "SHOW VIEWS", 100).to_pylist()}
            assert {"orders", "secret"} <= views
        finally:
            assert admin.post("/acls:delete", json=grant).status_code == 204
    deadline = time.monotonic() + 30
    while secret_count() is not None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    views = {r["viewName"] for r in query(url, "SHOW VIEWS", 100).to_pylist()}
    assert "orders" in views and "secret" not in views


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process ``pid`` (or a thread of it) listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_backends_take_calls_from_the_fronts_alone(endpoint: Endpoint) -> None:
    """Spark Connect's and the Thrift server's own loopback ports: a local process that
    finds them still gets nothing without the token or path only the fronts know."""
    from lakelog.endpoint.client import protos

    state = read_state(endpoint.server.data_dir)
    assert state is not None and state["state"] == "ready"
    jvm = next(c for c in _children(state["pid"])
               if b"java" in Path(f"/proc/{c}/cmdline").read_bytes())
    backends = _listening_ports(jvm) - {endpoint.port, endpoint.jdbc_port}
    assert len(backends) >= 2, backends  # Spark Connect's and the Thrift server's
    pb = protos()
    request = pb.ExecutePlanRequest(session_id=str(uuid.uuid4()),
                                    user_context=pb.UserContext(user_id="admin"))
    request.plan.root.sql.query = "SELECT count(*) FROM secret"
    answered = {}
    for port in backends:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
            call = chan.unary_stream("/spark.connect.SparkConnectService/ExecutePlan",
                                     request_serializer=pb.ExecutePlanRequest.SerializeToString,
                                     response_deserializer=pb.ExecutePlanResponse.FromString)
            try:
                list(call(request, timeout=30))
                answered[port] = "rows"
            except grpc.RpcError as exc:
                answered[port] = f"grpc {exc.code()}: {exc.details()}"
        if answered[port].startswith("grpc StatusCode.UNAVAILABLE"):  # not gRPC: HTTP?
            try:
                http = httpx.post(f"http://127.0.0.1:{port}/cliservice", content=b"",
                                  auth=("admin", "x"), timeout=30)
                answered[port] = f"http {http.status_code}"
            except httpx.HTTPError as exc:  # neither (Spark's own RPC, py4j's gateway)
                answered[port] = f"other: {exc!r}"
    assert "rows" not in answered.values(), answered
    assert any("UNAUTHENTICATED" in a for a in answered.values()), answered  # Spark Connect
    # the Thrift server: nothing at the path clients know (it serves another)
    assert {"http 404", "http 405"} & set(answered.values()), answered
    assert not any(a.startswith("http 2") for a in answered.values()), answered


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def test_a_call_without_a_valid_key_is_refused_before_its_message_is_read(
        endpoint: Endpoint) -> None:
    """Eight calls of 100 MiB each with a wrong key, or none: each is refused
    (UNAUTHENTICATED) and the front's peak memory barely moves. It used to read each
    message (up to 128 MiB) before it looked at the key (issue 35)."""
    state = read_state(endpoint.server.data_dir)
    assert state is not None and state["state"] == "ready"
    front = int(state["pid"])
    Path(f"/proc/{front}/clear_refs").write_text("5")  # the peak starts again from now
    before = _peak_rss_mib(front)
    big = b"\x0a" * (100 << 20)
    keys = [[("authorization", "Bearer llk_nope.wrong")], [], [("authorization", "Basic !")]]
    with grpc.insecure_channel(f"127.0.0.1:{endpoint.port}",
                               options=[("grpc.max_send_message_length", -1)]) as chan:
        call = chan.unary_unary("/spark.connect.SparkConnectService/AnalyzePlan")
        started = time.monotonic()
        futures = [call.future(big, metadata=keys[i % 3], timeout=120) for i in range(8)]
        codes = []
        for future in futures:
            error = future.exception()
            assert isinstance(error, grpc.Call), error
            codes.append(error.code())
        took = time.monotonic() - started
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 8, codes
    grew = _peak_rss_mib(front) - before
    assert grew < 64, f"the front's peak memory grew {grew:.0f} MiB for refused calls"
    # A valid key is still let in.
    answer = query(endpoint.url(endpoint.admin), "SELECT 6 * 7 AS n", 10)
    assert answer.column("n")[0].as_py() == 42, took


PROGRAM = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    orders = spark.table("orders")
    out = {"count": orders.count(),
           "per_partition": sorted(r["n"] for r in orders.groupBy("partition")
                                   .agg(F.count("*").alias("n")).collect()),
           "views": sorted(r["viewName"] for r in spark.sql("SHOW VIEWS").collect())}
    # The backends' secrets are in no setting a session can read.
    out["secrets"] = [spark.conf.get(k, "") or "" for k in (
        "spark.connect.authenticate.token", "hive.server2.thrift.http.path")]
    orders.where("partition = 0").createOrReplaceTempView("mine")
    out["mine"] = spark.sql("SELECT count(*) AS n FROM mine").collect()[0]["n"]
    tries = {
        "direct_read": lambda: spark.read.parquet(sys.argv[2]).count(),
        "select_expr": lambda: orders.selectExpr("reflect('java.lang.System', 'getenv', "
                                                 "'HOME')").collect(),
        "call_function": lambda: orders.select(F.call_function(
            "java_method", F.lit("java.lang.System"), F.lit("getenv"), F.lit("HOME"))).collect(),
        "subquery_expr": lambda: spark.range(1).selectExpr(
            "(SELECT count(*) FROM secret) AS n").collect(),
        "global_table": lambda: spark.table("global_temp.shared").count(),
        "global_view": lambda: orders.createGlobalTempView("shared"),
        "replace_view": lambda: orders.createOrReplaceTempView("secret"),
        "clear_cache": lambda: spark.catalog.clearCache(),
        "set_conf": lambda: spark.conf.set("spark.sql.runSQLOnFiles", "true"),
    }
    from pyspark.ml.feature import SQLTransformer
    from pyspark.sql.connect.proto import commands_pb2

    def add_listener():
        command = commands_pb2.Command()
        listener = command.streaming_query_manager_command.add_listener
        listener.python_listener_payload.command = b"not run"
        listener.id = "x"
        spark.client.execute_command(command)

    def persisted():
        cached = orders.limit(1)
        cached.persist()
        cached.count()

    tries.update({
        "ml_sql": lambda: SQLTransformer(statement="SET spark.sql.runSQLOnFiles=true")
            .transform(spark.range(1)).collect(),
        "listener": add_listener,
        "builtin_reflect": lambda: spark.range(1).select(F.call_function(
            "system.builtin.reflect", F.lit("java.lang.System"), F.lit("getProperty"),
            F.lit("user.name"))).collect(),
        "window_clause": lambda: spark.sql(
            "SELECT count(*) OVER w FROM (SELECT 1 AS x) WINDOW w AS (PARTITION BY "
            "raise_error(java_method('java.lang.System', 'getenv', 'HOME')))").collect(),
        "window_secret": lambda: spark.sql(
            "SELECT count(*) OVER w FROM (SELECT 1 AS x) WINDOW w AS (PARTITION BY "
            "(SELECT max(offset) FROM secret))").collect(),
        "persist": persisted,
        "list_global": lambda: spark.catalog.listTables("global_temp"),
        "spaced_view": lambda: orders.createOrReplaceTempView(" orders"),
    })
    for name, attempt in tries.items():
        try:
            attempt()
            out[name] = "allowed"
        except Exception as exc:
            out[name] = str(exc)
    print(json.dumps(out))
""")


def test_a_pyspark_program_connects_with_builder_remote(endpoint: Endpoint,
                                                         tmp_path: Path) -> None:
    """PySpark's own client, the DataFrame API's ways around the check included."""
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
    assert 0 < found["mine"] < found["count"]  # a view of its own, over its views
    assert not any(re.fullmatch("[0-9a-f]{64}", v) for v in found["secrets"]), found["secrets"]
    who = "principal analyst may not"
    refusals = {
        "direct_read": f"{who} read files or data sources directly",
        "select_expr": f"{who} call Java methods", "call_function": f"{who} call Java methods",
        "subquery_expr": f"{who} consume topic secret",
        "global_table": f"{who} use global_temp",
        "global_view": f"{who} create global views",
        "replace_view": f"{who} replace or drop lakelog's view secret",
        "clear_cache": f"{who} call catalog.clear_cache",
        "set_conf": f"{who} change the session's settings",
        "ml_sql": f"{who} use ML", "listener": f"{who} manage streaming queries",
        "builtin_reflect": f"{who} call Java methods",
        "window_clause": f"{who} call Java methods",
        "window_secret": f"{who} consume topic secret",
        "persist": f"{who} cache", "list_global": f"{who} use global_temp",
        "spaced_view": f"{who} replace or drop lakelog's view  orders"}
    for attempt, refusal in refusals.items():
        assert refusal in found[attempt], (attempt, found[attempt])


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
    # JDBC's one shared session shows every topic and runs any statement: a principal
    # without cluster admin is turned away (it has Spark Connect), as is a call without
    # a key. beeline once, to see it reports the refusal; then the front's answers over
    # plain HTTP.
    refused = _beeline(endpoint, endpoint.analyst, "SELECT count(*) FROM orders")
    assert refused.returncode != 0
    assert "HTTP Response code: 403" in refused.stdout + refused.stderr, \
        (refused.stdout + refused.stderr)[-2000:]
    front = f"http://127.0.0.1:{endpoint.jdbc_port}/cliservice"
    key_id, _, secret = endpoint.analyst.partition(":")
    denied = httpx.post(front, content=b"", auth=(key_id, secret), timeout=30)
    assert denied.status_code == 403
    assert "principal analyst may not use JDBC" in denied.json()["message"]
    assert "needs cluster admin" in denied.json()["message"]
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


def _server_session(url: str, session_id: str) -> str:
    """The endpoint's own id of the Spark Connect session ``session_id`` is now (a new one
    when the session was closed and made again)."""
    from lakelog.endpoint.client import channel, protos

    pb = protos()
    chan, _ = channel(url)
    request = pb.ExecutePlanRequest(session_id=session_id,
                                    user_context=pb.UserContext(user_id="any"))
    request.plan.root.sql.query = "SELECT 1"
    try:
        call = chan.unary_stream("/spark.connect.SparkConnectService/ExecutePlan",
                                 request_serializer=pb.ExecutePlanRequest.SerializeToString,
                                 response_deserializer=pb.ExecutePlanResponse.FromString)
        return str(next(iter(call(request, timeout=30))).server_side_session_id)
    finally:
        chan.close()


def test_sessions_beyond_the_bound_are_closed_least_recently_used_first(
        endpoint: Endpoint) -> None:
    """Per principal: the admin's sessions beyond the bound close the admin's oldest,
    never the analyst's."""
    url, analyst = endpoint.url(endpoint.admin), endpoint.url(endpoint.analyst)
    theirs = str(uuid.uuid4())
    before = _server_session(analyst, theirs)
    first = str(uuid.uuid4())
    query(url, "CREATE OR REPLACE TEMP VIEW mark AS SELECT 1 AS n", 10, session_id=first)
    assert query(url, "SELECT n FROM mark", 10, session_id=first).to_pylist() == [{"n": 1}]
    for _ in range(MAX_SESSIONS):
        assert query(url, "SELECT 1 AS one", 10, session_id=str(uuid.uuid4())).num_rows == 1
    # Closed in Spark, its id allowed back: a new, empty session.
    with pytest.raises(LakelogError, match="TABLE_OR_VIEW_NOT_FOUND"):
        query(url, "SELECT n FROM mark", 10, session_id=first)
    assert _server_session(analyst, theirs) == before


def test_one_principal_holds_at_most_its_share_of_the_front() -> None:
    """The count of a principal's open calls (without a server: what a call that would
    wait on Spark does to it is the same)."""
    import threading
    from types import SimpleNamespace

    from lakelog.endpoint.front import MAX_CALLS_PER_PRINCIPAL, Caller, ConnectFront, Denied

    front = SimpleNamespace(_calls={}, _calls_lock=threading.Lock())
    analyst, admin = Caller("analyst", False), Caller("admin", True)
    with contextlib.ExitStack() as open_calls:
        for _ in range(MAX_CALLS_PER_PRINCIPAL):
            open_calls.enter_context(ConnectFront._slot(front, analyst))  # type: ignore[arg-type]
        with pytest.raises(Denied, match="principal analyst has 16 calls open"):
            open_calls.enter_context(ConnectFront._slot(front, analyst))  # type: ignore[arg-type]
        with ConnectFront._slot(front, admin):  # type: ignore[arg-type]
            assert front._calls == {"analyst": MAX_CALLS_PER_PRINCIPAL, "admin": 1}
    assert front._calls == {}


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


def test_a_dead_spark_jvm_stops_the_endpoint_alone_says_why_and_comes_back(
        endpoint: Endpoint) -> None:
    """Last in this file. A query that exhausts the heap kills Spark's JVM; a SIGKILL of
    the JVM is that, for real. The endpoint says why and leaves; the server goes on and
    starts it again."""
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
    failed_pid = state["pid"]
    deadline = time.monotonic() + 30
    while process_alive(failed_pid):  # the endpoint's process leaves
        assert time.monotonic() < deadline
        time.sleep(0.1)
    endpoint.produce("orders", 10, start=5000)  # the server goes on
    # ... and starts the endpoint again (5 s later, then its Spark's start).
    deadline = time.monotonic() + READY_S
    while (state := read_state(endpoint.server.data_dir)) is None or \
            state["state"] != "ready" or state["pid"] == failed_pid:
        assert time.monotonic() < deadline, (state, endpoint.server.log())
        time.sleep(0.2)
    assert endpoint.count("orders") >= 1010
    with endpoint.http(endpoint.admin) as admin:
        rows = admin.get(f"{endpoint.server.url}/ui/data").json()["broker"]["services"]
    sql = next(r for r in rows if r["name"] == "sql")
    assert sql["state"] == "ready" and sql["restarts"] == 1
    assert f"the SQL endpoint (pid {failed_pid}) exited" in \
        endpoint.server.log_path.read_text(errors="replace")
