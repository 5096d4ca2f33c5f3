"""Protobuf in the schema registry through confluent-kafka's ``ProtobufSerializer`` and
``ProtobufDeserializer`` (which register and read a serialized FileDescriptorProto), a
message class made at run time from a descriptor as protoc's output would hold it."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.server import ServerProcess

F = descriptor_pb2.FieldDescriptorProto


def user_file(package: str, age_type: int = F.TYPE_INT32, with_email: bool = False
              ) -> descriptor_pb2.FileDescriptorProto:
    """``message User { string name = 1; int32 age = 2; [string email = 3;] }``."""
    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package,
                                               syntax="proto3")
    user = proto.message_type.add(name="User")
    user.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    user.field.add(name="age", number=2, type=age_type, label=F.LABEL_OPTIONAL)
    if with_email:
        user.field.add(name="email", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return proto


def message_class(proto: descriptor_pb2.FileDescriptorProto) -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.User"))


def b64(proto: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.standard_b64encode(proto.SerializeToString()).decode()


@pytest.fixture
def sr(server: ServerProcess) -> Iterator[SchemaRegistryClient]:
    client = SchemaRegistryClient({"url": server.url})
    yield client
    client.close()


def test_protobuf_round_trip_and_compatibility(server: ServerProcess,
                                               sr: SchemaRegistryClient) -> None:
    package = f"p{uuid.uuid4().hex[:10]}"
    topic = f"t-{package}"
    proto = user_file(package)
    User = message_class(proto)
    ctx = SerializationContext(topic, MessageField.VALUE)
    serialize = ProtobufSerializer(User, sr, {"use.deprecated.format": False})
    blob = serialize(User(name="ann", age=3), ctx)
    schema_id = int.from_bytes(blob[1:5], "big")
    assert sr.get_schema(schema_id).schema_type == "PROTOBUF"
    with server.client() as c:
        assert c.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                      ).status_code == 201
        r = c.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": "0", "value": {"type": "BINARY", "data": base64.b64encode(blob).decode()}},
            {"id": "1", "value": {"type": "PROTOBUF", "data": {"name": "bo", "age": 40}}},
            {"id": "2", "value": {"type": "PROTOBUF", "data": {"name": "cy", "age": "old"}}}]})
        assert r.status_code == 207, r.text
        assert [f["id"] for f in r.json()["failures"]] == ["2"]
        assert r.json()["failures"][0]["error_code"] == 42201
        records = c.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}
                        ).json()["records"]
    read = ProtobufDeserializer(User, {"use.deprecated.format": False})
    got = [read(base64.b64decode(rec["value"]["data"]), ctx) for rec in records]
    assert [(m.name, m.age) for m in got] == [("ann", 3), ("bo", 40)]
    # A new field is compatible; a field whose wire type changes is not (409).
    subject = f"{topic}-value"
    assert sr.register_schema(subject, Schema(b64(user_file(package, with_email=True)),
                                              "PROTOBUF")) != schema_id
    with pytest.raises(SchemaRegistryError) as info:
        sr.register_schema(subject, Schema(b64(user_file(package, F.TYPE_STRING)),
                                           "PROTOBUF"))
    assert info.value.error_code == 409 and "age (field 2)" in info.value.error_message
    # .proto text is refused, saying what is taken.
    r = httpx.post(f"{server.url}/subjects/{subject}/versions", json={
        "schema": 'syntax = "proto3"; message X { string a = 1; }', "schemaType": "PROTOBUF"})
    assert r.json()["error_code"] == 42201 and "FileDescriptorProto" in r.json()["message"]


def test_a_batch_whose_only_schema_envelope_fails_answers_it(server: ServerProcess) -> None:
    """schemathesis found a 500: a batch whose one schema envelope failed before any was
    encoded kept the envelope, and the columns could not take it."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    with server.client() as c:
        assert c.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                      ).status_code == 201
        for kind in ("PROTOBUF", "AVRO", "JSONSCHEMA"):
            r = c.post(f"/topics/{topic}/records:batch", json={"entries": [
                {"id": "0", "headers": [], "value": {"type": kind, "data": None}}]})
            assert r.status_code == 207, r.text
            [failure] = r.json()["failures"]
            assert failure["error_code"] == 40401, failure  # no subject {topic}-value


def test_a_proto2_required_field_missing_fails_the_record(server: ServerProcess) -> None:
    package = f"p{uuid.uuid4().hex[:10]}"
    topic = f"t-{package}"
    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package,
                                               syntax="proto2")
    order = proto.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_REQUIRED)
    order.field.add(name="note", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    with httpx.Client(base_url=server.url) as c, server.client() as v3:
        r = c.post(f"/subjects/{topic}-value/versions", json={"schema": b64(proto),
                                                             "schemaType": "PROTOBUF"})
        assert r.status_code == 200, r.text
        assert v3.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                       ).status_code == 201
        r = v3.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": "0", "value": {"type": "PROTOBUF", "data": {"id": "7", "note": "x"}}},
            {"id": "1", "value": {"type": "PROTOBUF", "data": {"note": "no id"}}}]})
        assert r.status_code == 207, r.text
        [failure] = r.json()["failures"]
        assert failure["id"] == "1" and failure["error_code"] == 42201
        assert "required" in failure["message"] and "id" in failure["message"]
