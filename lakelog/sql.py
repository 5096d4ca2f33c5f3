"""``lakelog sql``: Spark SQL over the topic views, printed as a table or JSON lines."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lakelog.endpoint import DEFAULT_SQL_PORT
from log_tables.errors import LakelogError

ENDPOINT_PROBE_S = 0.5
ENDPOINT_START_WAIT_S = 180.0
STARTING_HERE = "starting Spark in this process, which takes 30 s or more..."
NOT_HERE = ("it was named (--connect, LAKELOG_SQL_CONNECT), so the query is not run on "
            "--data-dir's data instead (--local does that)")


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    return value


def format_table(columns: list[str], rows: list[list[Any]]) -> Iterator[str]:
    cells = [[("NULL" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    yield " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    yield "-+-".join("-" * w for w in widths)
    for r in cells:
        yield " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))


QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextlib.contextmanager
def _spark_log() -> Iterator[Path]:
    """While the Spark JVM starts, stderr is a log file: the JVM keeps it for its life, so
    its start-up warnings and Java stack traces go there, not between the result lines.
    The caller removes it unless something failed."""
    fd, name = tempfile.mkstemp(prefix="lakelog-sql-", suffix=".log")
    path = Path(name)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield path
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def run_sql(query: str, data_dir: str | os.PathLike[str], warehouse: str | None,
            master: str | None, as_json: bool, max_rows: int, zookeeper: str | None = None,
            connect: str | None = None, api_key: str | None = None, local: bool = False
            ) -> Iterator[str]:
    """Lines of output: a table with a row count, or one JSON object per row.

    The query goes to a SQL endpoint: ``connect`` (else ``LAKELOG_SQL_CONNECT``), else
    the one the server of ``data_dir`` runs (its address is in the endpoint's state file;
    one still starting is waited for). Without one (or with ``local``) Spark starts in
    this process, as it does when the server's endpoint failed, fails to start or stops
    answering (gRPC's UNAVAILABLE or CANCELLED: a query cut off is run again here). Both
    say so on stderr. An endpoint named by ``connect`` or ``LAKELOG_SQL_CONNECT`` (not the
    server's own) that does not answer is a LakelogError: its data is not ``data_dir``'s,
    so the query is not run here instead.
    """
    from lakelog.endpoint.client import EndpointUnavailable
    from lakelog.endpoint.state import read_state

    state = read_state(data_dir)
    own = state.get("connect") if state is not None else None
    target = connect or os.environ.get("LAKELOG_SQL_CONNECT") or own
    if not local:
        if target is None:
            why = _failed(state) if state is not None and state.get("state") == "failed" \
                else f"no SQL endpoint runs for {data_dir} (`lakelog serve` runs one; " \
                "--connect names another)"
            _say(f"{why}; {STARTING_HERE}")
        else:
            remote = _endpoint(target, state if target == own else None, data_dir, api_key)
            if remote is not None:
                try:
                    lines = list(_run_remote(remote, query, as_json, max_rows))
                except EndpointUnavailable as exc:
                    if target != own:
                        raise LakelogError(f"the SQL endpoint at {target} does not answer "
                                           f"({exc}); {NOT_HERE}") from None
                    _say(f"the SQL endpoint at {target} does not answer ({exc}); "
                         f"{STARTING_HERE}")
                else:
                    yield from lines
                    return
    yield from _run_local(query, data_dir, warehouse, master, as_json, max_rows, zookeeper)


def _failed(state: dict[str, Any]) -> str:
    """Why the endpoint is gone, from its state (a missing package names its fix)."""
    error = state.get("error") or "it did not become ready"
    return error if state.get("missing") else f"the SQL endpoint failed ({error})"


def _say(line: str) -> None:
    print(f"lakelog: {line}", file=sys.stderr, flush=True)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=ENDPOINT_PROBE_S):
            return True
    except OSError:
        return False


def _endpoint(target: str, state: dict[str, Any] | None, data_dir: str | os.PathLike[str],
              api_key: str | None) -> str | None:
    """The Spark Connect URL to use (with the key as its token), or None: no endpoint.
    ``state``: the data directory's endpoint's state, when ``target`` is that endpoint
    (then a starting one is waited for, and the data directory's admin key may be used:
    it is sent to no other endpoint)."""
    from lakelog.endpoint.state import read_state

    url = urlsplit(target.split(";", 1)[0].replace("sc://", "http://", 1))
    host, port = url.hostname or "127.0.0.1", url.port or DEFAULT_SQL_PORT
    own = state is not None
    if not _reachable(host, port):
        if state is None:
            raise LakelogError(f"no SQL endpoint answers at {target}; {NOT_HERE}")
        if state.get("state") != "starting":
            _say(f"no SQL endpoint answers at {target}; {STARTING_HERE}")
            return None
        _say(f"the SQL endpoint (pid {state['pid']}) is starting Spark; waiting for it...")
        deadline = time.monotonic() + ENDPOINT_START_WAIT_S
        # Ready: its port answers and its state says so (the file follows the port).
        while not (_reachable(host, port) and state is not None
                   and state.get("state") == "ready"):
            state = read_state(data_dir)
            if state is None or state.get("state") == "failed" or \
                    time.monotonic() > deadline:
                _say(f"{_failed(state or {})}; {STARTING_HERE}")
                return None
            time.sleep(0.2)
    if state is not None and state.get("auth") == "none":
        return target
    key = api_key or os.environ.get("LAKELOG_API_KEY") or \
        (_admin_key(data_dir) if own else None)
    if key is None:
        return target
    # lakelog's keys are KEY_ID:SECRET; a bearer token is KEY_ID.SECRET. Spark Connect's
    # client sends a token over loopback only to "localhost" (local credentials), else TLS.
    token = key.replace(":", ".", 1)
    base, _, params = target.partition("/;")
    if host in ("127.0.0.1", "::1"):
        base = f"sc://localhost:{port}"
    return f"{base.rstrip('/')}/;{params + ';' if params else ''}token={token}"


def _admin_key(data_dir: str | os.PathLike[str]) -> str | None:
    try:
        return (Path(data_dir) / "security" / "admin.key").read_text().strip() or None
    except OSError:
        return None


def _quiet_query_logs() -> None:
    """PySpark logs a failed query's Java stack trace as one long JSON line on stderr
    before raising: the error lakelog prints says what matters, on one line."""
    from pyspark.logger import PySparkLogger

    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    details = re.search(r'details = "([^"\n]*)', text)
    return details.group(1) if details and "RPC that terminated" in first else first


def _run_remote(url: str, query: str, as_json: bool, max_rows: int) -> Iterator[str]:
    from lakelog.endpoint.client import query as remote_query

    table = remote_query(url, query, max_rows + 1)
    # By column, not to_pylist(): a result may name two columns alike (a join's `key`s).
    rows = [list(r) for r in zip(*(c.to_pylist() for c in table.columns), strict=True)]
    yield from _output(table.column_names, rows, as_json, max_rows)


def _output(columns: list[str], rows: list[list[Any]], as_json: bool, max_rows: int
            ) -> Iterator[str]:
    more = len(rows) > max_rows
    rows = rows[:max_rows]
    if as_json:
        keys = _unique(columns)
        for row in rows:
            yield json.dumps({k: _plain(v) for k, v in zip(keys, row, strict=True)})
        return
    yield from format_table(columns, [[_plain(v) for v in row] for row in rows])
    yield f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', more not shown' if more else ''})"


def _unique(columns: list[str]) -> list[str]:
    """JSON keys for ``columns``: a name seen before gets ``_2``, ``_3``... (a join's)."""
    seen: dict[str, int] = {}
    keys = []
    for name in columns:
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return keys


def _run_local(query: str, data_dir: str | os.PathLike[str], warehouse: str | None,
               master: str | None, as_json: bool, max_rows: int, zookeeper: str | None
               ) -> Iterator[str]:
    from pyspark.errors import PySparkException

    from lakelog.views import register_views
    from log_tables.spark.session import lakelog_session

    started = time.monotonic()
    with _spark_log() as log_path:
        spark = lakelog_session(data_dir, warehouse, master=master, app_name="lakelog-sql")
    _say(f"Spark started in {time.monotonic() - started:.0f} s")
    _quiet_query_logs()
    register_views(spark, zookeeper=zookeeper)
    try:
        df = spark.sql(query)
        rows = df.limit(max_rows + 1).collect()
    except PySparkException as exc:
        raise LakelogError(f"SQL failed: {_one_line(exc)} (Spark's log: {log_path})") from None
    log_path.unlink(missing_ok=True)  # the JVM may still write to it; nobody needs it
    yield from _output(df.columns, [list(r) for r in rows], as_json, max_rows)
