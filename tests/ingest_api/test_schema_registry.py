"""The schema registry through a client nobody here wrote: confluent-kafka's
``SchemaRegistryClient`` and its Avro and JSON Schema serializers against a real
``lakelog serve``, records produced over HTTP in Confluent's wire format (magic byte,
schema id, payload) and read back by the deserializers. Bad input gets Confluent's codes.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.server import CLUSTER, ServerProcess

USER_V1 = ('{"type": "record", "name": "User", "namespace": "shop", "fields": '
           '[{"name": "name", "type": "string"}]}')
USER_V2 = ('{"type": "record", "name": "User", "namespace": "shop", "fields": '
           '[{"name": "name", "type": "string"}, {"name": "age", "type": "int", '
           '"default": 0}]}')
USER_BAD = ('{"type": "record", "name": "User", "namespace": "shop", "fields": '
            '[{"name": "name", "type": "int"}]}')


_OPEN: list[SchemaRegistryClient] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def registry(server: ServerProcess) -> SchemaRegistryClient:
    """A fresh client (no cache): closed after the test."""
    client = SchemaRegistryClient({"url": server.url})
    _OPEN.append(client)
    return client


def fresh(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def refused(call: Callable[[], object]) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as info:
        call()
    return info.value


def produce_and_read(server: ServerProcess, topic: str, blobs: list[bytes]) -> list[bytes]:
    """Produce the blobs as BINARY values over HTTP; the values read back."""
    with server.client() as c:
        assert c.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                      ).status_code == 201
        entries = [{"id": str(i), "value": {"type": "BINARY",
                                            "data": base64.b64encode(b).decode()}}
                   for i, b in enumerate(blobs)]
        r = c.post(f"/topics/{topic}/records:batch", json={"entries": entries})
        assert r.status_code == 207 and not r.json()["failures"], r.text
        got = c.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}).json()
    return [base64.b64decode(rec["value"]["data"]) for rec in got["records"]]


def test_avro_round_trip_and_evolution(server: ServerProcess) -> None:
    topic = fresh()
    subject = f"{topic}-value"
    sr = registry(server)
    first = sr.register_schema(subject, Schema(USER_V1, "AVRO"))
    # The same schema (other whitespace) keeps its id; a compatible change is version 2.
    assert sr.register_schema(subject, Schema(USER_V1.replace(" ", ""), "AVRO")) == first
    assert sr.test_compatibility(subject, Schema(USER_V2, "AVRO"))
    second = sr.register_schema(subject, Schema(USER_V2, "AVRO"))
    assert second > first
    assert sr.get_versions(subject) == [1, 2]
    latest = sr.get_latest_version(subject)
    assert (latest.version, latest.schema_id) == (2, second)
    # An incompatible one is refused before any record uses it (Confluent's 409).
    err = refused(lambda: sr.register_schema(subject, Schema(USER_BAD, "AVRO")))
    assert (err.http_status_code, err.error_code) == (409, 409)
    assert "/fields/0" in err.error_message
    assert not sr.test_compatibility(subject, Schema(USER_BAD, "AVRO"))
    # Confluent's wire format through lakelog's HTTP produce and fetch, read by a client
    # that knows no schema yet (it asks for the id).
    ctx = SerializationContext(topic, MessageField.VALUE)
    serialize = AvroSerializer(sr, USER_V2)
    blobs = [serialize({"name": n, "age": a}, ctx) for n, a in (("ann", 3), ("bo", 40))]
    assert blobs[0][0] == 0 and int.from_bytes(blobs[0][1:5], "big") == second
    read = produce_and_read(server, topic, blobs)
    deserialize = AvroDeserializer(registry(server))
    assert [deserialize(b, ctx) for b in read] == [{"name": "ann", "age": 3},
                                                   {"name": "bo", "age": 40}]
    # Data written with version 1 read with version 2: the default fills in.
    old = AvroSerializer(registry(server), USER_V1, conf={"auto.register.schemas": False,
                                                           "use.latest.version": False})
    with_v1 = old({"name": "cy"}, ctx)
    assert int.from_bytes(with_v1[1:5], "big") == first
    reader = AvroDeserializer(registry(server), USER_V2)
    assert reader(with_v1, ctx) == {"name": "cy", "age": 0}


def test_json_schema_round_trip(server: ServerProcess) -> None:
    topic = fresh()
    subject = f"{topic}-value"
    sr = registry(server)
    order = ('{"type": "object", "properties": {"id": {"type": "integer"}, '
             '"note": {"type": "string"}}, "required": ["id"]}')
    ctx = SerializationContext(topic, MessageField.VALUE)
    blob = JSONSerializer(order, sr)({"id": 7, "note": "x"}, ctx)
    read = produce_and_read(server, topic, [blob])
    assert JSONDeserializer(None, schema_registry_client=registry(server))(read[0], ctx) == {
        "id": 7, "note": "x"}
    schema_id = int.from_bytes(blob[1:5], "big")
    assert sr.get_schema(schema_id).schema_type == "JSON"
    # A reader that requires a property the earlier writer did not: refused.
    stricter = order.replace('"required": ["id"]', '"required": ["id", "note"]')
    err = refused(lambda: sr.register_schema(subject, Schema(stricter, "JSON")))
    assert err.error_code == 409 and "note" in err.error_message
    # Widening a type is allowed (an integer read as a number).
    wider = order.replace('"id": {"type": "integer"}', '"id": {"type": "number"}')
    assert sr.register_schema(subject, Schema(wider, "JSON")) != schema_id


def unique(schema: str) -> str:
    """The schema in a namespace of its own: no other test's subject shares its id."""
    return schema.replace('"namespace": "shop"', f'"namespace": "n{uuid.uuid4().hex}"')


