import random
from pathlib import Path

import pytest

from log_tables.errors import CorruptIndexError, IndexOrderError
from log_tables.hot.offset_index import OffsetIndex
from log_tables.hot.time_index import TimeIndex


def make(tmp_path: Path, base: int = 45) -> OffsetIndex:
    index = OffsetIndex(tmp_path / "x.index", base)
    index.open()
    return index


def test_lookup_random_offsets_and_extremes(tmp_path: Path) -> None:
    index = make(tmp_path)
    rng = random.Random(7)
    offsets = sorted(rng.sample(range(46, 10_000), 300))
    positions = sorted(rng.sample(range(1, 1_000_000), 300))
    for o, p in zip(offsets, positions, strict=True):
        index.append(o, p)
    pairs = list(zip(offsets, positions, strict=True))
    for _ in range(500):
        target = rng.randrange(45, 11_000)
        expected = max(((o, p) for o, p in pairs if o <= target), default=(45, 0))
        assert index.lookup(target) == expected
    assert index.lookup(45) == (45, 0)  # below the first entry: the segment start
    assert index.lookup(offsets[0]) == pairs[0]
    assert index.lookup(2**40) == pairs[-1]
    reloaded = OffsetIndex(tmp_path / "x.index", 45)
    reloaded.load()
    assert reloaded.entries() == pairs


def test_out_of_order_appends_are_rejected(tmp_path: Path) -> None:
    index = make(tmp_path)
    index.append(50, 100)
    with pytest.raises(IndexOrderError):
        index.append(50, 200)  # same offset
    with pytest.raises(IndexOrderError):
        index.append(49, 300)  # lower offset
    with pytest.raises(IndexOrderError):
        index.append(60, 100)  # position not after the last
    assert index.entries() == [(50, 100)]


def test_time_index_rejects_out_of_order_offsets(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", 0)
    index.open()
    assert index.maybe_append(100, 5)
    assert not index.maybe_append(90, 9)  # not a new maximum: skipped
    with pytest.raises(IndexOrderError):
        index.maybe_append(200, 3)
    assert index.entries() == [(100, 5)]


def test_truncate_drops_entries_at_and_after(tmp_path: Path) -> None:
    index = make(tmp_path, base=0)
    for i in range(1, 11):
        index.append(i * 10, i * 100)
    index.truncate_to(50)
    assert index.last == (40, 400)
    reloaded = OffsetIndex(tmp_path / "x.index", 0)
    reloaded.load()
    assert reloaded.last == (40, 400)


@pytest.mark.parametrize("garbage", [b"\x01\x02\x03", b"\x00" * 8])
def test_corrupt_file_is_detected_on_load(tmp_path: Path, garbage: bytes) -> None:
    index = make(tmp_path, base=0)
    index.append(10, 100)
    index.append(20, 200)
    index.close()
    with (tmp_path / "x.index").open("ab") as f:
        f.write(garbage)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(tmp_path / "x.index", 0).load()
