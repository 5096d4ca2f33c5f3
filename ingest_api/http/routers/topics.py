"""Topics and their configs (Confluent REST v3 shapes); partitions are in ``partitions.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from cluster.model import OFFSETS_TOPIC
from ingest_api.broker.cluster_link import internal as is_internal
from ingest_api.broker.metadata import (
    CLUSTER,
    METADATA,
    collection,
    related,
    resource,
    topic_url,
)
from ingest_api.http.auth import may
from ingest_api.http.body import decode_request
from ingest_api.http.errors import ApiError
from ingest_api.http.models import ConfigAlter, ConfigUpdate, TopicCreate, TopicPatch
from ingest_api.http.routers.cluster import check_cluster
from ingest_api.http.state import CLUSTER_ID, AppState, json_body, json_response, state
from log_tables.config import CONFIG_BY_NAME, TopicConfig, config_value
from log_tables.errors import InvalidConfigError, InvalidTopicError
from log_tables.registry import TopicMetadata

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


def _config_values(entries: list[tuple[str, str | None]]) -> tuple[dict[str, str], list[str]]:
    """Configs to set and (for null values) to leave at or reset to their default; every
    name must be known either way."""
    to_set: dict[str, str] = {}
    to_default: list[str] = []
    for name, value in entries:
        if value is None:
            to_default.append(_known_config(name))
        else:
            to_set[name] = value
    return to_set, to_default


def _known_config(name: str) -> str:
    if name not in CONFIG_BY_NAME:
        raise InvalidConfigError(name, None, f"unknown topic config; known configs: "
                                             f"{', '.join(CONFIG_BY_NAME)}")
    return name


def _partitions_count(body: TopicCreate) -> int:
    """The partition count, from ``partitions_count`` or ``replicas_assignments``, whose
    replicas must be what this cluster places (one broker: only itself)."""
    if body.replicas_assignments is None:
        return 1 if body.partitions_count is None else body.partitions_count
    ids = sorted(a.partition_id for a in body.replicas_assignments)
    if ids != list(range(len(ids))):
        raise ApiError(400, f"replicas_assignments must name partitions 0..{len(ids) - 1} once "
                            f"each, got {ids}", error_code=40003, name="invalid_partitions")
    if body.partitions_count not in (None, len(ids)):
        raise ApiError(400, f"partitions_count {body.partitions_count} and "
                            f"{len(ids)} replicas_assignments disagree",
                       error_code=40003, name="invalid_partitions")
    for a in body.replicas_assignments:
        placed = list(METADATA.placement(body.topic_name, a.partition_id).replicas)
        if a.broker_ids != placed:
            raise ApiError(400, f"partition {a.partition_id}: replicas {a.broker_ids} cannot be "
                                f"placed: lakelog is one broker (id {placed[0]}), so each "
                                f"partition's replicas are {placed}",
                           error_code=40005, name="invalid_replica_assignment")
    return len(ids)


async def _to_controller(st: AppState, request: Request) -> Response | None:
    """In a cluster, topic changes are the controller's: its answer, unless this broker is
    the controller (None)."""
    if st.cluster is None:
        return None
    controller = st.cluster.controller()
    if controller is None:
        return None
    return await st.cluster.proxy(request, controller)


async def _controller_step(st: AppState, step: Callable[[], object], topic: str) -> None:
    """Run a controller step (a ZooKeeper transaction) and read the topic back, so that
    this broker's answer shows the change."""
    assert st.cluster is not None
    await asyncio.to_thread(step)
    await asyncio.to_thread(st.cluster.broker.ensure_topic, topic)


