"""When the SQL endpoint cannot answer: a package it needs is missing (said once, with
the command that installs it, and not started again), it fails while ``lakelog sql``
waits for it, or it stops answering; ``lakelog sql`` then starts Spark itself."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lakelog import sql
from lakelog.endpoint.dependencies import missing_dependency, pinned
from lakelog.endpoint.process import RESTART_DELAYS_S
from lakelog.endpoint.state import read_state, write_state
from lakelog.local import free_port
from log_tables.errors import LakelogError
from tests.server import LAKELOG, ServerProcess

NO_PANDAS = 'raise ModuleNotFoundError("No module named \'pandas\'", name="pandas")\n'


@pytest.fixture
def local_lines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``lakelog sql``'s own Spark, stood in for: its arguments' query is the answer."""
    ran: list[str] = []

    def run_local(query: str, *args: object) -> Iterator[str]:
        ran.append(query)
        yield f"local: {query}"

    monkeypatch.setattr(sql, "_run_local", run_local)
    return ran


def test_the_missing_package_and_its_pinned_fix_are_found_behind_pysparks_error() -> None:
    from pyspark.errors import PySparkImportError

    try:
        try:
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        except ImportError as cause:
            raise PySparkImportError(errorClass="PACKAGE_NOT_INSTALLED", messageParameters={
                "package_name": "Pandas", "minimum_version": "2.2.0"}) from cause
    except ImportError as exc:
        found = missing_dependency(exc)
    assert found is not None and found.distribution == "pandas"
    assert found.command.endswith("-m pip install pandas==2.3.3")
    assert pinned("pandas") == "pandas==2.3.3"  # a core dependency, not an extra's
    grpc_status = missing_dependency(ModuleNotFoundError("x", name="grpc_status.rpc"))
    assert grpc_status is not None and grpc_status.distribution == "grpcio-status"
    assert missing_dependency(ValueError("no")) is None


def test_only_a_package_lakelog_pins_or_pyspark_names_counts_as_missing() -> None:
    """A module of lakelog's own, or one lakelog does not pin, is an ordinary failure:
    no ``pip install`` of a name that may be anyone's on PyPI, and the endpoint restarts."""
    for name in ("log_tables.spark_views", "yaml", "lakelog_gone"):
        assert missing_dependency(ModuleNotFoundError("x", name=name)) is None, name
    protobuf = missing_dependency(ModuleNotFoundError("x", name="google.protobuf.message"))
    assert protobuf is not None and protobuf.command.endswith("pip install protobuf==7.36.2")
    # An ImportError a library handled on its way to another failure is its context, not
    # its cause: the failure is not made permanent by it.
    try:
        try:
            raise ModuleNotFoundError("No module named 'pandas'", name="pandas")
        except ImportError:
            raise RuntimeError("the JVM did not start")  # noqa: B904
    except RuntimeError as exc:
        assert isinstance(exc.__context__, ModuleNotFoundError)
        assert missing_dependency(exc) is None


