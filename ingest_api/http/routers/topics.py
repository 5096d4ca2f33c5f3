"""Topics and their configs (Confluent REST v3 shapes); partitions are in ``partitions.py``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ingest_api.broker.metadata import METADATA
from ingest_api.broker.topics import NewTopic, ReplicaAssignment, TopicAdmin
from ingest_api.http.auth import may
from ingest_api.http.body import decode_request
from ingest_api.http.forwarding import internal as is_internal
from ingest_api.http.models import ConfigAlter, ConfigUpdate, TopicCreate, TopicPatch
from ingest_api.http.resources import CLUSTER, collection, related, resource, topic_url
from ingest_api.http.routers.cluster import check_cluster, forward
from ingest_api.http.state import CLUSTER_ID, json_body, json_response, state
from log_tables.config import CONFIG_BY_NAME, TopicConfig, config_value
from log_tables.errors import (
    InvalidParameterError,
)
from log_tables.registry import TopicMetadata

if TYPE_CHECKING:
    from cluster.model import BrokerInfo

router = APIRouter(tags=["topics"])
BASE = "/v3/clusters/{cluster_id}/topics"
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
_create = msgspec.json.Decoder(TopicCreate)
_patch = msgspec.json.Decoder(TopicPatch)
_update = msgspec.json.Decoder(ConfigUpdate)
_alter = msgspec.json.Decoder(ConfigAlter)
ADMIN_BODY_LIMIT = 1 << 20


def topic_body(meta: TopicMetadata, factor: int | None = None) -> dict[str, object]:
    """Confluent's ``TopicData`` (``topic_id`` is Kafka's, an addition)."""
    url = topic_url(meta.name)
    factor = METADATA.replication_factor(meta.name) if factor is None else factor
    return {**resource("KafkaTopic", url, f"topic={meta.name}"), "cluster_id": CLUSTER_ID,
            "topic_name": meta.name, "topic_id": meta.topic_id, "is_internal": False,
            "replication_factor": factor,
            "partitions_count": meta.partitions,
            "partitions": related(f"{url}/partitions"), "configs": related(f"{url}/configs"),
            "partition_reassignments": related(f"{url}/partitions/-/reassignment")}


def config_body(meta: TopicMetadata, name: str,
                broker_defaults: Mapping[str, str] | None = None) -> dict[str, object]:
    """Confluent's ``TopicConfigData`` (``default_value`` and ``documentation`` added);
    ``broker_defaults``: the broker's own defaults of topic configs (Kafka's
    STATIC_BROKER_CONFIG), which a topic's override wins over."""
    broker = broker_defaults or {}
    effective = config_value(name, meta.overrides, broker)
    value = str(effective).lower() if isinstance(effective, bool) else str(effective)
    default = TopicConfig().to_kafka()[name]
    synonyms = []
    if name in meta.overrides:
        synonyms.append({"name": name, "value": value, "source": "DYNAMIC_TOPIC_CONFIG"})
    if name in broker:
        synonyms.append({"name": name, "value": broker[name],
                         "source": "STATIC_BROKER_CONFIG"})
    synonyms.append({"name": name, "value": default, "source": "DEFAULT_CONFIG"})
    source = synonyms[0]["source"]
    return {**resource("KafkaTopicConfig", f"{topic_url(meta.name)}/configs/{name}",
                       f"topic={meta.name}/config={name}"),
            "cluster_id": CLUSTER_ID, "topic_name": meta.name,
            "name": name, "value": value, "is_default": source == "DEFAULT_CONFIG",
            "is_read_only": False, "is_sensitive": False, "source": source,
            "synonyms": synonyms, "default_value": default,
            "documentation": CONFIG_BY_NAME[name].doc}


@router.post(BASE, status_code=201, openapi_extra=json_body(TopicCreate))
async def create_topic(cluster_id: str, request: Request) -> Response:
    """Create a topic: ``topic_name``, ``partitions_count``, ``configs: [{name, value}]``;
    ``validate_only: true`` checks all of it and answers 200 with the topic that would be
    made, creating nothing."""
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, None)
    body = await decode_request(request, _create, ADMIN_BODY_LIMIT, 400)
    made = await admin.create(NewTopic(
        body.topic_name, body.partitions_count, body.replication_factor,
        None if body.replicas_assignments is None else tuple(
            ReplicaAssignment(a.partition_id, tuple(a.broker_ids))
            for a in body.replicas_assignments),
        tuple((c.name, c.value) for c in body.configs), body.validate_only,
        internal=is_internal(request)))
    if made.coordinator_slots and made.created:
        return json_response({"topic_name": made.topic.name,
                              "partitions_count": made.topic.partitions}, status=201)
    return json_response(topic_body(made.topic, made.replication_factor),
                         status=201 if made.created else 200)


@router.get(BASE)
async def list_topics(cluster_id: str, request: Request) -> Response:
    check_cluster(cluster_id)
    topics = [t for t in state(request).topic_admin.topics()
              if may(request, "topic", t.name, "describe")]
    return json_response(collection("KafkaTopicList", f"{CLUSTER}/topics",
                                    [topic_body(t) for t in topics]))


IncludeOperations = Annotated[str | None, Query(
    description="true: add the operations the caller may do on the topic "
                "(authorized_operations, Kafka's names)")]