def test_deletes_soft_then_permanent(server: ServerProcess) -> None:
    subject = f"{fresh()}-value"
    sr = registry(server)
    user_v2 = unique(USER_V2)
    sr.register_schema(subject, Schema(user_v2.replace(
        ', {"name": "age", "type": "int", "default": 0}', ""), "AVRO"))
    v2 = sr.register_schema(subject, Schema(user_v2, "AVRO"))
    # A version deleted for good must be soft-deleted first (40407); soft twice is 40406.
    assert refused(lambda: sr.delete_version(subject, 2, permanent=True)).error_code == 40407
    assert sr.delete_version(subject, 2) == 2
    assert refused(lambda: sr.delete_version(subject, 2)).error_code == 40406
    assert sr.get_versions(subject) == [1]
    assert sr.get_latest_version(subject).version == 1
    assert sr.get_schema(v2).schema_str  # still readable by id while soft-deleted
    # A subject the same: soft (its versions listed), then permanent.
    assert refused(lambda: sr.delete_subject(subject, permanent=True)).error_code == 40405
    assert sr.delete_subject(subject) == [1]
    assert subject not in sr.get_subjects()
    assert refused(lambda: sr.get_versions(subject)).error_code == 40401
    assert refused(lambda: sr.delete_subject(subject)).error_code == 40404
    assert sorted(sr.delete_subject(subject, permanent=True)) == [1, 2]
    assert refused(lambda: registry(server).get_schema(v2)).error_code == 40403  # uncached
    # Registered again: version 1 anew, and never an id given before.
    again = sr.register_schema(subject, Schema(user_v2, "AVRO"))
    assert again > v2 and sr.get_latest_version(subject).version == 1