def test_an_endpoint_failing_on_an_unpinned_module_exits_to_be_restarted(
        tmp_path: Path) -> None:
    """The endpoint's own process, with ``start_endpoint`` replaced (a stale lakelog
    module cannot be made missing in this checkout) by a real import of a module that
    does not exist: it exits 1, which the server restarts, not ``EXIT_NOT_RESTARTED``."""
    spec = {"data_dir": str(tmp_path), "host": "127.0.0.1", "port": 0, "jdbc_port": 0,
            "auth": "none", "log_level": "INFO", "parent_pid": None}
    code = ("import sys\n"
            "from lakelog.endpoint import process\n"
            "def start_endpoint(spec):\n"
            "    import log_tables.spark_views_gone\n"
            "process.start_endpoint = start_endpoint\n"
            "process.main(sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    state = read_state(tmp_path)
    assert state is not None and state["state"] == "failed" and "missing" not in state, state
    assert "ModuleNotFoundError: No module named 'log_tables.spark_views_gone'" in \
        state["error"]


def test_a_starting_endpoint_that_fails_is_not_waited_for(
        tmp_path: Path, local_lines: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()  # nothing listens: the endpoint still starts its Spark
    write_state(str(tmp_path), state="starting", auth="none", connect=f"sc://127.0.0.1:{port}")
    failing = threading.Timer(0.5, write_state, [str(tmp_path)], {
        "state": "failed", "error": "PySparkImportError: Pandas >= 2.2.0 must be installed"})
    failing.start()
    started = time.monotonic()
    lines = list(sql.run_sql("SELECT 1", tmp_path, None, None, False, 10))
    failing.join()
    assert lines == ["local: SELECT 1"] and time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "is starting Spark; waiting for it..." in err
    assert "the SQL endpoint failed (PySparkImportError: Pandas >= 2.2.0 must be installed)" \
        "; starting Spark in this process" in err


@contextlib.contextmanager
def _hanging_up() -> Iterator[int]:
    """A port that takes connections and closes each at once (a front going down): every
    Spark Connect call to it ends UNAVAILABLE."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def hang_up() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                listener.accept()[0].close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_an_endpoint_that_stops_answering_is_replaced_by_a_local_spark(
        tmp_path: Path, local_lines: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The server's own endpoint (its address from the data directory) stops answering."""
    with _hanging_up() as port:
        write_state(str(tmp_path), state="ready", auth="none",
                    connect=f"sc://127.0.0.1:{port}")
        lines = list(sql.run_sql("SELECT 2", tmp_path, None, None, False, 10))
    assert lines == ["local: SELECT 2"]
    assert f"the SQL endpoint at sc://127.0.0.1:{port} does not answer (" in \
        capsys.readouterr().err


def test_a_named_endpoint_that_does_not_answer_is_not_replaced_by_local_data(
        tmp_path: Path, local_lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint named by --connect or LAKELOG_SQL_CONNECT serves its own data, not the
    data directory's: when it stops answering mid-query, or answers not at all, the
    query fails in one line instead of running (exit 0) on another dataset."""
    monkeypatch.delenv("LAKELOG_SQL_CONNECT", raising=False)
    with _hanging_up() as port:
        named = f"sc://127.0.0.1:{port}"
        with pytest.raises(LakelogError) as by_option:
            list(sql.run_sql("SELECT 2", tmp_path, None, None, False, 10, connect=named))
        # the server's own endpoint is elsewhere; the variable names this one
        write_state(str(tmp_path), state="ready", auth="none",
                    connect=f"sc://127.0.0.1:{free_port()}")
        monkeypatch.setenv("LAKELOG_SQL_CONNECT", named)
        with pytest.raises(LakelogError) as by_variable:
            list(sql.run_sql("SELECT 2", tmp_path, None, None, False, 10))
    for caught in (by_option, by_variable):
        message = caught.value.message
        assert message.startswith(f"the SQL endpoint at {named} does not answer ("), message
        assert message.endswith("it was named (--connect, LAKELOG_SQL_CONNECT), so the query "
                                "is not run on --data-dir's data instead (--local does that)")
        assert "\n" not in message
    with pytest.raises(LakelogError, match=r"^no SQL endpoint answers at sc://127\.0\.0\.1:1; "):
        list(sql.run_sql("SELECT 3", tmp_path, None, None, False, 10,
                         connect="sc://127.0.0.1:1"))
    assert local_lines == []


def test_lakelog_sql_with_a_named_endpoint_that_does_not_answer_exits_1(tmp_path: Path
                                                                        ) -> None:
    done = subprocess.run([LAKELOG, "sql", "--data-dir", str(tmp_path), "--connect",
                           "sc://127.0.0.1:1", "SELECT 1"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "LAKELOG_SQL_CONNECT": ""})
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.startswith("lakelog: error: no SQL endpoint answers at "
                                  "sc://127.0.0.1:1; it was named"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.slow
def test_a_missing_package_is_said_once_with_its_fix_and_lakelog_sql_starts_spark(
        tmp_path: Path) -> None:
    """A real server whose Python has no pandas (a stand-in package that fails to import,
    first on its path): the endpoint leaves at once, is not started again, and
    ``lakelog sql`` runs the query on a Spark of its own."""
    (tmp_path / "shadow" / "pandas").mkdir(parents=True)
    (tmp_path / "shadow" / "pandas" / "__init__.py").write_text(NO_PANDAS)
    path = os.pathsep.join(p for p in (str(tmp_path / "shadow"),
                                       os.environ.get("PYTHONPATH")) if p)
    server = ServerProcess(tmp_path / "data", env={
        "LAKELOG_SQL_PORT": str(free_port()), "LAKELOG_SQL_MASTER": "local[1]",
        "PYTHONPATH": path}).start()
    try:
        state, log = _failed_once(server, "the SQL endpoint needs pandas")
        assert state["missing"] == "pandas", state
        assert state["fix"].endswith("-m pip install pandas==2.3.3")
        assert "-m pip install pandas==2.3.3` installs it; then restart `lakelog serve` " \
            "(the SQL endpoint is not started again)" in log
        done = subprocess.run(
            [LAKELOG, "sql", "--data-dir", str(server.data_dir), "--json", "SELECT 6 * 7 AS n"],
            env={**server.env}, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"n": 42}
        assert done.stderr.startswith("lakelog: the SQL endpoint needs pandas"), done.stderr
        assert "; starting Spark in this process" in done.stderr
    finally:
        server.stop(timeout_s=60)


def _failed_once(server: ServerProcess, said: str) -> tuple[dict[str, Any], str]:
    """The endpoint's failed state and the server's log, once the endpoint failed and,
    past the first restart's delay, was not started again, with ``said`` logged once."""
    deadline = time.monotonic() + 60
    while (state := read_state(server.data_dir)) is None or state["state"] != "failed":
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    until = time.monotonic() + RESTART_DELAYS_S[0] + 5
    while time.monotonic() < until:
        now = read_state(server.data_dir)
        assert now is not None and now["pid"] == state["pid"], (now, server.log())
        time.sleep(0.2)
    log = server.log_path.read_text(errors="replace")
    assert log.count(said) == 1, log
    assert "starting it again" not in log and "Traceback" not in log, log
    row = next(r for r in httpx.get(f"{server.url}/ui/data", timeout=10).json()[
        "broker"]["services"] if r["name"] == "sql")
    assert row["state"] == "failed" and row["restarts"] == 0, row
    return state, log


@pytest.mark.slow
def test_a_taken_port_is_said_once_naming_its_holder(tmp_path: Path) -> None:
    """As a second ``lakelog serve`` (or a cluster's broker 1) beside one that holds the
    SQL endpoint's port: the endpoint says so before its Spark starts, and stays down."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = ServerProcess(tmp_path / "data", env={"LAKELOG_SQL_PORT": str(port)}).start()
        try:
            state, _ = _failed_once(server, f"port {port} (the SQL endpoint's Spark Connect)")
            assert state["error"].startswith(
                f"port {port} (the SQL endpoint's Spark Connect) on 127.0.0.1 is taken by pid "
                f"{os.getpid()} ("), state
            assert "--sql-port N" in state["error"]
        finally:
            server.stop(timeout_s=60)
