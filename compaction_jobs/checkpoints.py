"""Delta log checkpoints of lakelog's tables, taken every few commits."""

from __future__ import annotations

import json

from deltalake import DeltaTable

from log_tables.storage import filesystem

CHECKPOINT_EVERY = 10
"""Commits between checkpoints: opening a table then reads one Parquet file and a few JSONs."""


def checkpoint_if_due(dt: DeltaTable) -> bool:
    """Checkpoint when ``CHECKPOINT_EVERY`` commits came since the last one; drop expired logs."""
    fs, root = filesystem(dt.table_uri)
    try:
        with fs.open_input_stream(f"{root}/_delta_log/_last_checkpoint") as fh:
            last = int(json.loads(fh.read())["version"])
    except (FileNotFoundError, KeyError, ValueError):
        last = -1
    if dt.version() - last < CHECKPOINT_EVERY:
        return False
    dt.create_checkpoint()
    dt.cleanup_metadata()
    return True