def test_levels_modes_and_references(server: ServerProcess) -> None:
    sr = registry(server)
    subject = f"{fresh()}-value"
    sr.register_schema(subject, Schema(USER_V1, "AVRO"))
    with httpx.Client(base_url=server.url) as c:
        r = c.put(f"/config/{subject}", json={"compatibility": "NONE"})
        assert r.json() == {"compatibility": "NONE"}
        assert c.get(f"/config/{subject}").json() == {"compatibilityLevel": "NONE"}
        # NONE: anything goes.
        assert sr.register_schema(subject, Schema(USER_BAD, "AVRO")) > 0
        other = f"{fresh()}-value"
        assert c.get(f"/config/{other}").json()["error_code"] == 40408
        assert c.get(f"/config/{other}", params={"defaultToGlobal": "true"}).json() == {
            "compatibilityLevel": "BACKWARD"}
        bad = c.put(f"/config/{subject}", json={"compatibility": "SIDEWAYS"})
        assert (bad.status_code, bad.json()["error_code"]) == (422, 42203)
        assert c.delete(f"/config/{subject}").json() == {"compatibilityLevel": "NONE"}
        # READONLY refuses registering (42205), and only for its subject.
        assert c.put(f"/mode/{subject}", json={"mode": "READONLY"}).json() == {
            "mode": "READONLY"}
        err = refused(lambda: sr.register_schema(subject, Schema(USER_V2, "AVRO")))
        assert (err.http_status_code, err.error_code) == (422, 42205)
        assert c.delete(f"/mode/{subject}").json() == {"mode": "READONLY"}
        assert c.get("/mode").json() == {"mode": "READWRITE"}
    # A schema that uses another subject's named type; that version cannot be deleted
    # while it is used.
    address = f"{fresh()}-value"
    sr.register_schema(address, Schema('{"type": "record", "name": "Address", "namespace": '
                                       '"shop", "fields": [{"name": "city", "type": '
                                       '"string"}]}', "AVRO"))
    customer = f"{fresh()}-value"
    ref = SchemaReference("shop.Address", address, 1)
    sid = sr.register_schema(customer, Schema(
        '{"type": "record", "name": "Customer", "namespace": "shop", "fields": '
        '[{"name": "home", "type": "shop.Address"}]}', "AVRO", [ref]))
    got = sr.get_schema(sid)
    assert [(r.name, r.subject, r.version) for r in got.references] == [
        ("shop.Address", address, 1)]
    assert refused(lambda: sr.delete_version(address, 1)).error_code == 42206
    # Serialized with the subject's latest version, read by a client that fetches the
    # reference too.
    ctx = SerializationContext("customers", MessageField.VALUE)
    blob = AvroSerializer(sr, None, conf={
        "auto.register.schemas": False, "use.latest.version": True,
        "subject.name.strategy": lambda _ctx, _name: customer})({"home": {"city": "Oslo"}},
                                                                 ctx)
    assert int.from_bytes(blob[1:5], "big") == sid
    assert AvroDeserializer(registry(server))(blob, ctx) == {"home": {"city": "Oslo"}}
    missing = SchemaReference("shop.Nope", f"{fresh()}-value", 1)
    err = refused(lambda: sr.register_schema(f"{fresh()}-value", Schema(
        '{"type": "record", "name": "C", "fields": [{"name": "x", "type": "shop.Nope"}]}',
        "AVRO", [missing])))
    assert err.error_code == 42201


def test_bad_input_gets_confluents_codes(server: ServerProcess) -> None:
    subject = f"{fresh()}-value"
    with httpx.Client(base_url=server.url) as c:
        def post(body: object) -> httpx.Response:
            return c.post(f"/subjects/{subject}/versions", json=body)
        r = post({"schema": '{"type": "record", "name": "X"}'})  # no fields
        assert (r.status_code, r.json()["error_code"]) == (422, 42201), r.text
        assert "Avro" in r.json()["message"]
        r = post({"schema": "{not json"})
        assert r.json()["error_code"] == 42201
        r = post({"schema": '{"type": "object"}', "schemaType": "XML"})
        assert r.json()["error_code"] == 42201 and "AVRO" in r.json()["message"]
        r = post({"schema": "syntax = \"proto3\";", "schemaType": "PROTOBUF"})
        assert r.json()["error_code"] == 42201 and "FileDescriptorProto" in r.json()["message"]
        r = post({"schema": '{"type": 12}', "schemaType": "JSON"})
        assert r.json()["error_code"] == 42201 and "JSON Schema" in r.json()["message"]
        r = post({"nothing": 1})
        assert r.status_code == 422
        for version in ("0", "abc", "-2"):
            r = c.get(f"/subjects/{subject}/versions/{version}")
            assert (r.status_code, r.json()["error_code"]) == (422, 42202), version
        assert c.get(f"/subjects/{subject}/versions").json()["error_code"] == 40401
        assert c.get("/schemas/ids/987654").json()["error_code"] == 40403
        assert c.get("/schemas/types").json() == ["AVRO", "JSON", "PROTOBUF"]
        # Nothing of the refused requests was kept.
        assert subject not in c.get("/subjects").json()
        # lakelog's own topic is no user's to write or delete.
        assert c.post(CLUSTER + "/topics/__schemas/records",
                      json={"value": {"type": "STRING", "data": "x"}}).status_code == 400
        assert c.delete(CLUSTER + "/topics/__schemas").status_code == 400


