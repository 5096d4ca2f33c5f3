"""``lakelog sql``: Spark SQL over the topic views, printed as a table or JSON lines."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from log_tables.errors import LakelogError


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
            master: str | None, as_json: bool, max_rows: int, zookeeper: str | None = None
            ) -> Iterator[str]:
    """Lines of output: a table with a row count, or one JSON object per row."""
    from pyspark.errors import PySparkException
    from pyspark.logger import PySparkLogger

    from lakelog.views import register_views
    from log_tables.spark.session import lakelog_session

    with _spark_log() as log_path:
        spark = lakelog_session(data_dir, warehouse, master=master, app_name="lakelog-sql")
    # PySpark logs a failed query's Java stack trace as one long JSON line on stderr
    # before raising: the error below says what matters, on one line.
    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    register_views(spark, zookeeper=zookeeper)
    try:
        df = spark.sql(query)
        rows = df.limit(max_rows + 1).collect()
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LakelogError(f"SQL failed: {first} (Spark's log: {log_path})") from None
    log_path.unlink(missing_ok=True)  # the JVM may still write to it; nobody needs it
    more = len(rows) > max_rows
    rows = rows[:max_rows]
    if as_json:
        for row in rows:
            yield json.dumps({k: _plain(v) for k, v in row.asDict().items()})
        return
    yield from format_table(df.columns, [[_plain(v) for v in row] for row in rows])
    yield f"({len(rows)} row{'s' if len(rows) != 1 else ''}{', more not shown' if more else ''})"
