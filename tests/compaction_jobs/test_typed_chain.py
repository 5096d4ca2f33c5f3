"""The whole chain, with clients nobody here wrote: confluent-kafka's
``SchemaRegistryClient`` registers against a real ``lakelog serve`` (its jobs on), its
serializers write the values, they are produced over HTTP, the server's own scheduler
tiers them and types them, and Spark and delta-rs read typed columns; then the
schema evolves and a bad record lands in the dead-letter table."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import httpx
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable, QueryBuilder
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from pyspark.sql import Row, SparkSession

from log_tables.cold.table import open_table
from log_tables.layout import Layout
from log_tables.spark.read import read_topic
from log_tables.typed.columns import dlq_app_id, typed_app_id
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
DEADLINE_S = 120.0
AVRO_V1 = ('{"type": "record", "name": "Order", "namespace": "shop", "fields": ['
           '{"name": "id", "type": "long"}, {"name": "item", "type": "string"}, '
           '{"name": "tags", "type": {"type": "array", "items": "string"}}, '
           '{"name": "ship", "type": {"type": "record", "name": "Ship", "fields": ['
           '{"name": "city", "type": "string"}]}}]}')
AVRO_V2 = AVRO_V1[:-2] + ', {"name": "qty", "type": "int", "default": 1}]}'
JSON_V1 = ('{"type": "object", "properties": {"id": {"type": "integer"}, '
           '"item": {"type": "string"}, "price": {"type": "number"}}}')


def produce(server: ServerProcess, topic: str, values: list[bytes]) -> None:
    with server.client() as c:
        entries = [{"id": str(i), "key": {"type": "BINARY", "data": base64.b64encode(b"k%d" % i).decode()},
                    "value": {"type": "BINARY", "data": base64.b64encode(v).decode()}}
                   for i, v in enumerate(values)]
        r = c.post(f"/topics/{topic}/records:batch", json={"entries": entries})
        assert r.status_code == 207 and not r.json()["failures"], r.text


def create(server: ServerProcess, topic: str, mode: str) -> None:
    with server.client() as c:
        r = c.post("/topics", json={"topic_name": topic, "partitions_count": 1, "configs": [
            {"name": "delta.table.mode", "value": mode}, {"name": "segment.ms", "value": "200"}]})
        assert r.status_code == 201, r.text


def wait_typed(layout: Layout, topic: str, end: int, dlq: int | None = None) -> DeltaTable:
    """Until the server's jobs have typed offsets up to ``end`` (and written dead letters
    up to ``dlq``)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        dt = open_table(layout.typed_uri(topic))
        dead = open_table(layout.dlq_uri(topic)) if dlq is not None else None
        if dt is not None and (dt.transaction_version(typed_app_id(0)) or 0) >= end and (
                dlq is None or (dead is not None and (dead.transaction_version(dlq_app_id(0))
                                                     or 0) >= dlq)):
            return dt
        assert time.monotonic() < deadline, f"{topic}: not typed up to {end} in time"
        time.sleep(0.2)


def serializer(kind: str, sr: SchemaRegistryClient, text: str) -> Callable[[Any, str], bytes]:
    ser = (AvroSerializer(sr, text) if kind == "AVRO"  # (their arguments differ in order)
           else JSONSerializer(text, sr))

    def encode(value: Any, topic: str) -> bytes:
        out = ser(value, SerializationContext(topic, MessageField.VALUE))
        assert out is not None
        return out
    return encode


def test_avro_chain_typed_in_spark_and_delta_rs(jobs_server: ServerProcess,
                                                spark: SparkSession) -> None:
    layout = Layout.of(jobs_server.data_dir)
    create(jobs_server, "orders", "typed")
    sr = SchemaRegistryClient({"url": jobs_server.url})
    try:
        v1 = serializer("AVRO", sr, AVRO_V1)
        produce(jobs_server, "orders", [v1({"id": i, "item": f"i{i}", "tags": ["a"] * i,
                                            "ship": {"city": "Oslo"}}, "orders")
                                        for i in range(3)])
        wait_typed(layout, "orders", 3)
        got = read_topic(spark, "orders").orderBy("offset").collect()
        assert [(r["id"], r["item"], r["tags"], r["ship"]["city"]) for r in got] == [
            (i, f"i{i}", ["a"] * i, "Oslo") for i in range(3)]
        # delta-rs (DataFusion) reads the same table.
        dt = DeltaTable(layout.typed_uri("orders"))
        found = QueryBuilder().register("t", dt).execute(
            'SELECT id, item, ship.city AS city FROM t ORDER BY "offset"').read_all()
        assert pa.table(found).to_pylist() == [{"id": i, "item": f"i{i}", "city": "Oslo"}
                                     for i in range(3)]
        # Evolve: the new field is a new column; a record not in the wire format is a
        # dead letter.
        v2 = serializer("AVRO", sr, AVRO_V2)
        produce(jobs_server, "orders", [v2({"id": 3, "item": "i3", "tags": [],
                                            "ship": {"city": "Rome"}, "qty": 5}, "orders"),
                                        b"plain bytes"])
        wait_typed(layout, "orders", 5, dlq=5)
        got = read_topic(spark, "orders").orderBy("offset").collect()
        assert [(r["offset"], r["id"], r["qty"]) for r in got] == [
            (0, 0, None), (1, 1, None), (2, 2, None), (3, 3, 5)]
        dead = QueryBuilder().register("d", DeltaTable(layout.dlq_uri("orders"))).execute(
            'SELECT "offset", value, error FROM d').read_all()
        dead = pa.table(dead).to_pylist()
        assert [(d["offset"], d["value"]) for d in dead] == [(4, b"plain bytes")]
        assert "wire format" in dead[0]["error"]
        # /metrics and the dashboard count them (their view is read every few seconds).
        deadline = time.monotonic() + DEADLINE_S
        while 'lakelog_dead_letters{partition="0",topic="orders"} 1.0' not in \
                httpx.get(jobs_server.url + "/metrics").text:
            assert time.monotonic() < deadline, "/metrics never counted the dead letter"
            time.sleep(0.5)
        assert 'lakelog_typed_offset{partition="0",topic="orders"} 5.0' in \
            httpx.get(jobs_server.url + "/metrics").text
        ui = httpx.get(jobs_server.url + "/ui/data", timeout=30).json()
        (orders,) = [t for t in ui["topics"] if t["name"] == "orders"]
        assert orders["table_mode"] == "typed"
        assert (orders["partitions"][0]["dead_letters"], orders["partitions"][0]["typed_offset"]
                ) == (1, 5)
    finally:
        sr.close()


