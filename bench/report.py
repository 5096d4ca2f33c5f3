"""Benchmark output: a plain-text table on stdout and a JSON file under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Print rows as an aligned Markdown table (so it pastes into docs/benchmarks.md as is)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    table = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(columns)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table:
        print("| " + " | ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + " |")


def write_json(name: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None,
               path: Path | None = None) -> Path:
    """Write the rows to ``path`` (default ``bench/results/<name>.json``)."""
    if path is None:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{name}.json"
    body = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "rows": rows,
        **(extra or {}),
    }
    path.write_text(json.dumps(body, indent=2))
    return path