def test_ids_survive_a_kill_and_are_never_given_twice(
        spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = spawn_server()
    sr = registry(server)
    a = sr.register_schema("a-value", Schema(USER_V1, "AVRO"))
    b = sr.register_schema("b-value", Schema(USER_BAD, "AVRO"))
    # The highest id deleted for good before the kill: its number is not given again.
    sr.delete_subject("b-value")
    sr.delete_subject("b-value", permanent=True)
    server.kill()
    server.start()
    sr = registry(server)
    assert sr.get_schema(a).schema_str == registry(server).get_latest_version(
        "a-value").schema.schema_str
    assert sr.get_subjects() == ["a-value"]
    c = sr.register_schema("c-value", Schema(USER_V2, "AVRO"))
    assert c > b > a


def test_api_keys_and_acls_apply(spawn_server: Callable[..., ServerProcess]) -> None:
    """A subject ``<topic>-value`` is its topic's: registering needs produce on it,
    reading describe, deleting alter; the global level is the cluster admin's."""
    server = spawn_server(auth="api-key")
    admin_key = (server.data_dir / "security" / "admin.key").read_text().strip()
    with server.client(auth=tuple(admin_key.split(":", 1))) as admin:
        alice = admin.post("/api-keys", json={"principal": "alice"}).json()
        assert admin.post("/acls", json={
            "principal": "alice", "operation": "produce", "resource_type": "topic",
            "resource_name": "orders", "pattern_type": "literal"}).status_code == 201
    admin_sr = SchemaRegistryClient({"url": server.url, "basic.auth.user.info": admin_key})
    alice_sr = SchemaRegistryClient({"url": server.url, "basic.auth.user.info":
                                     f"{alice['key_id']}:{alice['secret']}"})
    _OPEN.extend([admin_sr, alice_sr])
    assert admin_sr.register_schema("payments-value", Schema(USER_V1, "AVRO")) > 0
    assert alice_sr.register_schema("orders-value", Schema(USER_V1, "AVRO")) > 0
    assert alice_sr.get_subjects() == ["orders-value"]  # payments-value is not hers
    err = refused(lambda: alice_sr.register_schema("payments-value", Schema(USER_V2, "AVRO")))
    assert (err.http_status_code, err.error_code) == (403, 40301)
    assert refused(lambda: alice_sr.get_versions("payments-value")).error_code == 40301
    assert refused(lambda: alice_sr.delete_subject("orders-value")).error_code == 40301
    with httpx.Client(base_url=server.url, auth=(alice["key_id"], alice["secret"])) as c:
        r = c.put("/config", json={"compatibility": "NONE"})
        assert (r.status_code, r.json()["error_code"]) == (403, 40301)
        # IMPORT mode and explicit ids give cluster-wide ids: the cluster admin's.
        r = c.put("/mode/orders-value", json={"mode": "IMPORT"})
        assert (r.status_code, r.json()["error_code"]) == (403, 40301)
        r = c.post("/subjects/orders-value/versions", json={"schema": USER_V2, "id": 77,
                                                            "version": 9})
        assert (r.status_code, r.json()["error_code"]) == (403, 40301)
    assert httpx.get(server.url + "/subjects").status_code == 401
    assert sorted(admin_sr.get_subjects()) == ["orders-value", "payments-value"]


def test_produce_with_schemas(server: ServerProcess) -> None:
    """Confluent REST v3's AVRO and JSONSCHEMA envelopes: the data is checked against the
    schema (by id, or the subject's version, the latest by default) and stored in
    Confluent's wire format, which Confluent's deserializers read; a record that does not
    fit fails alone."""
    topic = fresh()
    sr = registry(server)
    user = unique(USER_V2)
    v1 = sr.register_schema(f"{topic}-value", Schema(user.replace(
        ', {"name": "age", "type": "int", "default": 0}', ""), "AVRO"))
    v2 = sr.register_schema(f"{topic}-value", Schema(user, "AVRO"))
    key_id = sr.register_schema(f"{topic}-key", Schema(
        '{"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}',
        "JSON"))
    entries = [
        {"id": "latest", "key": {"type": "JSONSCHEMA", "data": {"k": 1}},
         "value": {"type": "AVRO", "data": {"name": "ann", "age": 3}}},
        {"id": "by-id", "value": {"type": "AVRO", "schema_id": v1, "data": {"name": "bo"}}},
        {"id": "by-version", "value": {"type": "AVRO", "schema_version": 1,
                                       "data": {"name": "cy"}}},
        {"id": "by-subject", "value": {"type": "AVRO", "subject": f"{topic}-value",
                                       "schema_version": 2, "data": {"name": "di", "age": 9}}},
        {"id": "misfit", "value": {"type": "AVRO", "data": {"name": "ed", "age": "old"}}},
        {"id": "no-subject", "value": {"type": "AVRO", "subject": f"{fresh()}-value",
                                       "data": {"name": "fa"}}},
        {"id": "wrong-type", "value": {"type": "JSONSCHEMA", "schema_id": v2, "data": {}}},
        {"id": "key-misfit", "key": {"type": "JSONSCHEMA", "data": {"k": "one"}},
         "value": {"type": "STRING", "data": "x"}},
        {"id": "protobuf", "value": {"type": "PROTOBUF", "data": {}}},
        {"id": "plain", "value": {"type": "STRING", "data": "no schema"}},
    ]
    with server.client() as c:
        assert c.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                      ).status_code == 201
        r = c.post(f"/topics/{topic}/records:batch", json={"entries": entries})
        assert r.status_code == 207, r.text
        ok = {s["id"]: s for s in r.json()["successes"]}
        failed = {f["id"]: f for f in r.json()["failures"]}
        assert set(ok) == {"latest", "by-id", "by-version", "by-subject", "plain"}
        assert ok["latest"]["value"]["type"] == "AVRO"
        assert ok["latest"]["key"]["type"] == "JSONSCHEMA"
        assert {i: (f["error_code"], f["error"]) for i, f in failed.items()} == {
            "misfit": (42201, "invalid_record"), "no-subject": (40401, "subject_not_found"),
            "wrong-type": (42201, "invalid_record"), "key-misfit": (42201, "invalid_record"),
            "protobuf": (42201, "invalid_record")}  # the subject's schema is Avro
        assert "User.age" in failed["misfit"]["message"]
        assert "key does not fit JSON Schema" in failed["key-misfit"]["message"]
        assert "at /k" in failed["key-misfit"]["message"]
        # The single-record endpoint too: a misfit is refused whole.
        r = c.post(f"/topics/{topic}/records", json={
            "value": {"type": "AVRO", "schema_id": v2, "data": {"name": 5}}})
        assert (r.status_code, r.json()["error_code"]) == (422, 42201)
        got = c.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}).json()
    records = got["records"]
    assert len(records) == 5
    ctx = SerializationContext(topic, MessageField.VALUE)
    read = AvroDeserializer(registry(server))
    values = [read(base64.b64decode(rec["value"]["data"]), ctx) for rec in records[:4]]
    assert values == [{"name": "ann", "age": 3}, {"name": "bo"}, {"name": "cy"},
                      {"name": "di", "age": 9}]
    ids = [int.from_bytes(base64.b64decode(rec["value"]["data"])[1:5], "big")
           for rec in records[:4]]
    assert ids == [v2, v1, v1, v2]
    key = base64.b64decode(records[0]["key"]["data"])
    assert key[0] == 0 and int.from_bytes(key[1:5], "big") == key_id
    key_ctx = SerializationContext(topic, MessageField.KEY)
    assert JSONDeserializer(None, schema_registry_client=registry(server))(key, key_ctx) == {
        "k": 1}


