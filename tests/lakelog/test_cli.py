from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from log_tables.hot.partition_log import PartitionLog
from tests.log_tables.helpers import append_n

LAKELOG = Path(sys.executable).parent / "lakelog"


def test_version_and_help() -> None:
    out = subprocess.run([LAKELOG, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("lakelog ")
    out = subprocess.run([LAKELOG, "--help"], capture_output=True, text=True, check=True)
    assert "dump-log" in out.stdout


def test_dump_log_shows_batches_and_a_torn_tail(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "p")
    append_n(plog, 5, per_batch=2)
    path = plog.active_segment.path
    plog.close()
    with path.open("ab") as f:
        f.write(b"\x01" * 30)
    out = subprocess.run([LAKELOG, "dump-log", "--records", str(tmp_path / "p")],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("baseOffset:") == 3 and out.count("| offset:") == 5
    assert "stop at position" in out and "30 bytes not readable" in out


def test_dump_log_bad_path_is_one_line_on_stderr(tmp_path: Path) -> None:
    out = subprocess.run([LAKELOG, "dump-log", str(tmp_path / "nope.txt")], capture_output=True,
                         text=True)
    assert out.returncode == 1
    assert out.stderr.strip().startswith("lakelog: error:") and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_jobs_tier_and_sql(tmp_path: Path) -> None:
    from log_tables.hot.log_manager import LogManager
    from tests.compaction_jobs.helpers import produce

    manager = LogManager(tmp_path / "data")
    manager.create_topic("clicks", 2)
    for p in range(2):
        produce(manager, "clicks", p, 30, roll_every=10)
    manager.close()
    env = {**os.environ, "LAKELOG_DATA_DIR": str(tmp_path / "data"),
           "LAKELOG_SPARK_MASTER": "local[1]"}
    tiered = subprocess.run([LAKELOG, "jobs", "tier", "--topic", "clicks"], env=env,
                            capture_output=True, text=True, timeout=180)
    assert tiered.returncode == 0, tiered.stderr[-2000:]
    assert "tiered 60 records" in tiered.stdout
    out = subprocess.run(
        [LAKELOG, "sql", "--json",
         "SELECT p.partition, p.tiered_offset, count(c.offset) AS n FROM partitions p "
         "JOIN clicks c ON c.partition = p.partition GROUP BY p.partition, p.tiered_offset "
         "ORDER BY p.partition"], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"partition": 0, "tiered_offset": 30, "n": 30},
                    {"partition": 1, "tiered_offset": 30, "n": 30}]
    bad = subprocess.run([LAKELOG, "sql", "SELECT * FROM no_such_view"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert bad.returncode == 1
    # The error is one line: no Java stack trace, no Spark start-up noise (that is in
    # Spark's log). Before it, the progress: no endpoint, so Spark starts here.
    starting, started, error = bad.stderr.splitlines()
    # (Its data directory's server runs none: an endpoint of another server on this
    # machine, on 15002 or anywhere, is not asked.)
    assert starting.startswith("lakelog: no SQL endpoint runs for "), starting
    assert re.fullmatch(r"lakelog: Spark started in \d+ s", started), started
    assert error.startswith("lakelog: error: SQL failed: [TABLE_OR_VIEW_NOT_FOUND]")
    assert "no_such_view" in error and "Spark's log: " in error


@pytest.mark.slow
def test_jobs_all_dry_run_then_for_real(tmp_path: Path) -> None:
    from log_tables.hot.log_manager import LogManager
    from log_tables.records import build_batch

    manager = LogManager(tmp_path / "data")
    manager.create_topic("state", 1, {"cleanup.policy": "compact"})
    manager.create_topic("old", 1, {"retention.ms": "60000"})
    for topic in ("state", "old"):
        plog = manager.log(topic, 0)
        for i in range(40):  # 4 keys, 10 updates; timestamps in 2023: past any retention
            plog.append(build_batch([b"v%d" % i], keys=[b"k%d" % (i % 4)],
                                    timestamps=[1_700_000_000_000 + i]))
            if i % 10 == 9:
                plog.roll()
    manager.close()
    env = {**os.environ, "LAKELOG_DATA_DIR": str(tmp_path / "data"),
           "LAKELOG_SPARK_MASTER": "local[1]"}

    def lakelog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([LAKELOG, *args], env=env, capture_output=True, text=True,
                              timeout=240)

    tier = lakelog("jobs", "tier")
    assert tier.returncode == 0, tier.stderr[-2000:]
    dry = lakelog("jobs", "all", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "would delete old-0 below offset 40" in dry.stderr
    assert "would compact state-0 offsets 0..39: 4 file(s), 40 records" in dry.stderr
    real = lakelog("jobs", "all")
    assert real.returncode == 0, real.stderr[-2000:]
    assert "compact: 1 partition run(s), records 40 -> 4" in real.stdout
    out = lakelog("sql", "--json", "SELECT job, status, sum(records_in) AS n FROM job_runs "
                  "WHERE job IN ('retention', 'compact') GROUP BY job, status ORDER BY job, status")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"job": "compact", "status": "dry_run", "n": 40},
        {"job": "compact", "status": "succeeded", "n": 40},
        {"job": "retention", "status": "dry_run", "n": 40},
        {"job": "retention", "status": "succeeded", "n": 40}]
    bad = lakelog("delete-records", "old", "--before", "zero=1")
    assert bad.returncode == 1 and "PARTITION=OFFSET" in bad.stderr


def _describe(out: str) -> list[dict[str, str]]:
    """The rows of ``groups describe`` by column name (line 0 is the group's summary)."""
    header, *rows = (line.split() for line in out.splitlines()[1:])
    return [dict(zip(header, row, strict=True)) for row in rows]


def test_groups_describe_reset_delete_and_lag_in_sql(tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data").start()
    env = {**os.environ, "LAKELOG_URL": server.url}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([LAKELOG, *args], capture_output=True, text=True, env=env)
        assert not check or out.returncode == 0, out.stderr
        return out

    try:
        with server.client() as c:
            c.post("/topics", json={"topic_name": "orders", "partitions_count": 2})
            for p in range(2):
                c.post("/topics/orders/records:batch", json={"entries": [
                    {"id": str(i), "partition_id": p, "value": {"type": "STRING", "data": "x"}}
                    for i in range(10)]})
            assert c.post("/consumer-groups/billing/offsets", json={"offsets": [
                {"topic_name": "orders", "partition_id": 0, "offset": 4}]}).status_code == 200
        assert "billing\tEmpty" in run("groups", "list").stdout
        # Every partition of the topic, as kafka-consumer-groups --describe: partition 1 has
        # no committed offset (-) and all of it is lag.
        described = run("groups", "describe", "billing").stdout.splitlines()
        assert [line.split() for line in described[1:]] == [
            ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
             "CONSUMER-ID"],
            ["billing", "orders", "0", "4", "10", "6", "-"],
            ["billing", "orders", "1", "-", "10", "10", "-"]]
        dry = run("groups", "reset-offsets", "billing", "--to-earliest")
        assert [line.split() for line in dry.stdout.splitlines()] == [  # Kafka's table
            ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], ["billing", "orders", "0", "0"],
            ["billing", "orders", "1", "0"]] and "dry run" in dry.stderr
        assert _describe(run("groups", "describe", "billing").stdout)[0]["CURRENT-OFFSET"] == "4"
        run("groups", "reset-offsets", "billing", "--to-offset", "7", "--execute")
        bad = run("groups", "reset-offsets", "billing", check=False)
        assert bad.returncode == 1 and "exactly one of" in bad.stderr
        # One query for both views: each `lakelog sql` here starts a Spark (no endpoint).
        lag = run("sql", "--json", "--data-dir", str(tmp_path / "data"),
                  "SELECT l.`group`, l.topic, l.partition, l.committed_offset, l.lag, g.total_lag "
                  "FROM consumer_lag l JOIN consumer_group_lag g ON g.`group` = l.`group` "
                  "ORDER BY l.partition")
        assert [json.loads(line) for line in lag.stdout.splitlines()] == [
            {"group": "billing", "topic": "orders", "partition": p, "committed_offset": 7,
             "lag": 3, "total_lag": 6} for p in range(2)]
        run("groups", "delete", "billing")
        gone = run("groups", "describe", "billing", check=False)
        assert gone.returncode == 1 and "does not exist" in gone.stderr
    finally:
        server.stop()


def test_topics_produce_and_consume_from_the_command_line(tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data").start()
    env = {**os.environ, "LAKELOG_URL": server.url}

    def run(*args: str, stdin: str | None = None, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([LAKELOG, *args], capture_output=True, text=True, env=env,
                             input=stdin)
        assert not check or out.returncode == 0, out.stderr
        return out

    try:
        run("topics", "create", "clicks", "--partitions", "3", "--config", "retention.ms=60000")
        assert run("topics", "list").stdout.split() == ["clicks", "partitions=3"]
        run("topics", "alter", "clicks", "--partitions", "4", "--config",
            "cleanup.policy=compact", "--delete-config", "retention.ms")
        described = run("topics", "describe", "clicks").stdout
        assert "4 partition(s)" in described and "cleanup.policy=compact" in described
        assert "retention.ms" not in described
        lines = "".join(f"user-{i % 7}:click {i}\n" for i in range(250))
        produced = run("produce", "clicks", "--separator", ":", stdin=lines)
        assert "250 records produced to clicks" in produced.stderr
        out = run("consume", "clicks", "--from-beginning", "--max", "250", "--print-key").stdout
        rows = [line.split("\t") for line in out.splitlines()]
        assert sorted(v for _, v in rows) == sorted(f"click {i}" for i in range(250))
        assert all(k == f"user-{int(v.split()[1]) % 7}" for k, v in rows)  # KEY:VALUE split
        grouped = run("consume", "clicks", "--group", "cli", "--from-beginning",
                      "--timeout-ms", "3000").stdout.splitlines()
        assert len(grouped) == 250
        # The group committed on close: its lag is zero.
        assert all(row["LAG"] == "0" for row in _describe(run("groups", "describe", "cli").stdout))
        # --max N in a group commits exactly the N records printed; the rest come next time.
        first = run("consume", "clicks", "--group", "part", "--from-beginning", "--max", "100")
        assert len(first.stdout.splitlines()) == 100
        committed = [row["CURRENT-OFFSET"] for row in
                     _describe(run("groups", "describe", "part").stdout)]
        assert sum(int(c) for c in committed if c != "-") == 100
        rest = run("consume", "clicks", "--group", "part", "--from-beginning", "--timeout-ms",
                   "3000")  # --from-beginning: for partitions without a committed offset
        assert sorted(first.stdout.splitlines() + rest.stdout.splitlines()) == sorted(
            f"click {i}" for i in range(250))
        bad = run("topics", "create", "clicks", check=False)
        assert bad.returncode == 1 and bad.stderr.startswith("lakelog: error: 400")
        bad = run("produce", "nope", stdin="x\n", check=False)
        assert bad.returncode == 1 and "nope" in bad.stderr
        run("topics", "delete", "clicks")
        assert run("topics", "list").stdout == ""
    finally:
        server.stop()


def test_every_command_has_help_and_usage_errors_exit_2() -> None:
    import typer.main
    from typer.testing import CliRunner

    from lakelog.cli import app

    root = typer.main.get_command(app)
    runner = CliRunner()

    def walk(cmd: Any, path: list[str]) -> list[list[str]]:  # typer's (vendored) click
        subs = getattr(cmd, "commands", {})
        return [path] + [p for name, sub in subs.items() for p in walk(sub, [*path, name])]

    paths = walk(root, [])
    assert ["topics", "create"] in paths and ["groups", "reset-offsets"] in paths
    assert ["jobs", "tier"] in paths and ["sql"] in paths and ["serve"] in paths
    for path in paths:
        out = runner.invoke(app, [*path, "--help"])
        assert out.exit_code == 0, (path, out.output)
        assert "Usage:" in out.output and len(out.output.splitlines()) > 4, path
    assert runner.invoke(app, ["topics", "create"]).exit_code == 2  # missing argument
    assert runner.invoke(app, ["consume", "t", "--no-such-flag"]).exit_code == 2


def test_keys_and_acls_from_the_command_line(tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data", env={"LAKELOG_AUTH": "api-key"}).start()
    # The CLI finds the admin key the server wrote in its data directory.
    env = {**os.environ, "LAKELOG_URL": server.url, "LAKELOG_DATA_DIR": str(server.data_dir)}
    env.pop("LAKELOG_API_KEY", None)

    def run(*args: str, stdin: str | None = None, check: bool = True, **extra: str
            ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([LAKELOG, *args], capture_output=True, text=True,
                             env={**env, **extra}, input=stdin)
        assert not check or out.returncode == 0, out.stderr
        return out

    try:
        run("topics", "create", "orders")
        alice = run("keys", "create", "alice").stdout.strip()
        assert re.fullmatch(r"llk_[0-9a-f]{16}:[A-Za-z0-9_-]{40,}", alice)
        assert "alice" in run("keys", "list").stdout and alice.split(":")[1] not in run(
            "keys", "list").stdout
        run("acls", "add", "--principal", "alice", "--operation", "produce", "--topic", "ord",
            "--prefix")
        assert run("acls", "list", "--principal", "alice").stdout.split() == [
            "alice", "produce", "topic:ord*"]
        produced = run("--api-key", alice, "produce", "orders", stdin="a\nb\n")
        assert "2 records produced" in produced.stderr
        denied = run("--api-key", alice, "topics", "create", "mine", check=False)
        assert denied.returncode == 1 and "403" in denied.stderr
        assert denied.stderr.count("\n") == 1 and alice.split(":")[1] not in denied.stderr
        nobody = run("topics", "list", check=False, LAKELOG_DATA_DIR=str(tmp_path / "none"))
        assert nobody.returncode == 1 and "401" in nobody.stderr
        run("acls", "remove", "--principal", "alice", "--operation", "produce", "--topic", "ord",
            "--prefix")
        gone = run("--api-key", alice, "produce", "orders", stdin="c\n", check=False)
        assert gone.returncode == 1
        bad = run("acls", "add", "--principal", "alice", "--operation", "produce", check=False)
        assert bad.returncode == 1 and "exactly one of" in bad.stderr
    finally:
        server.stop()


def _cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI run: no key, url or profile from the developer's own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LAKELOG_API_KEY", "LAKELOG_URL", "LAKELOG_DATA_DIR")}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "LAKELOG_DATA_DIR": str(tmp_path / "no-data-dir"), **extra}


def _lakelog(env: dict[str, str], *args: str, stdin: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAKELOG, *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=timeout)


def test_kafka_spellings_of_produce_and_consume(tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data").start()
    env = _cli_env(tmp_path)
    where = ["--bootstrap-server", f"127.0.0.1:{server.port}"]  # host:port, as Kafka's

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        out = _lakelog(env, *args, *where, stdin=stdin)
        assert out.returncode == 0, out.stderr
        return out

    try:
        run("topics", "create", "t", "--partitions", "2")
        produced = run("produce", "--topic", "t", "--property", "parse.key=true",
                       "--property", "key.separator=,", stdin="k1,v1\nk2,v,2\nk3,\n")
        assert "3 records produced to t" in produced.stderr
        out = run("consume", "--topic", "t", "--from-beginning", "--max-messages", "3",
                  "--property", "print.key=true", "--property", "key.separator=:")
        assert sorted(out.stdout.splitlines()) == ["k1:v1", "k2:v,2", "k3:"]
        out = run("consume", "t", "--from-beginning", "--max-messages", "3", "--property",
                  "print.partition=true", "--property", "print.offset=true", "--property",
                  "print.timestamp=true")
        cells = [line.split("\t") for line in out.stdout.splitlines()]
        assert sorted(c[3] for c in cells) == ["", "v,2", "v1"]
        assert all(c[0].startswith("CreateTime:") and int(c[0].split(":")[1]) > 1.7e12
                   and c[1] in ("Partition:0", "Partition:1") and c[2].startswith("Offset:")
                   for c in cells), cells
        # As kafka-console-producer: a line without the separator is an error; the lines
        # before it are produced, the ones after it are not.
        bad = _lakelog(env, "produce", "t", *where, "--property", "parse.key=true",
                       "--property", "key.separator=,", stdin="k4,v4\nno separator\nk5,v5\n")
        assert bad.returncode == 1
        assert bad.stderr.splitlines()[-1] == (
            "lakelog: error: line 2 has no key separator ',': 'no separator' (each line is "
            "KEY,VALUE)")
        assert "1 records produced to t" in bad.stderr
        values = run("consume", "t", "--from-beginning", "--timeout-ms", "2000").stdout
        assert sorted(values.splitlines()) == ["", "v,2", "v1", "v4"]
        unknown = _lakelog(env, "consume", "t", *where, "--property", "print.nothing=true")
        assert unknown.returncode == 1 and len(unknown.stderr.splitlines()) == 1
        assert "print.nothing: not supported here" in unknown.stderr
        both = _lakelog(env, "consume", "t", "--topic", "u", *where)
        assert both.returncode == 1 and "give one" in both.stderr
    finally:
        server.stop()


def test_a_group_consume_prints_what_a_direct_read_prints(server: Any, tmp_path: Path) -> None:
    """``consume --group`` formats each Arrow answer in bulk (issue 35): its lines are the
    direct read's (the JSON path, record by record), nulls and empty values included;
    a value that is not UTF-8 is printed as before, record by record."""
    import base64

    from tests.lakelog.helpers import make_topic

    make_topic(server, "mixed", 2)
    entries = [{"id": str(i), "partition_id": i % 2,
                **({"key": {"type": "STRING", "data": f"k{i}"}} if i % 3 else {}),
                "value": None if i % 5 == 4 else {"type": "STRING", "data": f"v {i}" * (i % 4)}}
               for i in range(40)]
    with server.client() as c:
        r = c.post("/topics/mixed/records:batch", json={"entries": entries})
        assert r.status_code == 207 and not r.json()["failures"], r.text
    env = _cli_env(tmp_path, LAKELOG_URL=server.url)
    props = ["--property", "print.key=true", "--property", "print.partition=true",
             "--property", "print.offset=true", "--property", "print.timestamp=true",
             "--property", "key.separator=|"]
    direct = _lakelog(env, "consume", "mixed", "--from-beginning", "--max-messages", "40",
                      *props)
    grouped = _lakelog(env, "consume", "mixed", "--group", "printer", "--from-beginning",
                       "--max-messages", "40", *props)
    assert direct.returncode == 0 and grouped.returncode == 0, (direct.stderr, grouped.stderr)
    assert len(grouped.stdout.splitlines()) == 40
    assert sorted(grouped.stdout.splitlines()) == sorted(direct.stdout.splitlines())
    assert "|null|" in grouped.stdout and grouped.stdout.count("|null\n") == 8
    with server.client() as c:
        binary = base64.b64encode(b"\xff\x00").decode()
        r = c.post("/topics/mixed/records", json={"partition_id": 0, "value": {
            "type": "BINARY", "data": binary}})
        assert r.status_code == 200, r.text
    tail = _lakelog(env, "consume", "mixed", "--group", "printer", "--max-messages", "1",
                    "--timeout-ms", "20000")
    assert tail.stdout == "b'\\xff\\x00'\n", tail.stdout


def test_consuming_a_topic_that_does_not_exist_is_an_error(server: Any, tmp_path: Path) -> None:
    env = _cli_env(tmp_path, LAKELOG_URL=server.url)
    for args in (["consume", "nope", "--timeout-ms", "1000"],
                 ["consume", "--topic", "nope", "--group", "g", "--timeout-ms", "1000"]):
        out = _lakelog(env, *args)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr == "lakelog: error: 404: topic 'nope' does not exist\n", out.stderr


def test_produce_says_why_records_failed_and_the_rest_are_stored(
        server: Any, tmp_path: Path) -> None:
    """A record over max.message.bytes fails with its reason, counted per error code;
    the lines around it are stored (before, every line after it failed too, as
    out_of_order_sequence, and the CLI printed only a count)."""
    from tests.lakelog.helpers import make_topic, values

    make_topic(server, "t", 1, **{"max.message.bytes": "4096"})
    env = _cli_env(tmp_path, LAKELOG_URL=server.url)
    lines = [("x" * 5000 if i in (3, 7, 8) else f"line {i}") for i in range(20)]
    out = _lakelog(env, "produce", "t", stdin="".join(line + "\n" for line in lines))
    assert out.returncode == 1
    report = out.stderr.splitlines()
    assert report[0] == "17 records produced to t, 3 failed:", out.stderr
    assert report[1].startswith("  3 x record_too_large (41301): record ")
    assert "max.message.bytes=4096" in report[1] and len(report) == 2
    assert values(server, "t", 0) == [line for line in lines if not line.startswith("x")]


def test_with_the_server_down_a_command_fails_in_one_line(tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data").start()
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t"}).raise_for_status()
    server.kill()
    env = _cli_env(tmp_path, LAKELOG_URL=server.url, LAKELOG_RETRY_TIMEOUT_MS="1500")
    for args in (["produce", "t"], ["consume", "t"], ["consume", "t", "--group", "g"],
                 ["topics", "list"], ["groups", "describe", "g"]):
        out = _lakelog(env, *args, stdin="x\n")
        assert out.returncode == 1, (args, out.stderr)
        assert len(out.stderr.splitlines()) == 1, (args, out.stderr)
        assert out.stderr.startswith("lakelog: error: "), (args, out.stderr)
        assert server.url in out.stderr and "--retry-timeout-ms=1500" in out.stderr
        assert "Connection refused" in out.stderr, (args, out.stderr)


def test_with_no_server_running_a_command_says_so_at_once(tmp_path: Path) -> None:
    """Nothing listens: every connection is refused. The command names the URL and how
    to start a server within 2 s, not after --retry-timeout-ms (issue 35)."""
    from tests.ports import free_port

    url = f"http://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    env = _cli_env(tmp_path, LAKELOG_URL=url)
    env.pop("LAKELOG_RETRY_TIMEOUT_MS", None)
    for args in (["topics", "list"], ["produce", "t"], ["groups", "describe", "g"]):
        started = time.monotonic()
        out = _lakelog(env, *args, stdin="x\n")
        took = time.monotonic() - started
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1, out.stderr
        assert "no server at http://127.0.0.1:" in out.stderr, out.stderr
        assert "connection was refused" in out.stderr and "lakelog serve" in out.stderr
        # The CLI's own start (Python, imports) comes on top of its 1.2 s of trying; the
        # margin is for a loaded machine. Before, it retried for 30 s.
        assert took < 1.2 + startup_s(env) + 3, (args, took)


def startup_s(env: dict[str, str]) -> float:
    """How long ``lakelog --version`` takes here: the CLI's start, not its waiting."""
    started = time.monotonic()
    assert _lakelog(env, "--version").returncode == 0
    return time.monotonic() - started


def test_produce_rides_through_a_server_restart(tmp_path: Path) -> None:
    """The server is down when `lakelog produce` starts and comes back two seconds
    later: the command waits for it (within --retry-timeout-ms) and succeeds."""
    from tests.lakelog.helpers import values
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data").start()
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t"}).raise_for_status()
    server.kill()
    # A user who waits for a server that is starting says how long (else the command
    # says at once that nothing runs there: the test below).
    env = _cli_env(tmp_path, LAKELOG_URL=server.url, LAKELOG_RETRY_TIMEOUT_MS="60000")
    proc = subprocess.Popen([LAKELOG, "produce", "t"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        while time.monotonic() - started < 2:  # injected outage of two seconds
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        server.start()
        _, err = proc.communicate("".join(f"r{i}\n" for i in range(100)), timeout=120)
        assert proc.returncode == 0, err
        assert err == "100 records produced to t\n"
        assert values(server, "t", 0) == [f"r{i}" for i in range(100)]
    finally:
        if proc.poll() is None:
            proc.kill()
        server.kill()


def test_a_401_says_where_the_cli_looked_and_a_profile_gives_url_and_key(
        tmp_path: Path) -> None:
    from tests.server import ServerProcess

    server = ServerProcess(tmp_path / "data", env={"LAKELOG_AUTH": "api-key"}).start()
    admin = (server.data_dir / "security" / "admin.key").read_text().strip()
    env = _cli_env(tmp_path)
    profile = tmp_path / "xdg" / "lakelog" / "config.toml"
    try:
        out = _lakelog(env, "topics", "list", "--url", server.url)
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
        message = out.stderr
        assert message.startswith("lakelog: error: 401: "), message
        for place in ("--api-key", "LAKELOG_API_KEY", f"{profile} (no such file)",
                      f"{tmp_path / 'no-data-dir' / 'security' / 'admin.key'} (no such file"):
            assert place in message, (place, message)
        assert "LAKELOG_DATA_DIR" in message
        # A profile: url and key; the command needs neither flag nor variable.
        profile.parent.mkdir(parents=True)
        profile.write_text(f'url = "{server.url}"\napi_key = "{admin}"\n')
        out = _lakelog(env, "topics", "create", "t")
        assert out.returncode == 0, out.stderr
        assert _lakelog(env, "topics", "list").stdout.split() == ["t", "partitions=1"]
        # Precedence: LAKELOG_API_KEY over the profile, --api-key over LAKELOG_API_KEY.
        wrong = {**env, "LAKELOG_API_KEY": "llk_0000000000000000:wrong"}
        out = _lakelog(wrong, "topics", "list")
        assert out.returncode == 1
        assert "the API key from LAKELOG_API_KEY was refused" in out.stderr
        assert _lakelog(wrong, "--api-key", admin, "topics", "list").returncode == 0
        # The profile's key goes only to the profile's server.
        other = f"http://localhost:{server.port}"
        out = _lakelog(env, "topics", "list", "--url", other)
        assert out.returncode == 1 and f"its key is for {server.url}" in out.stderr
        profile.write_text('url = "http://127.0.0.1:1"\napi-key = "x"\n')
        out = _lakelog(env, "topics", "list")
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1
        assert f"the profile {profile} has unknown key(s) api-key" in out.stderr
    finally:
        server.stop()


def test_help_shows_what_a_user_types() -> None:
    import typer.main
    from typer.testing import CliRunner

    from lakelog.cli import app

    root = typer.main.get_command(app)
    runner = CliRunner()

    def walk(cmd: Any, path: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", {})
        return [path] + [p for name, sub in subs.items() for p in walk(sub, [*path, name])]

    for path in walk(root, []):
        out = runner.invoke(app, [*path, "--help"], terminal_width=200).output
        assert not re.search(r"<(str|bool|int|list|float|path)", out, re.I), (path, out)
        assert not re.search(r"\{[a-z_]+\}", out), (path, out)
    consume = runner.invoke(app, ["consume", "--help"], terminal_width=200).output
    assert re.search(r"Usage: .*consume \[OPTIONS\] \[TOPIC\]", consume), consume
    assert re.search(r"--from-beginning\s+Start at", consume), consume  # a flag: no value
    assert re.search(r"--max,--max-messages\s+N\s", consume), consume
    assert re.search(r"--group\s+GROUP\s", consume) and re.search(r"--property\s+NAME=VALUE",
                                                                   consume)
    reset = runner.invoke(app, ["groups", "reset-offsets", "--help"], terminal_width=200).output
    assert re.search(r"reset-offsets \[OPTIONS\] GROUP", reset), reset


def test_the_no_server_check_stands_aside_where_a_proxy_carries_the_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a proxy a refused direct connection says nothing about the server: the
    client's own retries (through the proxy) decide."""
    from lakelog.cli.root import refused_everywhere
    from log_tables.errors import LakelogError
    from tests.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    refused_everywhere(url, for_s=0.3)  # no error: the proxy's business
    monkeypatch.delenv("http_proxy")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    with pytest.raises(LakelogError, match="no server at"):
        refused_everywhere(url, for_s=0.3)
