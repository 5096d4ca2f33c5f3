"""Topics whose records say where they belong, and checks of what a read returned."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from log_tables.cold.table import open_table
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout, delta_path, local_path
from log_tables.records import build_batch

BASE_TS = 1_700_000_000_000


def value_of(partition: int, offset: int) -> bytes | None:
    if offset % 11 == 5:
        return None  # a tombstone now and then
    return f"p{partition}-o{offset}".encode()


def key_of(partition: int, offset: int) -> bytes | None:
    return None if offset % 4 == 3 else f"k{offset % 9}".encode()


def headers_of(partition: int, offset: int) -> list[tuple[str, bytes | None]] | None:
    return [("n", str(offset).encode()), ("empty", None)] if offset % 3 == 0 else None


def produce(manager: LogManager, topic: str, partition: int, count: int, per_batch: int = 7,
            roll_every: int | None = None) -> None:
    """Append ``count`` records at the log end; roll after every ``roll_every`` records."""
    plog = manager.log(topic, partition)
    done = 0
    while done < count:
        first = plog.high_watermark
        n = min(per_batch, count - done)
        offsets = range(first, first + n)
        plog.append(build_batch(
            [value_of(partition, o) for o in offsets], keys=[key_of(partition, o) for o in offsets],
            timestamps=[BASE_TS + o * 10 for o in offsets],
            headers=[headers_of(partition, o) for o in offsets]))
        done += n
        if roll_every and (plog.high_watermark // roll_every) != (first // roll_every):
            plog.roll()


def check_rows(rows: Iterable[Any], topic: str, ends: dict[int, int],
               starts: dict[int, int] | None = None) -> None:
    """Rows are exactly offsets ``starts[p] .. ends[p]-1`` of every partition, each once,
    with the key, value, headers and timestamp they were produced with."""
    seen: dict[int, list[int]] = {p: [] for p in ends}
    for r in rows:
        p, o = r["partition"], r["offset"]
        assert r["topic"] == topic
        assert r["value"] == value_of(p, o), (p, o)
        assert r["key"] == key_of(p, o), (p, o)
        want_headers = headers_of(p, o)
        got_headers = [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] else None
        assert got_headers == want_headers, (p, o)
        assert int(r["timestamp"].timestamp() * 1000) == BASE_TS + o * 10
        assert r["timestampType"] == 0
        seen[p].append(o)
    for p, end in ends.items():
        first = (starts or {}).get(p, 0)
        assert sorted(seen[p]) == list(range(first, end)), f"partition {p}"


def table_files(layout: Layout, topic: str) -> tuple[set[str], set[str]]:
    """(files the Delta table references, Parquet files on disk outside ``_stage``)."""
    dt = open_table(layout.table_uri(topic))
    assert dt is not None
    root = Path(local_path(layout.table_uri(topic)))
    referenced = {str(Path(delta_path(u)).relative_to(root)) for u in dt.file_uris()}
    on_disk = {str(f.relative_to(root)) for f in root.glob("partition=*/*.parquet")}
    return referenced, on_disk