def test_topic_refuses_unregistered_data(server: ServerProcess) -> None:
    """confluent.value.schema.validation: only Confluent's wire format with an id of the
    value's subject is taken (a tombstone passes); by TopicNameStrategy and by
    RecordNameStrategy."""
    sr = registry(server)
    user = unique(USER_V1)
    topic, other = fresh(), fresh()
    mine = sr.register_schema(f"{topic}-value", Schema(user, "AVRO"))
    theirs = sr.register_schema(f"{other}-value", Schema(unique(USER_V1), "AVRO"))
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = AvroSerializer(sr, user)({"name": "ann"}, ctx)
    wrong_subject = b"\x00" + theirs.to_bytes(4, "big") + good[5:]
    unknown = b"\x00" + (2**31 - 5).to_bytes(4, "big") + good[5:]

    def b64(blob: bytes) -> dict[str, str]:
        return {"type": "BINARY", "data": base64.b64encode(blob).decode()}

    with server.client() as c:
        r = c.post("/topics", json={"topic_name": topic, "partitions_count": 1, "configs": [
            {"name": "confluent.value.schema.validation", "value": "true"}]})
        assert r.status_code == 201, r.text
        r = c.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": "good", "value": b64(good)},
            {"id": "envelope", "value": {"type": "AVRO", "data": {"name": "bo"}}},
            {"id": "tombstone", "key": {"type": "STRING", "data": "k"}},
            {"id": "plain", "value": {"type": "STRING", "data": "not framed"}},
            {"id": "wrong-subject", "value": b64(wrong_subject)},
            {"id": "unknown", "value": b64(unknown)}]})
        assert r.status_code == 207
        assert sorted(s["id"] for s in r.json()["successes"]) == ["envelope", "good",
                                                                  "tombstone"]
        why = {f["id"]: (f["error_code"], f["message"]) for f in r.json()["failures"]}
        assert why["plain"][0] == 42201 and "wire format" in why["plain"][1]
        assert f"not registered under subject '{topic}-value'" in why["wrong-subject"][1]
        assert "is not registered" in why["unknown"][1]
        r = c.post(f"/topics/{topic}/records", json={"value": {"type": "STRING", "data": "x"}})
        assert (r.status_code, r.json()["error_code"]) == (422, 42201)
        # By the record's name: the subject is the schema's full name.
        named = fresh()
        full = json.loads(user)["namespace"] + ".User"
        by_name = sr.register_schema(full, Schema(user, "AVRO"))
        assert by_name == mine
        r = c.post("/topics", json={"topic_name": named, "partitions_count": 1, "configs": [
            {"name": "confluent.value.schema.validation", "value": "true"},
            {"name": "confluent.value.subject.name.strategy",
             "value": "io.confluent.kafka.serializers.subject.RecordNameStrategy"}]})
        assert r.status_code == 201, r.text
        r = c.post(f"/topics/{named}/records:batch", json={"entries": [
            {"id": "0", "value": b64(good)}, {"id": "1", "value": b64(wrong_subject)}]})
        assert [s["id"] for s in r.json()["successes"]] == ["0"]
        bad = c.post("/topics", json={"topic_name": fresh(), "configs": [
            {"name": "confluent.value.subject.name.strategy", "value": "Sideways"}]})
        assert bad.status_code == 400 and "TopicNameStrategy" in bad.json()["message"]


