"""Every decoder meets random bytes: a typed error or a correct result, never a crash
or a wrong record (hypothesis)."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import msgspec
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_api.http.body import decode
from ingest_api.http.errors import ApiError
from ingest_api.http.models import BatchRequest, ProduceRecord
from log_tables.errors import CorruptIndexError, CorruptRecordError
from log_tables.hot.batch import BatchScanner, encode
from log_tables.hot.offset_index import OffsetIndex
from log_tables.records import build_batch

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _segment(batches: int) -> tuple[bytes, list[pa.RecordBatch]]:
    out, records, offset = b"", [], 0
    for b in range(batches):
        rb = build_batch([f"value {b}-{i}".encode() for i in range(3)],
                         keys=[f"k{i}".encode() for i in range(3)], timestamps=1_700_000_000_000)
        enc = encode(offset, rb)
        out += enc.header_bytes + enc.body.to_pybytes()
        records.append(rb)
        offset += 3
    return out, records


def _scan(data: bytes) -> tuple[list[pa.RecordBatch], BatchScanner]:
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        fd = os.open(f.name, os.O_RDONLY)
        try:
            scanner = BatchScanner(fd, f.name, 0, len(data), expected_offset=0)
            found = []
            for batch in scanner:
                try:
                    found.append(batch.records(f.name))
                except CorruptRecordError:
                    break
            return found, scanner
        finally:
            os.close(fd)


@SETTINGS
@given(st.binary(max_size=4096))
def test_random_bytes_are_never_a_batch(data: bytes) -> None:
    found, scanner = _scan(data)
    assert found == []
    assert data == b"" or scanner.stop is not None


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=8),
       st.integers(0, 64))
def test_damaged_segment_yields_a_correct_prefix(flips: list[tuple[int, int]], cut: int) -> None:
    data, originals = _segment(4)
    damaged = bytearray(data[: len(data) - cut])
    for pos, mask in flips:
        damaged[pos % len(damaged)] ^= mask
    found, scanner = _scan(bytes(damaged))
    # Whatever survives is exactly the original batches, in order, from the start.
    assert len(found) <= len(originals)
    for got, want in zip(found, originals, strict=False):
        assert got.equals(want)
    if len(found) < len(originals):
        assert scanner.stop is not None


@SETTINGS
@given(st.binary(max_size=512))
def test_random_index_files_load_checked_or_fail_typed(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "00000000000000000000.index"
        path.write_bytes(data)
        index = OffsetIndex(path, 0)
        try:
            index.load()
        except CorruptIndexError:
            return
        entries = index.entries()
        assert all(a < b for a, b in itertools.pairwise(entries))
        assert len(entries) * 8 == len(data)


@SETTINGS
@given(st.one_of(st.binary(max_size=512),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(
                                  st.sampled_from(["entries", "id", "key", "value", "type",
                                                   "data", "partition_id", "headers"]), c,
                                  max_size=4), max_leaves=12).map(msgspec.json.encode)))
def test_random_request_bodies_are_a_4xx(body: bytes) -> None:
    for decoder in (msgspec.json.Decoder(BatchRequest), msgspec.json.Decoder(ProduceRecord)):
        try:
            decode(body, decoder)
        except ApiError as exc:
            assert exc.status in (400, 422) and exc.message