# Kafka's topic operations, and the lakelog ACL operation (on the topic) that allows each.
_TOPIC_OPERATIONS = (("READ", "consume"), ("WRITE", "produce"), ("DELETE", "delete"),
                     ("ALTER", "alter"), ("DESCRIBE", "describe"),
                     ("DESCRIBE_CONFIGS", "describe"), ("ALTER_CONFIGS", "alter"))


def _include_operations(raw: str | None) -> bool:
    """Confluent's ``include_authorized_operations`` boolean: 400 for anything else."""
    if raw is None or raw.lower() in ("true", "false"):
        return raw is not None and raw.lower() == "true"
    raise InvalidParameterError(f"include_authorized_operations must be true or false, not "
                                f"{raw!r}")


def _with_operations(request: Request, body: dict[str, object], include: bool
                     ) -> dict[str, object]:
    if include:
        name = str(body["topic_name"])
        body["authorized_operations"] = [
            op for op, acl in _TOPIC_OPERATIONS if may(request, "topic", name, acl)] + (
            ["CREATE"] if may(request, "cluster", CLUSTER_ID, "admin") else [])
    return body


@router.get(BASE + "/{topic_name}")
async def get_topic(cluster_id: str, topic_name: TopicName, request: Request,
                    include_authorized_operations: IncludeOperations = None) -> Response:
    check_cluster(cluster_id)
    include = _include_operations(include_authorized_operations)
    return json_response(_with_operations(
        request, topic_body(state(request).topic_admin.describe(topic_name)), include))


@router.patch(BASE + "/{topic_name}", openapi_extra=json_body(TopicPatch))
async def update_topic(cluster_id: str, topic_name: TopicName, request: Request,
                       include_authorized_operations: IncludeOperations = None) -> Response:
    """Raise ``partitions_count`` (it never goes down)."""
    check_cluster(cluster_id)
    include = _include_operations(include_authorized_operations)
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, topic_name)
    body = await decode_request(request, _patch, ADMIN_BODY_LIMIT, 400)
    meta = await admin.add_partitions(topic_name, body.partitions_count)
    return json_response(_with_operations(request, topic_body(meta), include))


@router.delete(BASE + "/{topic_name}", status_code=204)
async def delete_topic(cluster_id: str, topic_name: TopicName, request: Request,
                       include_authorized_operations: IncludeOperations = None) -> Response:
    check_cluster(cluster_id)
    _include_operations(include_authorized_operations)  # validated; a 204 has no body
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, topic_name)
    await admin.delete(topic_name)
    return Response(status_code=204)


@router.get(BASE + "/{topic_name}/configs")
async def list_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    meta = admin.describe(topic_name)
    broker = admin.broker_defaults
    return json_response(collection("KafkaTopicConfigList", f"{topic_url(topic_name)}/configs",
                                    [config_body(meta, name, broker) for name in CONFIG_BY_NAME]))


@router.get(BASE + "/{topic_name}/configs/{name}")
async def get_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    return json_response(config_body(admin.config(topic_name, name), name,
                                     admin.broker_defaults))


@router.put(BASE + "/{topic_name}/configs/{name}", status_code=204,
            openapi_extra=json_body(ConfigUpdate))
async def set_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    """Set a config; a null value resets it to its default."""
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, topic_name)
    body = await decode_request(request, _update, ADMIN_BODY_LIMIT, 400)
    await admin.set_config(topic_name, name, body.value)
    return Response(status_code=204)


@router.delete(BASE + "/{topic_name}/configs/{name}", status_code=204)
async def reset_config(cluster_id: str, topic_name: TopicName, name: str,
                       request: Request) -> Response:
    """Back to the default value."""
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, topic_name)
    await admin.set_config(topic_name, name, None)
    return Response(status_code=204)


@router.post(BASE + "/{topic_name}/configs:alter", status_code=204,
             openapi_extra=json_body(ConfigAlter))
async def alter_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    """Set and delete several configs atomically: ``{"data": [{name, value, operation}]}``
    (SET with a null value resets); ``validate_only: true`` checks and changes nothing."""
    check_cluster(cluster_id)
    admin = state(request).topic_admin
    if (controller := admin.controller()) is not None:
        return await _forward_change(request, admin, controller, topic_name)
    body = await decode_request(request, _alter, ADMIN_BODY_LIMIT, 400)
    await admin.alter_configs(topic_name, [(e.name, None if e.operation == "DELETE" else e.value)
                                           for e in body.data], body.validate_only)
    return Response(status_code=204)


async def _forward_change(request: Request, admin: TopicAdmin, controller: BrokerInfo,
                          topic: str | None) -> Response:
    """A topic change sent on to the controller's broker; once that answers that it made
    the change, this broker reads the topic back (``TopicAdmin.read_back``), so that its
    own next answers show it. ``topic`` None: a creation (the name is in its answer)."""
    answer = await forward(request, controller)
    if answer.status_code < 300:
        name = topic
        if name is None:
            try:
                name = msgspec.json.decode(answer.body).get("topic_name")
            except (msgspec.DecodeError, AttributeError):
                name = None
        if isinstance(name, str):
            await admin.read_back(name)
    return answer