@router.post(BASE, status_code=201, openapi_extra=json_body(TopicCreate))
async def create_topic(cluster_id: str, request: Request) -> Response:
    """Create a topic: ``topic_name``, ``partitions_count``, ``configs: [{name, value}]``;
    ``validate_only: true`` checks all of it and answers 200 with the topic that would be
    made, creating nothing."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    body = await decode_request(request, _create, ADMIN_BODY_LIMIT, 400)
    if st.cluster is not None:
        return await _create_in_cluster(st, request, body)
    factor = METADATA.replication_factor(body.topic_name)  # 1: this broker alone
    if body.replication_factor not in (None, factor):
        raise ApiError(400, f"replication_factor {body.replication_factor} is more than the "
                            f"{factor} live broker: this server runs alone (a cluster keeps up "
                            "to one copy of a partition per live broker: `lakelog cluster up`)"
                       if body.replication_factor > factor else
                       f"replication_factor must be 1 or more, got {body.replication_factor}",
                       error_code=40005, name="invalid_replication_factor")
    partitions = _partitions_count(body)
    configs, _ = _config_values([(c.name, c.value) for c in body.configs])
    meta = state(request).manager.create_topic(body.topic_name, partitions, configs,
                                               validate_only=body.validate_only)
    return json_response(topic_body(meta), status=200 if body.validate_only else 201)


async def _create_in_cluster(st: AppState, request: Request, body: TopicCreate) -> Response:
    assert st.cluster is not None
    internal = body.topic_name == OFFSETS_TOPIC
    if internal and not is_internal(request):
        raise InvalidTopicError(f"{OFFSETS_TOPIC} is the cluster's own (its partitions are the "
                                f"consumer group coordinators)")
    if body.replicas_assignments is not None:
        raise ApiError(400, "replicas_assignments is not supported in a cluster: give "
                            "partitions_count and replication_factor, and the controller "
                            "places the replicas", error_code=40005,
                       name="invalid_replica_assignment")
    live = len(st.cluster.broker.view.live_brokers())
    factor = body.replication_factor or min(st.settings.default_replication_factor, live)
    if internal:  # the controller grows it as more brokers live
        factor = max(1, min(st.cluster.broker.controller.offsets_topic_replication_factor,
                            live))
    if factor > live:
        raise ApiError(400, f"replication_factor {factor} is more than the {live} live "
                            f"broker(s); start more brokers or ask for fewer replicas",
                       error_code=40005, name="invalid_replication_factor")
    partitions = 1 if body.partitions_count is None else body.partitions_count
    configs, _ = _config_values([(c.name, c.value) for c in body.configs])
    if internal:
        meta = TopicMetadata(OFFSETS_TOPIC, "", partitions, {}, 0)
    else:
        meta = st.manager.create_topic(body.topic_name, partitions, configs, validate_only=True)
    if body.validate_only:
        return json_response(topic_body(meta, factor), status=200)
    controller = st.cluster.broker.controller
    await _controller_step(st, lambda: controller.create_topic(
        meta.name, partitions, factor, dict(meta.overrides), int(time.time() * 1000)), meta.name)
    if internal:
        return json_response({"topic_name": OFFSETS_TOPIC, "partitions_count": partitions},
                             status=201)
    return json_response(topic_body(st.manager.topic(meta.name)), status=201)


@router.get(BASE)
async def list_topics(cluster_id: str, request: Request) -> Response:
    check_cluster(cluster_id)
    topics = [t for t in state(request).manager.registry.list()
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
    raise ApiError(400, f"include_authorized_operations must be true or false, not {raw!r}",
                   name="invalid_parameter")


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
        request, topic_body(state(request).require_topic(topic_name)), include))


@router.patch(BASE + "/{topic_name}", openapi_extra=json_body(TopicPatch))
async def update_topic(cluster_id: str, topic_name: TopicName, request: Request,
                       include_authorized_operations: IncludeOperations = None) -> Response:
    """Raise ``partitions_count`` (it never goes down)."""
    check_cluster(cluster_id)
    include = _include_operations(include_authorized_operations)
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    body = await decode_request(request, _patch, ADMIN_BODY_LIMIT, 400)
    if st.cluster is not None:
        st.require_topic(topic_name)
        controller = st.cluster.broker.controller
        await _controller_step(st, lambda: controller.add_partitions(
            topic_name, body.partitions_count), topic_name)
        return json_response(_with_operations(
            request, topic_body(st.manager.topic(topic_name)), include))
    meta = st.manager.add_partitions(topic_name, body.partitions_count)
    return json_response(_with_operations(request, topic_body(meta), include))


@router.delete(BASE + "/{topic_name}", status_code=204)
async def delete_topic(cluster_id: str, topic_name: TopicName, request: Request,
                       include_authorized_operations: IncludeOperations = None) -> Response:
    check_cluster(cluster_id)
    _include_operations(include_authorized_operations)  # validated; a 204 has no body
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    st.require_topic(topic_name)
    if st.cluster is not None:
        broker = st.cluster.broker
        await asyncio.to_thread(broker.controller.delete_topic, topic_name)
        await asyncio.to_thread(broker.forget_topic, topic_name)
    else:
        st.manager.delete_topic(topic_name)
        # Its committed offsets go with it (in a cluster each coordinator hears of the
        # deletion and deletes those of its groups: ``GroupSlots``).
        await st.groups.forget_topic(topic_name)
    await asyncio.to_thread(st.tiered.drop_topic, topic_name)
    return Response(status_code=204)


@router.get(BASE + "/{topic_name}/configs")
async def list_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    meta = st.require_topic(topic_name)
    broker = st.settings.topic_defaults
    return json_response(collection("KafkaTopicConfigList", f"{topic_url(topic_name)}/configs",
                                    [config_body(meta, name, broker) for name in CONFIG_BY_NAME]))


@router.get(BASE + "/{topic_name}/configs/{name}")
async def get_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    meta = st.require_topic(topic_name)
    _known(name)
    return json_response(config_body(meta, name, st.settings.topic_defaults))


@router.put(BASE + "/{topic_name}/configs/{name}", status_code=204,
            openapi_extra=json_body(ConfigUpdate))
async def set_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    """Set a config; a null value resets it to its default."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    body = await decode_request(request, _update, ADMIN_BODY_LIMIT, 400)
    st.require_topic(topic_name)
    to_set, to_default = _config_values([(_known(name), body.value)])
    await _change_configs(st, topic_name, to_set, to_default)
    return Response(status_code=204)