def test_what_an_outside_review_found(server: ServerProcess) -> None:
    """Each a 500 or a wrong answer before: a schema type spelled with a JSON escape on
    the single-record path, library errors of schemas their parsers take, unbounded
    import ids and versions, a look-up in a subject all soft-deleted."""
    topic = fresh()
    with httpx.Client(base_url=server.url) as c, server.client() as v3:
        assert v3.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                       ).status_code == 201
        # "\u0041VRO" is "AVRO": decoded as a schema envelope (no subject yet: 40401).
        r = v3.post(f"/topics/{topic}/records", content=b'{"value": {"type": "\\u0041VRO", '
                    b'"data": {"a": 1}}}', headers={"content-type": "application/json"})
        assert (r.status_code, r.json()["error_code"]) == (404, 40401), r.text
        # A default of the wrong type: Apache Avro's parser takes it, fastavro (which
        # writes the records) does not: refused when registered.
        r = c.post(f"/subjects/{topic}-value/versions", json={"schema": json.dumps(
            {"type": "record", "name": "R", "fields": [
                {"name": "a", "type": "int", "default": "x"}]})})
        assert r.json()["error_code"] == 42201, r.text
        # A JSON Schema whose $ref cannot be resolved: each record fails alone.
        r = c.post(f"/subjects/{topic}-value/versions", json={
            "schema": json.dumps({"$ref": "elsewhere.json"}), "schemaType": "JSON"})
        assert r.status_code == 200, r.text
        r = v3.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": "0", "value": {"type": "JSONSCHEMA", "data": {"a": 1}}},
            {"id": "1", "value": {"type": "STRING", "data": "plain"}}]})
        assert [f["error_code"] for f in r.json()["failures"]] == [42201], r.text
        # Nested past what a parser recurses: refused, not a 500.
        deep = '{"type": "array", "items": ' * 3000 + '{"type": "string"}' + "}" * 3000
        r = c.post(f"/subjects/{fresh()}-value/versions", json={
            "schema": deep, "schemaType": "JSON"})
        assert r.status_code == 422 and r.json()["error_code"] == 42201, r.text[:300]
        # Imports: ids and versions bounded, a schema keeps the id it has.
        subject = f"{fresh()}-value"
        assert c.put(f"/mode/{subject}", json={"mode": "IMPORT"}).status_code == 200
        user = unique(USER_V1)
        for bad in ({"id": 2**31}, {"version": 0}, {"version": -1}):
            r = c.post(f"/subjects/{subject}/versions", json={"schema": user, **bad})
            assert r.status_code == 422, (bad, r.text)
        r = c.post(f"/subjects/{subject}/versions", json={"schema": user, "id": 900001,
                                                          "version": 1})
        assert r.json() == {"id": 900001}
        r = c.post(f"/subjects/{subject}/versions", json={"schema": user, "id": 900002,
                                                          "version": 2})
        assert r.json()["error_code"] == 42205 and "900001" in r.json()["message"]
        # A look-up in a subject whose versions are all soft-deleted: 40401.
        assert c.delete(f"/mode/{subject}").status_code == 200
        assert c.delete(f"/subjects/{subject}").json() == [1]
        r = c.post(f"/subjects/{subject}", json={"schema": user})
        assert r.json()["error_code"] == 40401
        r = c.post(f"/subjects/{subject}", params={"deleted": "true"}, json={"schema": user})
        assert r.json()["id"] == 900001


