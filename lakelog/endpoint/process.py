"""The SQL endpoint's process: a resident Spark serving Spark Connect (behind lakelog's
front) and, if asked, JDBC; a child of ``lakelog serve`` as the job process is.

It is a process of its own, not the job process's Spark, because (measured in
``bench.sql``, reasoned in docs/architecture.md) a query must neither wait behind a
compaction nor take the jobs down with it: a user's query that exhausts the driver's
heap kills this JVM, which the server then reports, while tiering and retention (which
bound the hot tier's disk) go on. It costs one more JVM's memory.

Queries yield to produce and fetch as the jobs do: the process runs at nice 10 and
SCHED_IDLE (``background_child``) (the JVM and its Python workers inherit both), so the
server's threads preempt it at once. Measured in ``bench.sql`` with queries running
back to back beside a produce load: produce p99 3.8 -> 7.7 ms this way, 4.5 -> 13 ms at
nice 5 alone; the queries' own latency was the same.

It writes its state to ``<data_dir>/sql-endpoint.json`` (``starting``, ``ready`` with
the addresses, or ``failed`` with the error) so ``lakelog sql`` can say what it waits
for, and removes it when it stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compaction_jobs.scheduler import STOP, Intervals, JobProcess, background_child
from lakelog.endpoint.dependencies import check_connect, missing_dependency
from lakelog.endpoint.jdbc_front import HTTP_PATH
from lakelog.endpoint.state import read_state, state_path, write_state
from lakelog.local import free_port
from lakelog.ports import describe_taken, port_free
from log_tables.errors import PortTakenError
from log_tables.layout import Layout
from log_tables.moved import moved

if TYPE_CHECKING:
    from ingest_api.broker.security import SecurityStore

log = logging.getLogger(__name__)
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
SESSION_IDLE_TIMEOUT = "24h"
RESTART_DELAYS_S = (5.0, 15.0, 60.0)
"""Waits before starting a dead endpoint again: the first, then longer while it keeps
dying within ``HEALTHY_S`` of its start."""
HEALTHY_S = 600.0
EXIT_NOT_RESTARTED = 78
"""The endpoint's exit status when it cannot start until something outside it changes (a
package installed, a port freed): the server does not start it again (sysexits'
EX_CONFIG). Its state file says why."""
TOKEN_VARIABLE = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""Where Spark Connect's server finds the bearer token it wants, as it starts."""


