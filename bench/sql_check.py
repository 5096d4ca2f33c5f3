"""What the SQL endpoint's check of a principal's SQL costs (``python -m bench.sql_check``).

The front checks every statement of a principal without cluster admin on Spark's own
parse (``lakelog.endpoint.guard.PlanGuard``): a parse in the endpoint's JVM, then a walk
of the unresolved plan through py4j. Measured here in one local SparkSession (as the
endpoint's: the same parser, the same py4j gateway), after warm-ups, for a few query
shapes: the check, and beside it the parse alone (``sqlParser().parsePlan``, which
Spark does for every statement anyway), as the baseline of the same run. The warm
query itself (``bench.sql``) takes 60 ms and more for a count on the endpoint.

Options: ``--runs`` (200 per query), ``--json PATH`` (default
``bench/results/sql_check.json``). Prints a table; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.report import print_table, write_json

QUERIES = {
    "count": "SELECT count(*) FROM orders",
    "group by": "SELECT partition, count(*) AS n FROM orders GROUP BY partition "
                "ORDER BY partition",
    "lag": "SELECT * FROM consumer_lag WHERE lag > 1000",
    "CTE + subquery": "WITH a AS (SELECT partition, count(*) AS n FROM orders GROUP BY "
                      "partition) SELECT sum(n) FROM a WHERE n > (SELECT min(offset) "
                      "FROM orders)",
    "join + window": "SELECT o.partition, o.offset, row_number() OVER (PARTITION BY "
                     "o.partition ORDER BY o.offset DESC) AS r FROM orders o JOIN "
                     "partitions p ON o.partition = p.partition WHERE p.topic = 'orders'",
}


def _times_ms(fn: Callable[[], Any], runs: int) -> list[float]:
    for _ in range(20):
        fn()
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1e3)
    return out


def _allowed(parts: Sequence[str]) -> str | None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from lakelog.endpoint.guard import PlanGuard

    spark = (SparkSession.builder.master("local[1]").appName("bench-sql-check")
             .config("spark.ui.enabled", "false").getOrCreate())
    try:
        guard = PlanGuard(spark._jvm, spark._jsparkSession)
        rows = []
        for name, sql in QUERIES.items():
            parse = _times_ms(lambda sql=sql: guard.parser.parsePlan(sql), args.runs)
            check = _times_ms(lambda sql=sql: guard.check_sql(sql, _allowed), args.runs)
            p50, base = statistics.median(check), statistics.median(parse)
            rows.append({"query": name, "check p50 ms": round(p50, 2),
                         "check p99 ms": round(sorted(check)[int(len(check) * 0.99) - 1], 2),
                         "parse alone p50 ms": round(base, 2),
                         "check / parse": round(p50 / base, 1)})
    finally:
        spark.stop()
    print_table(rows, list(rows[0]))
    path = write_json("sql_check", rows, {"runs": args.runs, "queries": QUERIES}, args.json)
    print(f"JSON: {path}")


if __name__ == "__main__":
    main()
