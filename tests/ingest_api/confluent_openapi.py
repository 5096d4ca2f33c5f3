"""An OpenAPI 3.0 document of the operations lakelog shares with Confluent REST Proxy v3,
built from the schemas in ``confluent_v3.py``, for schemathesis (``test_schemathesis.py``).

Each operation answers the statuses Confluent's document gives it (200/201/204/207 and
400, 401, 429, 5XX; 404 where it lists one; 413, 415 and 422 on produce), plus the 404
Confluent's own server answers for an unknown group, broker or partition where the
document forgets it. Request bodies are what lakelog takes: Confluent's, with the
differences the Confluent section of docs/http-api.md names (unknown fields refused, so objects are
closed; a replication factor up to the live brokers, one here; batch entry ids of 1 to
256 characters). Values that only one topic config takes are pinned to
``compression.type`` by the test's configuration.
"""

from __future__ import annotations

from typing import Any

from tests.ingest_api import confluent_v3 as v3

Schema = dict[str, Any]
NULL: Schema = {"type": "null"}
MAX_TIMESTAMP_MS = 253_402_300_799_999
COMPRESSION = ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]


def _closed(properties: Schema, required: tuple[str, ...] = ()) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


BASE64: Schema = {"type": "string", "format": "byte"}
ENVELOPE: Schema = {"oneOf": [
    _closed({"type": {"enum": ["BINARY"]}, "data": {"oneOf": [BASE64, NULL]}}, ("type",)),
    _closed({"type": {"enum": ["STRING"]}, "data": {"type": ["string", "null"]}}, ("type",)),
    _closed({"type": {"enum": ["JSON"]}, "data": {}}, ("type",)),
    NULL]}
RECORD_FIELDS: Schema = {
    "partition_id": {"type": ["integer", "null"], "minimum": 0, "maximum": 1},
    "key": ENVELOPE, "value": ENVELOPE,
    "headers": {"type": ["array", "null"], "maxItems": 1_000, "items": _closed(
        {"name": {"type": "string", "minLength": 1, "maxLength": 32_768},
         "value": {"oneOf": [BASE64, NULL]}}, ("name",))},
    "timestamp": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TIMESTAMP_MS}}
RECORD = _closed(RECORD_FIELDS)
BATCH = _closed({"entries": {"type": "array", "minItems": 1, "maxItems": 1, "items": _closed(
    {"id": {"type": "string", "minLength": 1, "maxLength": 256}, **RECORD_FIELDS},
    ("id",))}}, ("entries",))
CONFIG_VALUE: Schema = {"enum": [*COMPRESSION, None]}
CONFIG_UPDATE = _closed({"value": CONFIG_VALUE})
CONFIG_ALTER = _closed({
    "data": {"type": "array", "items": _closed(
        {"name": {"enum": ["compression.type"]}, "value": CONFIG_VALUE,
         "operation": {"enum": ["SET", "DELETE", None]}}, ("name",))},
    "validate_only": {"type": "boolean"}}, ("data",))


def _param(name: str, schema: Schema, where: str = "path") -> Schema:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


CLUSTER_ID = _param("cluster_id", {"type": "string"})
TOPIC = _param("topic_name", {"type": "string"})
PARTITION = _param("partition_id", {"type": "integer"})
BROKER = _param("broker_id", {"type": "integer"})
GROUP = _param("consumer_group_id", {"type": "string"})
CONSUMER = _param("consumer_id", {"type": "string"})
CONFIG = _param("name", {"type": "string"})