@router.delete(BASE + "/{topic_name}/configs/{name}", status_code=204)
async def reset_config(cluster_id: str, topic_name: TopicName, name: str,
                       request: Request) -> Response:
    """Back to the default value."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    st.require_topic(topic_name)
    await _change_configs(st, topic_name, {}, [_known(name)])
    return Response(status_code=204)


@router.post(BASE + "/{topic_name}/configs:alter", status_code=204,
             openapi_extra=json_body(ConfigAlter))
async def alter_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    """Set and delete several configs atomically: ``{"data": [{name, value, operation}]}``
    (SET with a null value resets); ``validate_only: true`` checks and changes nothing."""
    check_cluster(cluster_id)
    st = state(request)
    if (answer := await _to_controller(st, request)) is not None:
        return answer
    body = await decode_request(request, _alter, ADMIN_BODY_LIMIT, 400)
    st.require_topic(topic_name)
    to_set, to_delete = _config_values([(e.name, None if e.operation == "DELETE" else e.value)
                                        for e in body.data])
    await _change_configs(st, topic_name, to_set, to_delete, validate_only=body.validate_only)
    return Response(status_code=204)


async def _change_configs(st: AppState, topic: str, to_set: dict[str, str], to_delete: list[str],
                 validate_only: bool = False) -> None:
    """Change a topic's configs: here, or (in a cluster) through the controller, which
    writes them to ZooKeeper for every broker."""
    if st.cluster is None or validate_only:
        st.manager.alter_configs(topic, to_set, to_delete, validate_only=validate_only)
        return
    meta = st.manager.alter_configs(topic, to_set, to_delete, validate_only=True)
    controller = st.cluster.broker.controller
    await _controller_step(st, lambda: controller.set_configs(topic, dict(meta.overrides)),
                           topic)


def _known(name: str) -> str:
    if name not in CONFIG_BY_NAME:
        raise ApiError(404, f"topic config {name!r} does not exist; known configs: "
                            f"{', '.join(CONFIG_BY_NAME)}", error_code=40409,
                       name="unknown_config")
    return name
