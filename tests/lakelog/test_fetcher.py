"""The consumer's buffer bookkeeping on Arrow batches (no server needed: these are the
pure functions a poll runs on what an answer brought)."""

from __future__ import annotations

import pyarrow as pa

from lakelog.client.fetcher import Answer, Fetcher, chunks_of, partitions_of
from lakelog.client.polled import KAFKA_SCHEMA, data_bytes
from lakelog.client.structs import FetchSettings, TopicPartition


def _batch(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    """Rows of (topic, partition, offset), value ``b"v<offset>"``."""
    return pa.RecordBatch.from_pylist([
        {"key": None, "value": b"v%d" % o, "topic": t, "partition": p, "offset": o,
         "timestamp": None, "timestampType": 0, "headers": None} for t, p, o in rows],
        schema=KAFKA_SCHEMA)


def test_a_batch_of_several_partitions_is_split_each_in_its_own_order() -> None:
    """The server coalesces runs of tiny batches, which may mix partitions: each becomes a
    chunk of one partition, its rows in their order, nothing lost."""
    mixed = _batch([("t", 0, 5), ("t", 1, 9), ("u", 0, 2), ("t", 0, 6), ("t", 1, 10)])
    plain = _batch([("t", 0, 7), ("t", 0, 8)])
    chunks = chunks_of([mixed, plain, _batch([])])
    assert sorted((c.tp, c.batch.column("offset").to_pylist()) for c in chunks) == [
        (TopicPartition("t", 0), [5, 6]), (TopicPartition("t", 0), [7, 8]),
        (TopicPartition("t", 1), [9, 10]), (TopicPartition("u", 0), [2])]
    for c in chunks:
        assert (c.first, c.last) == (c.batch.column("offset")[0].as_py(),
                                     c.batch.column("offset")[-1].as_py())
        assert c.data_bytes == data_bytes(c.batch)
    assert partitions_of(chunks) == {TopicPartition("t", 0): (5, 8),
                                     TopicPartition("t", 1): (9, 10),
                                     TopicPartition("u", 0): (2, 2)}


def test_take_slices_a_chunk_and_keeps_the_counts_exact() -> None:
    fetcher = Fetcher(None, FetchSettings(), 1000)  # type: ignore[arg-type]  # no requests
    try:
        chunks = chunks_of([_batch([("t", 0, o) for o in range(10)]),
                            _batch([("t", 1, o) for o in range(100, 104)])])
        answer = Answer("m", chunks, 14, sum(c.data_bytes for c in chunks))
        fetcher._count(answer.records, answer.data_bytes)  # as the request does
        fetcher.fill(answer, chunks)
        keep = {TopicPartition("t", 0), TopicPartition("t", 1)}
        first = fetcher.take(4, keep)
        assert [(c.tp.partition, c.first, c.last) for c in first] == [(0, 0, 3)]
        assert fetcher.buffered()[0].first == 4 and fetcher.buffered_records == 10
        rest = fetcher.take(100, {TopicPartition("t", 1)})  # partition 0 revoked: dropped
        assert [(c.tp.partition, c.first, c.last) for c in rest] == [(1, 100, 103)]
        assert fetcher.buffered() == [] and fetcher.buffered_records == 0
        assert fetcher.buffered_bytes == 0
    finally:
        fetcher.close()