def _json(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def _operation(ok: int, body: Schema | None, *, not_found: bool = True,
               produce: bool = False, request: Schema | None = None,
               query: tuple[Schema, ...] = (), operation_id: str | None = None,
               conflict: bool = False) -> Schema:
    error = {"description": "an error", **_json(v3.ERROR)}
    responses: Schema = {str(ok): {"description": "ok", **(_json(body) if body else {})},
                         "400": error, "401": error, "429": error, "5XX": error}
    if not_found:
        responses["404"] = error
    if produce:
        responses.update({"413": error, "415": error, "422": error})
    if conflict:
        responses["409"] = error
    op: Schema = {"responses": responses}
    if operation_id:
        op["operationId"] = operation_id
    if query:
        op["parameters"] = list(query)
    if request is not None:
        op["requestBody"] = {"required": True, **_json(request)}
    return op


def _path(params: list[Schema], **operations: Schema) -> Schema:
    return {"parameters": params, **operations}


def document() -> Schema:
    """The document: paths under ``/v3``."""
    c, t, p = "/clusters/{cluster_id}", "/topics/{topic_name}", "/partitions/{partition_id}"
    g = "/consumer-groups/{consumer_group_id}"
    ct, ctp = [CLUSTER_ID, TOPIC], [CLUSTER_ID, TOPIC, PARTITION]
    cg, cgc = [CLUSTER_ID, GROUP], [CLUSTER_ID, GROUP, CONSUMER]
    include = _param("include_authorized_operations", {"type": "boolean"}, "query")
    offset_type = _param("offset_type", {"enum": ["earliest_and_latest"]}, "query")
    paths: Schema = {
        "/clusters": _path([], get=_operation(200, v3.CLUSTER_LIST, not_found=False)),
        c: _path([CLUSTER_ID], get=_operation(200, v3.CLUSTER)),
        f"{c}/brokers": _path([CLUSTER_ID], get=_operation(200, v3.BROKER_LIST)),
        f"{c}/brokers/{{broker_id}}": _path([CLUSTER_ID, BROKER],
                                            get=_operation(200, v3.BROKER)),
        f"{c}/brokers/{{broker_id}}/configs": _path(
            [CLUSTER_ID, BROKER], get=_operation(200, v3.BROKER_CONFIG_LIST)),
        f"{c}/brokers/{{broker_id}}/partition-replicas": _path(
            [CLUSTER_ID, BROKER], get=_operation(200, v3.REPLICA_LIST)),
        f"{c}/broker-configs": _path([CLUSTER_ID], get=_operation(200, v3.CLUSTER_CONFIG_LIST)),
        # Creating, growing and deleting topics are declared (their methods exist) but not
        # fuzzed: test_confluent.py and test_confluent_statuses.py test them one by one.
        f"{c}/topics": _path([CLUSTER_ID], get=_operation(200, v3.TOPIC_LIST),
                             post=_operation(201, v3.TOPIC, operation_id="createTopic",
                                             request={"type": "object"})),
        f"{c}{t}": _path(ct, get=_operation(200, v3.TOPIC, query=(include,)),
                         patch=_operation(200, v3.TOPIC, query=(include,),
                                          operation_id="updatePartitionCount",
                                          request={"type": "object"}),
                         delete=_operation(204, None, query=(include,),
                                           operation_id="deleteTopic")),
        f"{c}{t}/configs": _path(ct, get=_operation(200, v3.TOPIC_CONFIG_LIST)),
        f"{c}{t}/configs:alter": _path(ct, post=_operation(204, None, request=CONFIG_ALTER)),
        f"{c}{t}/configs/{{name}}": _path(
            [*ct, CONFIG], get=_operation(200, v3.TOPIC_CONFIG),
            put=_operation(204, None, request=CONFIG_UPDATE), delete=_operation(204, None)),
        f"{c}{t}/partitions": _path(ct, get=_operation(200, v3.PARTITION_LIST)),
        f"{c}{t}{p}": _path(ctp, get=_operation(200, v3.PARTITION)),
        f"{c}{t}{p}/offset": _path(ctp, get=_operation(200, v3.PARTITION_OFFSETS,
                                                       query=(offset_type,))),
        f"{c}/topics/-/partitions/-/reassignment": _path(
            [CLUSTER_ID], get=_operation(200, v3.REASSIGNMENT_LIST)),
        f"{c}{t}/partitions/-/reassignment": _path(
            ct, get=_operation(200, v3.REASSIGNMENT_LIST)),
        f"{c}{t}{p}/reassignment": _path(ctp, get=_operation(200, v3.REASSIGNMENT)),
        f"{c}{t}{p}/replicas": _path(ctp, get=_operation(200, v3.REPLICA_LIST)),
        f"{c}{t}{p}/replicas/{{broker_id}}": _path([*ctp, BROKER],
                                                   get=_operation(200, v3.REPLICA)),
        f"{c}{t}/records": _path(ct, post=_operation(200, v3.PRODUCE_RESPONSE, produce=True,
                                                     request=RECORD)),
        f"{c}{t}/records:batch": _path(ct, post=_operation(207, v3.BATCH_RESPONSE,
                                                           produce=True, request=BATCH)),
        f"{c}/consumer-groups": _path([CLUSTER_ID],
                                      get=_operation(200, v3.CONSUMER_GROUP_LIST)),
        # lakelog adds DELETE (Kafka's DeleteGroups): 409 while the group has members.
        f"{c}{g}": _path(cg, get=_operation(200, v3.CONSUMER_GROUP),
                         delete=_operation(204, None, conflict=True)),
        f"{c}{g}/lags": _path(cg, get=_operation(200, v3.LAG_LIST)),
        f"{c}{g}/lags/{{topic_name}}/partitions/{{partition_id}}": _path(
            [*cg, TOPIC, PARTITION], get=_operation(200, v3.LAG)),
        f"{c}{g}/lag-summary": _path(cg, get=_operation(200, v3.LAG_SUMMARY)),
        f"{c}{g}/consumers": _path(cg, get=_operation(200, v3.CONSUMER_LIST)),
        f"{c}{g}/consumers/{{consumer_id}}": _path(cgc, get=_operation(200, v3.CONSUMER)),
        f"{c}{g}/consumers/{{consumer_id}}/assignments": _path(
            cgc, get=_operation(200, v3.ASSIGNMENT_LIST)),
    }
    return {"openapi": "3.0.0", "info": {"title": "lakelog as Confluent REST v3",
                                         "version": "3.0.0"},
            "servers": [{"url": "/v3"}], "paths": _openapi30(paths)}


def _openapi30(node: Any) -> Any:
    """JSON Schema 2020-12 spellings (``type: [x, "null"]``, ``const``) as OpenAPI 3.0's
    (``nullable``, ``enum``), which schemathesis reads for a 3.0 document."""
    if isinstance(node, list):
        return [_openapi30(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi30(v) for k, v in node.items()}
    kind = out.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        out["type"] = rest[0]
        if "null" in kind:
            out["nullable"] = True
    if out.get("type") == "null":
        return {"nullable": True, "enum": [None]}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "enum" in out and None in out["enum"]:
        out["nullable"] = True
    return out
