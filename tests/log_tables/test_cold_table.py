"""The Delta tier without Spark: row conversion, stats, and removal of tiered hot segments."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from log_tables.cold.rows import file_stats, from_table_rows, to_table_rows
from log_tables.cold.table import open_table
from log_tables.cold.tiered_storage import TieredStorage
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.records import build_batch
from tests.log_tables.helpers import mark_tiered


def test_rows_round_trip_keeps_offsets_timestamps_and_timestamp_types() -> None:
    create = build_batch([b"a", None, b"c"], keys=[b"k", b"k", None], timestamps=[5, 6, 7],
                         headers=[[("h", b"1")], None, [("x", None)]])
    append = build_batch([b"d", b"e"], timestamps=1_700_000_000_123)
    rows = pa.Table.from_batches([to_table_rows(10, create, False), to_table_rows(13, append, True)])
    assert rows.column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert rows.column("timestampType").to_pylist() == [0, 0, 0, 1, 1]
    stats = json.loads(file_stats(rows))
    assert stats["numRecords"] == 5
    assert stats["minValues"]["offset"] == 10 and stats["maxValues"]["offset"] == 14
    assert stats["minValues"]["timestamp"] == "1970-01-01T00:00:00.005Z"
    assert stats["maxValues"]["timestamp"] == "2023-11-14T22:13:20.123Z"
    assert stats["nullCount"]["value"] == 1 and stats["nullCount"]["key"] == 3
    back = list(from_table_rows(rows))
    assert [(b.base_offset, b.records.num_rows, b.log_append_time) for b in back] == [
        (10, 3, False), (13, 2, True)]
    assert back[0].records.equals(create) and back[1].records.equals(append)


def _segments_of(manager: LogManager, topic: str, count: int, ts: int) -> list[int]:
    plog = manager.log(topic, 0)
    for i in range(count):
        plog.append(build_batch([b"x" * 100] * 10, timestamps=ts + i))
        plog.roll()
    return [s.base_offset for s in plog.segments]


def test_retire_removes_only_tiered_segments_past_local_retention_ms(manager: LogManager) -> None:
    meta = manager.create_topic("t", 1, {"local.retention.ms": "60000"})
    layout = Layout.of(manager.data_dir)
    tiered = TieredStorage(manager, layout, max_age_s=0)
    bases = _segments_of(manager, "t", 4, ts=1_000)
    assert tiered.retire(now_ms=10_000_000) == 0  # nothing tiered: nothing goes
    mark_tiered(layout, "t", meta.topic_id, 0, bases[2])  # two segments tiered
    assert tiered.retire(now_ms=1_000 + 60_000) == 0  # not older than local.retention.ms yet
    assert tiered.retire(now_ms=10_000_000) == 2
    plog = manager.log("t", 0)
    assert plog.log_start_offset == bases[2] and plog.high_watermark == 40
    assert tiered.retire(now_ms=10_000_000) == 0  # idempotent


def test_retire_by_local_retention_bytes_keeps_the_newest(manager: LogManager) -> None:
    meta = manager.create_topic("t", 1, {"local.retention.ms": "-1"})
    layout = Layout.of(manager.data_dir)
    bases = _segments_of(manager, "t", 4, ts=2**40)  # timestamps in the future: time never hits
    plog = manager.log("t", 0)
    one = plog.segments[0].size
    manager.alter_configs("t", {"local.retention.bytes": str(2 * one)})
    mark_tiered(layout, "t", meta.topic_id, 0, bases[4])  # everything sealed is tiered
    assert TieredStorage(manager, layout, max_age_s=0).retire(now_ms=0) == 2
    assert plog.log_start_offset == bases[2]
    assert plog.size_bytes <= 2 * one


def test_a_torn_newest_log_entry_is_set_aside_and_older_damage_is_an_error(
        tmp_path: Path) -> None:
    from deltalake import write_deltalake
    from deltalake.exceptions import DeltaError


    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, pa.table({"a": [i]}), mode="append")
    log_dir = tmp_path / "t" / "_delta_log"
    whole = (log_dir / f"{2:020d}.json").read_bytes()
    (log_dir / f"{3:020d}.json").write_bytes(whole[: len(whole) // 2])
    dt = open_table(uri)
    assert dt is not None and dt.version() == 2
    assert sorted(dt.to_pyarrow_table().column("a").to_pylist()) == [0, 1, 2]
    assert not (log_dir / f"{3:020d}.json").exists()
    assert len(list((tmp_path / "t" / "_torn_commits").iterdir())) == 1
    # Damage to an entry that is not the newest is not "repaired": it stays an error.
    (log_dir / f"{1:020d}.json").write_bytes(b'{"add": {"path": ')
    with pytest.raises(DeltaError):
        open_table(uri)
    assert (log_dir / f"{1:020d}.json").exists()


def test_a_commit_is_seen_at_once_and_racing_refreshes_keep_the_newest_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads refresh the cached state of one table after a commit. The patched
    ``table_topic_id`` (called between updating the handle and choosing the states)
    only holds each thread at that point, to make the one interleaving that left the
    older state cached for good (the second thread found the handle already updated,
    took it for "no new commit" and stored the states it had cached before)."""
    import threading

    from log_tables.cold import cache
    from log_tables.cold.cache import ColdTables

    layout = Layout.of(tmp_path / "data")
    mark_tiered(layout, "t", "id-1", 0, 5)
    tables = ColdTables(layout.warehouse, max_age_s=3600)
    states = tables.state("t", 1, "id-1")
    assert states is not None and states[0].tiered_offset == 5
    mark_tiered(layout, "t", "id-1", 0, 9)  # another process commits
    states = tables.state("t", 1, "id-1")  # seen at once, not after max_age_s
    assert states is not None and states[0].tiered_offset == 9
    mark_tiered(layout, "t", "id-1", 0, 12)

    arrived = {"a": threading.Event(), "b": threading.Event()}
    go = {"a": threading.Event(), "b": threading.Event()}
    real = cache.table_topic_id

    def held(dt: DeltaTable) -> str | None:
        me = threading.current_thread().name
        if me in arrived:
            arrived[me].set()
            assert go[me].wait(30)
        return real(dt)

    monkeypatch.setattr(cache, "table_topic_id", held)
    threads = {name: threading.Thread(target=tables.state, args=("t", 1, "id-1"),
                                      kwargs={"refresh": True}, name=name) for name in "ab"}
    threads["a"].start()
    assert arrived["a"].wait(30)
    threads["b"].start()
    arrived["b"].wait(1)  # with one refresh at a time, b waits for a instead
    go["a"].set()
    threads["a"].join(30)
    assert arrived["b"].wait(30)
    go["b"].set()
    threads["b"].join(30)
    monkeypatch.setattr(cache, "table_topic_id", real)
    states = tables.state("t", 1, "id-1")
    assert states is not None and states[0].tiered_offset == 12