def test_json_schema_chain_upsert(jobs_server: ServerProcess, spark: SparkSession) -> None:
    layout = Layout.of(jobs_server.data_dir)
    create(jobs_server, "prices", "upsert")
    sr = SchemaRegistryClient({"url": jobs_server.url})
    try:
        enc = serializer("JSON", sr, JSON_V1)
        produce(jobs_server, "prices", [enc({"id": i, "item": "x", "price": 1.5 * i}, "prices")
                                        for i in range(4)])  # keys k0..k3
        produce(jobs_server, "prices", [enc({"id": 9, "item": "y", "price": 9.0}, "prices")])
        wait_typed(layout, "prices", 5)
        got = read_topic(spark, "prices").orderBy("key").collect()
        assert [(r["key"], r["id"], r["price"]) for r in got] == [
            (b"k0", 9, 9.0), (b"k1", 1, 1.5), (b"k2", 2, 3.0), (b"k3", 3, 4.5)]
    finally:
        sr.close()


def order_file() -> descriptor_pb2.FileDescriptorProto:
    """``message Order { string item = 1; int64 qty = 2; repeated string tags = 3;
    Ship ship = 4; Kind kind = 5; map<string, int64> attrs = 6;
    google.protobuf.Timestamp at = 7; }`` with ``Ship { string city = 1; }`` and
    ``enum Kind { A = 0; B = 1; }``, as protoc's output would hold it."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="shop_order.proto", package="shoporder", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"])
    order = proto.message_type.add(name="Order")
    ship = order.nested_type.add(name="Ship")
    ship.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    kind = order.enum_type.add(name="Kind")
    kind.value.add(name="A", number=0)
    kind.value.add(name="B", number=1)
    order.field.add(name="item", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order.field.add(name="qty", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    order.field.add(name="tags", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    order.field.add(name="ship", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".shoporder.Order.Ship")
    order.field.add(name="kind", number=5, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                    type_name=".shoporder.Order.Kind")
    order.field.add(name="attrs", number=6, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".shoporder.Order.AttrsEntry")
    order.field.add(name="at", number=7, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".google.protobuf.Timestamp")
    return proto


def test_protobuf_chain_typed(jobs_server: ServerProcess, spark: SparkSession) -> None:
    layout = Layout.of(jobs_server.data_dir)
    create(jobs_server, "shipments", "typed")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(order_file())
    Order = message_factory.GetMessageClass(pool.FindMessageTypeByName("shoporder.Order"))
    sr = SchemaRegistryClient({"url": jobs_server.url})
    try:
        ser = ProtobufSerializer(Order, sr, {"use.deprecated.format": False})
        ctx = SerializationContext("shipments", MessageField.VALUE)
        first = Order(item="pen", qty=3, tags=["a", "b"], kind=1, attrs={"w": 7})
        first.ship.city = "Oslo"
        first.at.FromMicroseconds(1_700_000_000_000_000)
        blobs = [ser(first, ctx), ser(Order(item="cap"), ctx)]
        produce(jobs_server, "shipments", [b for b in blobs if b is not None])
        wait_typed(layout, "shipments", 2)
        got = read_topic(spark, "shipments").orderBy("offset").collect()
        assert [(r["item"], r["qty"], r["tags"], r["ship"], r["kind"], r["attrs"])
                for r in got] == [("pen", 3, ["a", "b"], Row(city="Oslo"), "B", {"w": 7}),
                                  ("cap", 0, [], None, "A", {})]
        assert got[0]["at"].timestamp() == 1_700_000_000 and got[1]["at"] is None
    finally:
        sr.close()
