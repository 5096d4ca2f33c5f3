from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log_tables.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    partitions_for_key_array,
    partitions_for_keys,
)

# Apache Kafka's own vectors (clients/.../common/utils/UtilsTest.testMurmur2).
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_is_positive_hash_modulo() -> None:
    assert partition_for_key(b"21", 10) == (-973932308 & 0x7FFFFFFF) % 10


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.binary(max_size=40), min_size=0, max_size=300),
       partitions=st.integers(1, 10_000))
def test_vectorized_paths_equal_the_scalar_one(keys: list[bytes], partitions: int) -> None:
    expected = [partition_for_key(k, partitions) for k in keys]
    assert partitions_for_keys(keys, partitions) == expected
    if keys:
        arr = pa.array(keys, pa.binary())
        assert partitions_for_key_array(arr, partitions).tolist() == expected
        assert partitions_for_key_array(arr.slice(1), partitions).tolist() == expected[1:]


def test_same_length_keys_hash_in_bulk() -> None:
    keys = [i.to_bytes(16, "little") for i in range(5000)]
    assert partitions_for_keys(keys, 12) == [partition_for_key(k, 12) for k in keys]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), length=st.integers(1, 23), count=st.integers(1, 200),
       partitions=st.integers(1, 10_000))
def test_array_of_one_key_length_equals_the_scalar_path(data: st.DataObject, length: int,
                                                        count: int, partitions: int) -> None:
    keys = data.draw(st.lists(st.binary(min_size=length, max_size=length), min_size=count,
                              max_size=count))
    expected = [partition_for_key(k, partitions) for k in keys]
    arr = pa.array(keys, pa.binary())
    assert partitions_for_key_array(arr, partitions).tolist() == expected
    assert partitions_for_key_array(arr.slice(1), partitions).tolist() == expected[1:]


def test_sticky_partitioning_spreads_evenly() -> None:
    sticky = StickyPartitioner(batch_bytes=1000)
    parts = np.concatenate([sticky.partition_many("t", 4, np.full(37, 100)) for _ in range(100)])
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 0 and counts.max() - counts.min() <= 10
    # within a stretch of 1,000 bytes the partition does not change
    assert len(set(sticky.partition_many("u", 4, np.full(10, 100)).tolist())) == 1
