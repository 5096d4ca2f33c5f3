"""The ``_consumer_offsets`` Delta table: batched appends, answered only once in Delta;
reloaded on restart; compacted to the latest row per key, with expired groups gone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from deltalake import DeltaTable

from consumer_groups.offsets import Committed, OffsetKey, OffsetStore, offsets_uri


def _c(offset: int, ms: int | None = None) -> Committed:
    return Committed(offset, f"meta-{offset}", ms or int(time.time() * 1000), "m1", 3)


def test_concurrent_commits_share_delta_appends_and_are_in_delta_when_answered(
        tmp_path: Path) -> None:
    store = OffsetStore(str(tmp_path), max_wait_ms=20)
    store.start()

    async def commit_all() -> None:
        async def one(i: int) -> None:
            await store.commit([(OffsetKey("g", "t", i % 8), _c(i))])
            # Answered: the row is in the table for any new reader.
            rows = DeltaTable(offsets_uri(str(tmp_path))).to_pyarrow_table().to_pylist()
            assert any(r["offset"] == i for r in rows)
        await asyncio.gather(*(one(i) for i in range(200)))

    asyncio.run(commit_all())
    store.close()
    assert 1 <= store.appends <= 40, f"{store.appends} appends for 200 commits"
    assert DeltaTable(offsets_uri(str(tmp_path))).version() == store.appends - 1
    latest = {k.partition: c.offset for k, c in store.latest.items()}
    assert latest == {p: max(i for i in range(200) if i % 8 == p) for p in range(8)}


def test_restart_loads_the_latest_offsets_and_tombstones(tmp_path: Path) -> None:
    store = OffsetStore(str(tmp_path), max_wait_ms=1)
    store.start()
    asyncio.run(store.commit([(OffsetKey("g", "t", 0), _c(5)), (OffsetKey("h", "t", 0), _c(1))]))
    asyncio.run(store.commit([(OffsetKey("g", "t", 0), _c(9))]))
    asyncio.run(store.commit([(OffsetKey("h", "t", 0), None)]))  # group h deleted
    store.close()
    again = OffsetStore(str(tmp_path))
    again.load()
    assert again.group_offsets("g") == {("t", 0): store.latest[OffsetKey("g", "t", 0)]}
    assert again.groups() == {"g"}
    assert again.group_offsets("g")[("t", 0)].metadata == "meta-9"
    # New rows order after the old ones (seq continues): the next commit wins on reload.
    again.start()
    asyncio.run(again.commit([(OffsetKey("g", "t", 0), _c(2))]))
    again.close()
    third = OffsetStore(str(tmp_path))
    third.load()
    assert third.group_offsets("g")[("t", 0)].offset == 2


def test_compaction_keeps_the_latest_row_per_key_and_drops_expired_groups(
        tmp_path: Path) -> None:
    old_ms = int(time.time() * 1000) - 10 * 24 * 3600 * 1000
    store = OffsetStore(str(tmp_path), max_wait_ms=0, compact_every=10,
                        expired=lambda group, newest_ms: newest_ms < time.time() * 1000 - 7 * 86_400_000)
    store.start()
    asyncio.run(store.commit([(OffsetKey("old", "t", 0), _c(4, old_ms))]))
    for i in range(9):
        asyncio.run(store.commit([(OffsetKey("g", "t", i % 2), _c(i))]))
    time.sleep(0.5)  # the writer compacts after the 10th append
    store.close()
    dt = DeltaTable(offsets_uri(str(tmp_path)))
    rows = dt.to_pyarrow_table().to_pylist()
    assert sorted((r["group"], r["partition"], r["offset"]) for r in rows) == [
        ("g", 0, 8), ("g", 1, 7)]
    assert store.groups() == {"g"}
    reloaded = OffsetStore(str(tmp_path))
    reloaded.load()
    assert {k: c.offset for k, c in reloaded.group_offsets("g").items()} == {
        ("t", 0): 8, ("t", 1): 7}


def test_the_commit_queue_is_bounded(tmp_path: Path) -> None:
    import pytest

    from log_tables.errors import QueueFullError

    store = OffsetStore(str(tmp_path), max_queued_rows=3)  # writer not started: nothing drains
    store.submit([(OffsetKey("g", "t", p), _c(1)) for p in range(3)])
    with pytest.raises(QueueFullError, match="retry shortly"):
        store.submit([(OffsetKey("g", "t", 9), _c(1))])
    store.start()
    store.close()  # what was queued is written before the writer stops
    assert len(DeltaTable(offsets_uri(str(tmp_path))).to_pyarrow_table()) == 3


def _store(warehouse: Path) -> OffsetStore:
    store = OffsetStore(str(warehouse), max_wait_ms=1)
    store.load()
    store.start()
    return store


def _offset(warehouse: Path, group: str = "g") -> int | None:
    reader = OffsetStore(str(warehouse))
    reader.load()
    found = reader.group_offsets(group).get(("t", 0))
    return found.offset if found is not None else None


def test_a_new_coordinators_commits_win_over_the_old_ones_even_written_late(
        tmp_path: Path) -> None:
    """Two brokers' stores on one table, as when a group's coordinator moves: the new
    coordinator (a higher epoch) wins whatever the counters say, and a late write of the
    old one (a zombie) does not take the group back."""
    old = _store(tmp_path)
    for i in range(5):  # the old coordinator's counter runs ahead
        asyncio.run(old.commit([(OffsetKey("g", "t", 0), _c(10 + i))], epoch=3))
    new = OffsetStore(str(tmp_path), max_wait_ms=1)
    new.start()  # never loaded: its counter starts at 0
    assert new.reload_groups(lambda g: g == "g") == 1
    assert new.group_offsets("g")[("t", 0)].offset == 14
    asyncio.run(new.commit([(OffsetKey("g", "t", 0), _c(20))], epoch=4))
    asyncio.run(old.commit([(OffsetKey("g", "t", 0), _c(15))], epoch=3))  # late
    assert _offset(tmp_path) == 20
    old.close()
    new.close()


def test_compaction_keeps_every_brokers_commits(tmp_path: Path) -> None:
    """One broker's compaction rewrites the table's own latest rows, not its memory: the
    groups another broker coordinates keep their latest offsets (and their order)."""
    a, b = _store(tmp_path), _store(tmp_path)
    asyncio.run(a.commit([(OffsetKey("mine", "t", 0), _c(1))], epoch=1))
    asyncio.run(b.commit([(OffsetKey("theirs", "t", 0), _c(7))], epoch=2))
    asyncio.run(b.commit([(OffsetKey("theirs", "t", 0), _c(8))], epoch=2))
    a.close()
    a.compact()  # a never saw b's commits
    assert (_offset(tmp_path, "mine"), _offset(tmp_path, "theirs")) == (1, 8)
    asyncio.run(b.commit([(OffsetKey("theirs", "t", 0), _c(9))], epoch=2))
    assert _offset(tmp_path, "theirs") == 9  # b's counter still orders after the rewrite
    rows = DeltaTable(offsets_uri(str(tmp_path))).to_pyarrow_table()
    assert sorted(rows.column("group").to_pylist()) == ["mine", "theirs", "theirs"]
    b.close()


def test_reloading_groups_reads_only_them_and_forgetting_drops_them(tmp_path: Path) -> None:
    a, b = _store(tmp_path), _store(tmp_path)
    asyncio.run(a.commit([(OffsetKey("g1", "t", 0), _c(1)), (OffsetKey("g2", "t", 0), _c(2))]))
    assert b.reload_groups(lambda g: g == "g1") == 1
    assert b.groups() == {"g1"}
    b.forget_groups(lambda g: g == "g1")
    assert b.groups() == set()
    a.close()
    b.close()