class EndpointProcess(JobProcess):
    """The server's side: starts ``python -m lakelog.endpoint.process`` and stops it."""

    MODULE = "lakelog.endpoint.process"
    WANTS_ROLLS = False

    def __init__(self, layout: Layout, settings: Any) -> None:
        super().__init__(layout, Intervals(), settings.sql_master, settings.log_level)
        self.settings = settings
        self.restarts = 0
        """Times the endpoint was started again after it died."""
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        """Held to start and to stop: a restart never races the server's stop."""

    def start(self, manager: Any = None) -> None:
        """Start the endpoint, and a thread that starts it again whenever it dies (a
        query that exhausted its heap): after ``RESTART_DELAYS_S``, longer each time it
        dies within ``HEALTHY_S`` of its start. One that left with ``EXIT_NOT_RESTARTED``
        (a package missing, its port taken) is not: the log says once why."""
        with self._lock:
            super().start(manager)
        threading.Thread(target=self._supervise, name="sql-endpoint", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            super().stop()

    def _supervise(self) -> None:
        quick_deaths = 0
        while (proc := self._proc) is not None:
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            if code == EXIT_NOT_RESTARTED:
                why = (read_state(self.layout.data_dir) or {}).get("error")
                log.error("%s (the SQL endpoint is not started again)",
                          why or "the SQL endpoint cannot start")
                return
            quick_deaths = quick_deaths + 1 if time.monotonic() - started < HEALTHY_S else 1
            delay = RESTART_DELAYS_S[min(quick_deaths, len(RESTART_DELAYS_S)) - 1]
            log.warning("the SQL endpoint (pid %d) exited with %s: starting it again in "
                        "%.0f s", proc.pid, code, delay)
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                super().start()
                self.restarts += 1

    @property
    def enabled(self) -> bool:
        return bool(self.settings.sql_port or self.settings.jdbc_port)

    def spec(self) -> dict[str, object]:
        s = self.settings
        return {"data_dir": self.layout.data_dir, "warehouse": self.layout.warehouse,
                "master": s.sql_master, "driver_memory": s.sql_driver_memory,
                "max_sessions": s.sql_max_sessions,
                "host": s.sql_host, "port": s.sql_port, "jdbc_port": s.jdbc_port,
                "auth": s.auth, "zookeeper": s.zookeeper,
                "zookeeper_session_timeout_ms": s.zookeeper_session_timeout_ms,
                "tls_cert": str(s.tls_cert) if s.tls_cert else None,
                "tls_key": str(s.tls_key) if s.tls_key else None,
                "log_level": self.log_level.upper(), "parent_pid": os.getpid()}

    def describe(self) -> str:
        s = self.settings
        return f"Spark Connect on {s.sql_host}:{s.sql_port}" + (
            f", JDBC on 127.0.0.1:{s.jdbc_port}" if s.jdbc_port else "")

    def state(self) -> dict[str, Any]:
        """For the dashboard and health: the child's own report, or why there is none."""
        found = read_state(self.layout.data_dir)
        if found is None:
            alive = self._proc is not None and self._proc.poll() is None
            found = {"state": "starting" if alive else "stopped", "pid": self.pid}
        return {**found, "restarts": self.restarts}


def _security(spec: dict[str, Any]) -> SecurityStore | None:
    if spec["auth"] != "api-key":
        return None
    from ingest_api.broker.security import ZNODE_PATH, SecurityStore

    if spec.get("zookeeper") is None:
        return SecurityStore(Path(spec["data_dir"]))
    from cluster.session import ZkSession
    from cluster.znode import VersionedZnode

    session = ZkSession(spec["zookeeper"], spec["zookeeper_session_timeout_ms"])
    session.start()
    return SecurityStore(Path(spec["data_dir"]), VersionedZnode(session.client, ZNODE_PATH))


def _free_port_but(*taken: int) -> int:
    """A free loopback port that is none of ``taken`` (public ports not yet bound)."""
    while (port := free_port()) in taken:
        pass
    return port


def _credentials(spec: dict[str, Any]) -> Any:
    """TLS with the server's certificate; else local credentials (loopback, a key sent
    in the clear only to this machine) with auth on; none with auth off."""
    import grpc

    if spec.get("tls_cert") and spec.get("tls_key"):
        key, cert = Path(spec["tls_key"]).read_bytes(), Path(spec["tls_cert"]).read_bytes()
        return grpc.ssl_server_credentials([(key, cert)])
    if spec["auth"] == "api-key":
        return grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    return None


def _check_ports(spec: dict[str, Any]) -> None:
    for host, port, what in ((spec["host"], spec["port"], "the SQL endpoint's Spark Connect"),
                             ("127.0.0.1", spec["jdbc_port"], "the SQL endpoint's JDBC")):
        if port and not port_free(host, port):
            raise PortTakenError(f"{describe_taken(host, port, what)}: stop it, or give "
                            f"`lakelog serve` another (--sql-port N, --jdbc-port N; 0: none)")


def start_endpoint(spec: dict[str, Any]) -> tuple[Any, Any]:
    """Spark with Spark Connect on a loopback port of its own, JDBC if asked, and the
    front on the public port; returns (spark, the front's server)."""
    from lakelog.endpoint.front import ConnectFront, serve_front
    from lakelog.endpoint.jdbc_front import serve_jdbc_front
    from lakelog.endpoint.sessions import SessionViews
    from log_tables.spark.session import lakelog_session

    # What starting again would not fix is said before a JVM starts for nothing.
    _check_ports(spec)
    check_connect()
    layout = Layout(spec["data_dir"], spec["warehouse"])
    # The backends take calls from the fronts alone: Spark Connect wants a bearer token
    # and the Thrift server answers on a path that only this process knows (any local
    # user could otherwise reach their loopback ports and skip lakelog's checks).
    backend_token, backend_path = secrets.token_hex(32), secrets.token_hex(32)
    # Spark Connect itself listens on a loopback port the kernel picks (0): a port chosen
    # here could be the public one, not yet bound by the front.
    conf = {"spark.plugins": CONNECT_PLUGIN,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",
            "spark.scheduler.mode": "FAIR",
            # Plans as sent (lakelog's front checks them; a compressed one it refuses).
            "spark.connect.session.planCompression.threshold": "-1",
            # lakelog sql keeps one session per user: a day idle before it is closed.
            "spark.connect.session.manager.defaultSessionTimeout": SESSION_IDLE_TIMEOUT,
            "spark.driver.memory": spec["driver_memory"],
            "spark.sql.hive.thriftServer.singleSession": "true"}
    started = time.monotonic()
    # Through the JVM's environment (only this OS user can read it), not a Spark setting:
    # PySpark puts settings on the JVM's command line, which every local user can read,
    # and a session can read its settings (spark.conf.get).
    os.environ[TOKEN_VARIABLE] = backend_token
    try:
        spark = lakelog_session(layout.data_dir, layout.warehouse, master=spec["master"],
                                app_name="lakelog-sql", conf=conf)
    finally:
        del os.environ[TOKEN_VARIABLE]
    views = SessionViews(spark, layout, spec.get("zookeeper"), spec["max_sessions"])
    backend_port = views.connect_service.localPort()
    store = _security(spec)
    if spec["jdbc_port"]:
        views.refresh_root()
        backend = _free_port_but(spec["port"], spec["jdbc_port"])
        for key, value in {"hive.server2.transport.mode": "http",
                           "hive.server2.thrift.http.port": str(backend),
                           "hive.server2.thrift.http.path": backend_path,
                           "hive.server2.thrift.bind.host": "127.0.0.1"}.items():
            spark.conf.set(key, value)
        jvm = spark._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
            spark._jsparkSession.sqlContext())
        serve_jdbc_front("127.0.0.1", spec["jdbc_port"], backend, backend_path, store,
                         views.refresh_root)
    server = None
    if spec["port"]:
        front = ConnectFront(f"127.0.0.1:{backend_port}", backend_token, views, store)
        server = serve_front(front, f"{spec['host']}:{spec['port']}", _credentials(spec))
    log.info("SQL endpoint ready in %.1f s: Spark Connect on %s:%s, JDBC on %s",
             time.monotonic() - started, spec["host"], spec["port"], spec["jdbc_port"] or "-")
    return spark, server