def test_json_schema_references(server: ServerProcess) -> None:
    """A JSON Schema ``$ref`` to another subject's version, by the reference's name: it
    must exist when registered, and data is validated through it."""
    topic = fresh()
    address = {"type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"]}
    customer = {"type": "object", "properties": {"home": {"$ref": "address.json"}}}
    with httpx.Client(base_url=server.url) as c, server.client() as v3:
        r = c.post(f"/subjects/{topic}-address/versions", json={
            "schema": json.dumps(address), "schemaType": "JSON"})
        assert r.status_code == 200, r.text
        missing = c.post(f"/subjects/{topic}-value/versions", json={
            "schema": json.dumps(customer), "schemaType": "JSON", "references": [
                {"name": "address.json", "subject": f"{topic}-nowhere", "version": 1}]})
        assert missing.json()["error_code"] == 42201, missing.text
        r = c.post(f"/subjects/{topic}-value/versions", json={
            "schema": json.dumps(customer), "schemaType": "JSON", "references": [
                {"name": "address.json", "subject": f"{topic}-address", "version": 1}]})
        assert r.status_code == 200, r.text
        assert v3.post("/topics", json={"topic_name": topic, "partitions_count": 1}
                       ).status_code == 201
        r = v3.post(f"/topics/{topic}/records:batch", json={"entries": [
            {"id": "ok", "value": {"type": "JSONSCHEMA", "data": {"home": {"city": "Oslo"}}}},
            {"id": "bad", "value": {"type": "JSONSCHEMA", "data": {"home": {"city": 5}}}}]})
        assert [s["id"] for s in r.json()["successes"]] == ["ok"]
        [failure] = r.json()["failures"]
        assert failure["id"] == "bad" and "at /home/city" in failure["message"], failure
