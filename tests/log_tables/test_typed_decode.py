"""Values in Confluent's wire format as Arrow columns: the types each format's schemas
map to, values written by the formats' own libraries read back, and the records that
cannot be typed named one by one."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from ingest_api.broker.schemas.store import LocalSchemaLog
from log_tables.hot.log_manager import LogManager
from log_tables.layout import Layout
from log_tables.typed.avro_arrow import AvroDecoder, UnsupportedSchema
from log_tables.typed.catalog import Catalog
from log_tables.typed.columns import TypeConflict, as_columns, conform, merge_fields, value_fields
from log_tables.typed.decode import Decoder, schema_ids
from log_tables.typed.json_arrow import JsonDecoder
from log_tables.typed.proto_arrow import message_indexes
from log_tables.typed.registry_state import Schema, Version, id_record, version_record

ORDER = {"type": "record", "name": "Order", "namespace": "ns", "fields": [
    {"name": "id", "type": "int"},
    {"name": "price", "type": ["null", "float"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
    {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"}]}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                "scale": 2}},
    {"name": "either", "type": ["null", "string", "long", "Ship"]},
    {"name": "raw", "type": {"type": "fixed", "name": "F4", "size": 4}},
]}


def avro_payload(doc: Any, value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(doc), value)
    return buf.getvalue()


def test_avro_types_as_spark_users_expect() -> None:
    decoder = AvroDecoder(Schema("AVRO", json.dumps(ORDER)), [])
    assert decoder.arrow_type == pa.struct([
        ("id", pa.int64()), ("price", pa.float64()), ("tags", pa.list_(pa.string())),
        ("kind", pa.string()), ("ship", pa.struct([("city", pa.string())])),
        ("attrs", pa.map_(pa.string(), pa.int64())), ("at", pa.timestamp("us", "UTC")),
        ("day", pa.date32()), ("amount", pa.decimal128(9, 2)),
        ("either", pa.struct([("member0", pa.string()), ("member1", pa.int64()),
                              ("member2", pa.struct([("city", pa.string())]))])),
        ("raw", pa.binary())])
    base = {"id": 1, "price": None, "tags": ["x"], "kind": "B", "ship": {"city": "Oslo"},
            "attrs": {"w": 2}, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC),
            "day": dt.date(2024, 1, 2), "amount": decimal.Decimal("12.34"), "raw": b"abcd"}
    values = [decoder.decode_one(avro_payload(ORDER, {**base, "either": e}))
              for e in ("s", 7, {"city": "Rome"}, None)]
    rows = decoder.to_arrow(values).to_pylist()
    assert rows[0]["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC)
    assert (rows[0]["day"], rows[0]["amount"], rows[0]["attrs"]) == (
        dt.date(2024, 1, 2), decimal.Decimal("12.34"), [("w", 2)])
    assert [r["either"] for r in rows] == [
        {"member0": "s", "member1": None, "member2": None},
        {"member0": None, "member1": 7, "member2": None},
        {"member0": None, "member1": None, "member2": {"city": "Rome"}}, None]


def test_recursive_avro_has_no_table_shape() -> None:
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"], "default": None}]}
    with pytest.raises(UnsupportedSchema, match="recursive"):
        AvroDecoder(Schema("AVRO", json.dumps(node)), [])


def test_json_schema_types_and_values_that_do_not_fit() -> None:
    doc = {"type": "object", "$defs": {"ship": {"type": "object", "properties": {
        "city": {"type": "string"}}}}, "properties": {
        "id": {"type": "integer"}, "price": {"type": ["number", "null"]},
        "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
        "ship": {"$ref": "#/$defs/ship"}, "any": {"oneOf": [{"type": "string"},
                                                          {"type": "integer"}]}}}
    decoder = JsonDecoder(Schema("JSON", json.dumps(doc)), {})
    assert decoder.arrow_type == pa.struct([
        ("id", pa.int64()), ("price", pa.float64()), ("ok", pa.bool_()),
        ("tags", pa.list_(pa.string())), ("ship", pa.struct([("city", pa.string())])),
        ("any", pa.string())])
    row = decoder.decode_one(b'{"id": 3, "price": 2, "tags": ["a"], "ship": {"city": "X"},'
                             b' "any": 5, "extra": true}')
    assert decoder.to_arrow([row]).to_pylist() == [
        {"id": 3, "price": 2.0, "ok": None, "tags": ["a"], "ship": {"city": "X"}, "any": "5"}]
    with pytest.raises(ValueError, match="not a JSON integer"):
        decoder.decode_one(b'{"id": "three"}')
    with pytest.raises(ValueError, match="not JSON"):
        decoder.decode_one(b'{"id": ')


def test_columns_merge_by_name_and_conflict() -> None:
    old = value_fields(pa.struct([("id", pa.int64()), ("offset", pa.string()),
                                  ("ship", pa.struct([("city", pa.string())]))]))
    assert [f.name for f in old] == ["id", "value_offset", "ship"]  # a metadata name moves
    new = value_fields(pa.struct([("id", pa.int64()),
                                  ("ship", pa.struct([("zip", pa.int64())])),
                                  ("note", pa.string())]))
    merged = merge_fields(old, new)
    assert pa.struct(merged) == pa.struct([
        ("id", pa.int64()), ("value_offset", pa.string()),
        ("ship", pa.struct([("city", pa.string()), ("zip", pa.int64())])),
        ("note", pa.string())])
    values = pa.array([{"id": 1, "ship": {"zip": 5}, "note": "n"}, None],
                      pa.struct([("id", pa.int64()), ("ship", pa.struct([("zip", pa.int64())])),
                                 ("note", pa.string())]))
    assert conform(as_columns(values), pa.struct(merged)).to_pylist() == [
        {"id": 1, "value_offset": None, "ship": {"city": None, "zip": 5}, "note": "n"}, None]
    with pytest.raises(TypeConflict, match="column id is int64 in the table but string"):
        merge_fields(old, value_fields(pa.struct([("id", pa.string())])))
    assert value_fields(pa.string()) == [pa.field("value", pa.string())]


def test_protobuf_message_indexes() -> None:
    assert message_indexes(b"\x00rest") == ([0], 1)
    assert message_indexes(b"\x04\x02\x06rest") == ([1, 3], 3)  # zigzag: count 2, [1, 3]
    with pytest.raises(ValueError, match="end early"):
        message_indexes(b"\x04\x02")


def test_decoder_names_each_record_and_waits_for_new_ids(tmp_path: Path) -> None:
    manager = LogManager(tmp_path / "data")
    try:
        doc = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
        LocalSchemaLog(manager)._write([
            version_record(Version("t-value", 1, 1, Schema("AVRO", json.dumps(doc))),
                           "t-value", 1), id_record(5)])
        decoder = Decoder(Catalog(Layout.of(manager.data_dir), wait_s=60))  # a cluster's

        def framed(schema_id: int, payload: bytes) -> bytes:
            return b"\0" + schema_id.to_bytes(4, "big") + payload
        values = pa.array([framed(1, avro_payload(doc, {"n": 1})), None, b"\x01abcd",
                           framed(3, b"x"), framed(1, b""), framed(1, avro_payload(doc, {"n": 2})),
                           framed(5, b"x"), framed(1, avro_payload(doc, {"n": 3}))], pa.binary())
        out = decoder.decode(values)
        assert [(g.schema_id, g.rows.tolist(), g.values.to_pylist()) for g in out.groups] == [
            (1, [0, 5], [{"n": 1}, {"n": 2}])]
        assert out.nulls == [1] and out.wait_at == 6  # id 5 is past what the log holds
        assert sorted(out.errors) == [2, 3, 4]
        assert "wire format" in out.errors[2] and "deleted for good" in out.errors[3]
        assert "cannot decode" in out.errors[4]
        # A broker alone: nothing to wait for, an id past its registry is unknown.
        alone = Decoder(Catalog(Layout.of(manager.data_dir))).decode(values)
        assert alone.wait_at is None and "not in the registry" in alone.errors[6]
    finally:
        manager.close()


def test_schema_ids_read_each_value_s_own_bytes_in_slices_and_around_nulls() -> None:
    ids = [7, 1 << 24 | 2, 300, 7]
    values = [b"\0" + i.to_bytes(4, "big") + b"p" for i in ids]
    whole = pa.array([b"\0\0\0\0\x09tail", *values, b"\1\0\0\0\x07x", b"\0\0\0", None,
                      b"\0\0\0\0\x07"], pa.binary())
    got, framed = schema_ids(whole)
    assert got.tolist() == [9, *ids, -1, -1, -1, 7]
    assert framed.tolist() == [True, True, True, True, True, False, False, False, True]
    sliced, _ = schema_ids(whole.slice(2, 4))  # (an offset into the buffers)
    assert sliced.tolist() == [ids[1], 300, 7, -1]
    # A null whose slot still spans bytes (Arrow allows it) is not framed.
    spanning = pa.Array.from_buffers(pa.binary(), 2, [pa.py_buffer(bytes([0b01])),
                                                      pa.py_buffer(np.array([0, 6, 12], np.int32).tobytes()),
                                                      pa.py_buffer(values[0] * 2)])
    assert schema_ids(spanning)[0].tolist() == [7, -1]


def test_many_records_at_once_and_a_shifted_block_found_out() -> None:
    doc = {"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}, {"name": "s", "type": "string"},
        {"name": "k", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
        {"name": "o", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": "double"}]}]},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
    decoder = AvroDecoder(Schema("AVRO", json.dumps(doc)), [])
    assert decoder.block is not None  # polars reads this schema
    records = [{"n": i, "s": f"s{i}", "k": "AB"[i % 2], "o": None if i % 3 else {"x": i / 4},
                "at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=i)}
               for i in range(200)]
    payloads = [avro_payload(doc, r) for r in records]
    many = decoder.decode_many(pa.array(payloads, pa.binary()))
    assert many is not None
    one_by_one = decoder.to_arrow([decoder.decode_one(p) for p in payloads])
    assert many.type == one_by_one.type and many.to_pylist() == one_by_one.to_pylist()
    # Trailing bytes after one record (Confluent's deserializer ignores them) and one cut
    # short: a block read of them would shift every record after; the guards say so.
    shifted = list(payloads)
    shifted[50] += b"\x02"
    shifted[120] = shifted[120][:3]
    assert decoder.decode_many(pa.array(shifted, pa.binary())) is None
    with pytest.raises(EOFError):
        decoder.decode_one(shifted[120])
    assert decoder.decode_one(shifted[50]) == decoder.decode_one(payloads[50])


def test_a_shift_that_decodes_cleanly_is_still_found() -> None:
    """Longs only: shifted bytes decode as other longs without any error; only the
    guards can tell."""
    doc = {"type": "record", "name": "P", "fields": [{"name": "a", "type": "long"},
                                                     {"name": "b", "type": "long"}]}
    decoder = AvroDecoder(Schema("AVRO", json.dumps(doc)), [])
    payloads = [avro_payload(doc, {"a": i, "b": -i}) for i in range(100)]
    payloads[10] += b"\x04"
    assert decoder.decode_many(pa.array(payloads, pa.binary())) is None
    del payloads[10]
    assert decoder.decode_many(pa.array(payloads, pa.binary())).to_pylist() == [
        {"a": i, "b": -i} for i in range(100) if i != 10]


def test_bytes_shaped_like_a_guard_are_caught_by_its_value() -> None:
    """A value whose trailing bytes hold a whole guard-shaped field and the next record:
    the block's structure reads cleanly (one record fewer than it holds); only the guard's
    random value shows the shift."""
    doc = {"type": "record", "name": "P", "fields": [{"name": "a", "type": "long"}]}
    decoder = AvroDecoder(Schema("AVRO", json.dumps(doc)), [])
    payloads = [avro_payload(doc, {"a": i}) for i in range(100)]
    payloads[10] += b"\x20" + bytes(16) + payloads.pop(11)
    assert decoder.decode_many(pa.array(payloads, pa.binary())) is None


def test_union_values_land_in_their_own_member() -> None:
    """bool is not an int, an int is not a double, an enum is not a string: the branch a
    value was written with is the member it lands in (fastavro tags named types)."""
    doc = {"type": "record", "name": "U", "namespace": "ns", "fields": [
        {"name": "num", "type": ["null", "double", "long", "boolean"]},
        {"name": "word", "type": ["string", {"type": "enum", "name": "E", "symbols": ["X"]}]},
        {"name": "one", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": "long"}]}]}]}
    decoder = AvroDecoder(Schema("AVRO", json.dumps(doc)), [])
    big = 2**60 + 1  # a double would lose it

    def encoded(num_branch: int, num: bytes, word: bytes) -> bytes:
        return bytes([num_branch * 2]) + num + word + b"\x02" + avro_payload(
            {"type": "record", "name": "In", "fields": [{"name": "x", "type": "long"}]},
            {"x": 4})
    long_bytes = avro_payload({"type": "record", "name": "L", "fields": [
        {"name": "v", "type": "long"}]}, {"v": big})
    rows = [decoder.decode_one(encoded(3, b"\x01", b"\x02\x00")),  # true; enum X
            decoder.decode_one(encoded(2, long_bytes, b"\x00\x02X"))]  # a long; string "X"
    got = decoder.to_arrow(rows).to_pylist()
    assert got[0]["num"] == {"member0": None, "member1": None, "member2": True}
    assert got[0]["word"] == {"member0": None, "member1": "X"}
    assert got[1]["num"] == {"member0": None, "member1": big, "member2": None}
    assert got[1]["word"] == {"member0": "X", "member1": None}
    assert got[0]["one"] == {"x": 4}