def main(argv: list[str]) -> None:
    """Run the endpoint until the server says STOP (or leave with the server)."""
    spec = json.loads(argv[0])
    check_parent = background_child(spec, "sql")
    data_dir = spec["data_dir"]
    addresses = {"auth": spec["auth"],
                 "connect": f"sc://{spec['host']}:{spec['port']}" if spec["port"] else None,
                 "jdbc": f"jdbc:hive2://127.0.0.1:{spec['jdbc_port']}/default;"
                         f"transportMode=http;httpPath={HTTP_PATH}" if spec["jdbc_port"]
                         else None}
    write_state(data_dir, state="starting", **addresses)
    try:
        spark, server = start_endpoint(spec)
    except Exception as exc:
        # Said once, by the server, from the state file.
        if isinstance(exc, PortTakenError):
            write_state(data_dir, state="failed", error=exc.message)
            sys.exit(EXIT_NOT_RESTARTED)
        missing = missing_dependency(exc)
        if missing is not None:
            write_state(data_dir, state="failed", error=missing.message(),
                        missing=missing.distribution, fix=missing.command)
            sys.exit(EXIT_NOT_RESTARTED)
        log.exception("the SQL endpoint failed to start")
        write_state(data_dir, state="failed", error=f"{type(exc).__name__}: {exc}")
        sys.exit(1)
    write_state(data_dir, state="ready", **addresses)
    stdin = sys.stdin.fileno()
    jvm = getattr(spark.sparkContext._gateway, "proc", None)
    try:
        while True:
            readable, _, _ = select.select([stdin], [], [], 1.0)
            check_parent()
            if jvm is not None and (code := jvm.poll()) is not None:
                # A query that exhausted the heap, or a kill: the front would only answer
                # errors. Say so and leave; the server and its jobs go on.
                log.error("Spark's JVM (pid %d) exited with %s: the SQL endpoint stops",
                          jvm.pid, code)
                write_state(data_dir, state="failed",
                            error=f"Spark's JVM exited with {code} (out of memory? see the "
                                  "server's log); the server starts it again in seconds")
                os._exit(1)
            if readable:
                chunk = os.read(stdin, 64)
                if STOP in chunk or not chunk:
                    break
    finally:
        if server is not None:
            server.stop(grace=2).wait(5)
        with contextlib.suppress(FileNotFoundError):
            state_path(data_dir).unlink()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])


__getattr__ = moved(__name__, {"PortTaken": "log_tables.errors:PortTakenError"})
