"""The SQL views' names come from one list (``log_tables.config.SQL_VIEW_NAMES``), which
topic names may not take; the views themselves are checked with Spark in
tests/log_tables/test_spark_stream.py and tests/consumer_groups/test_lag_views.py."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["log_tables", "consumer_groups", "compaction_jobs", "ingest_api", "lakelog"]


def test_no_view_is_named_outside_the_one_list() -> None:
    """A view registered under a literal name would be a second list: its name could
    miss the reserved ones, and a topic of that name would hide behind it."""
    literal = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("createOrReplaceTempView", "createTempView")
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    literal.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.args[0].value}")
    assert not literal, "views named outside log_tables.config.SQL_VIEW_NAMES:\n" + "\n".join(
        literal)
