"""Topics, their configs and partitions (Confluent REST v3 shapes)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from ingest_api.auth import may
from ingest_api.body import decode_request
from ingest_api.errors import ApiError
from ingest_api.models import ConfigAlter, ConfigUpdate, TopicCreate, TopicPatch
from ingest_api.routers.cluster import check_cluster
from ingest_api.state import CLUSTER_ID, AppState, json_body, json_response, state
from log_tables.config import CONFIG_BY_NAME, TopicConfig
from log_tables.partition_log import PartitionLog
from log_tables.registry import TopicMetadata

router = APIRouter(tags=["topics"])
BASE = "/v3/clusters/{cluster_id}/topics"
TopicName = Annotated[str, Path(min_length=1, max_length=249)]
PartitionId = Annotated[int, Path(ge=0, le=2**31 - 1)]
_create = msgspec.json.Decoder(TopicCreate)
_patch = msgspec.json.Decoder(TopicPatch)
_update = msgspec.json.Decoder(ConfigUpdate)
_alter = msgspec.json.Decoder(ConfigAlter)
ADMIN_BODY_LIMIT = 1 << 20


def topic_body(meta: TopicMetadata) -> dict[str, object]:
    url = f"/v3/clusters/{CLUSTER_ID}/topics/{meta.name}"
    return {"kind": "KafkaTopic", "metadata": {"self": url}, "cluster_id": CLUSTER_ID,
            "topic_name": meta.name, "topic_id": meta.topic_id, "is_internal": False,
            "replication_factor": 1, "partitions_count": meta.partitions,
            "partitions": {"related": f"{url}/partitions"}, "configs": {"related": f"{url}/configs"}}


def config_body(meta: TopicMetadata, name: str) -> dict[str, object]:
    effective = meta.config.to_kafka()
    is_default = name not in meta.overrides
    return {"kind": "KafkaTopicConfig", "cluster_id": CLUSTER_ID, "topic_name": meta.name,
            "name": name, "value": effective[name], "is_default": is_default,
            "is_read_only": False, "is_sensitive": False,
            "source": "DEFAULT_CONFIG" if is_default else "DYNAMIC_TOPIC_CONFIG",
            "default_value": TopicConfig().to_kafka()[name],
            "documentation": CONFIG_BY_NAME[name].doc}


def partition_body(st: AppState, topic: str, plog: PartitionLog, partition: int
                   ) -> dict[str, object]:
    cold = st.tiered.state(topic, partition)
    return {"kind": "KafkaPartition", "cluster_id": CLUSTER_ID, "topic_name": topic,
            "partition_id": partition,
            "log_start_offset": st.tiered.log_start_offset(plog, topic, partition),
            "high_watermark": plog.high_watermark, "size_bytes": plog.size_bytes,
            "segments": len(plog.segments),
            "hot_log_start_offset": plog.log_start_offset,
            "tiered_offset": cold.tiered_offset if cold else 0,
            "tiered_size_bytes": cold.size_bytes if cold else 0}


@router.post(BASE, status_code=201, openapi_extra=json_body(TopicCreate))
async def create_topic(cluster_id: str, request: Request) -> Response:
    """Create a topic: ``topic_name``, ``partitions_count``, ``configs: [{name, value}]``."""
    check_cluster(cluster_id)
    body = await decode_request(request, _create, ADMIN_BODY_LIMIT)
    if body.replication_factor not in (None, 1):
        raise ApiError(400, f"replication_factor {body.replication_factor} is not supported: "
                            "lakelog keeps one copy (durability comes from fsync and Delta)",
                       error_code=40005, name="invalid_replication_factor")
    configs = {c.name: c.value for c in body.configs}
    meta = state(request).manager.create_topic(body.topic_name, body.partitions_count, configs)
    return json_response(topic_body(meta), status=201)


@router.get(BASE)
async def list_topics(cluster_id: str, request: Request) -> Response:
    check_cluster(cluster_id)
    topics = [t for t in state(request).manager.registry.list()
              if may(request, "topic", t.name, "describe")]
    return json_response({"kind": "KafkaTopicList",
                          "metadata": {"self": f"/v3/clusters/{CLUSTER_ID}/topics"},
                          "data": [topic_body(t) for t in topics]})


@router.get(BASE + "/{topic_name}")
async def get_topic(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    return json_response(topic_body(state(request).manager.require_topic(topic_name)))


@router.patch(BASE + "/{topic_name}", openapi_extra=json_body(TopicPatch))
async def update_topic(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    """Raise ``partitions_count`` (it never goes down)."""
    check_cluster(cluster_id)
    body = await decode_request(request, _patch, ADMIN_BODY_LIMIT)
    meta = state(request).manager.add_partitions(topic_name, body.partitions_count)
    return json_response(topic_body(meta))


@router.delete(BASE + "/{topic_name}", status_code=204)
async def delete_topic(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    st.manager.require_topic(topic_name)
    st.manager.delete_topic(topic_name)
    await asyncio.to_thread(st.tiered.drop_topic, topic_name)
    return Response(status_code=204)


@router.get(BASE + "/{topic_name}/configs")
async def list_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    meta = state(request).manager.require_topic(topic_name)
    return json_response({"kind": "KafkaTopicConfigList",
                          "data": [config_body(meta, name) for name in CONFIG_BY_NAME]})


@router.get(BASE + "/{topic_name}/configs/{name}")
async def get_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    check_cluster(cluster_id)
    meta = state(request).manager.require_topic(topic_name)
    _known(name)
    return json_response(config_body(meta, name))


@router.put(BASE + "/{topic_name}/configs/{name}", status_code=204,
            openapi_extra=json_body(ConfigUpdate))
async def set_config(cluster_id: str, topic_name: TopicName, name: str,
                     request: Request) -> Response:
    check_cluster(cluster_id)
    body = await decode_request(request, _update, ADMIN_BODY_LIMIT)
    st = state(request)
    st.manager.require_topic(topic_name)
    st.manager.alter_configs(topic_name, {_known(name): body.value})
    return Response(status_code=204)


@router.delete(BASE + "/{topic_name}/configs/{name}", status_code=204)
async def reset_config(cluster_id: str, topic_name: TopicName, name: str,
                       request: Request) -> Response:
    """Back to the default value."""
    check_cluster(cluster_id)
    st = state(request)
    st.manager.require_topic(topic_name)
    st.manager.alter_configs(topic_name, delete_configs=[_known(name)])
    return Response(status_code=204)


@router.post(BASE + "/{topic_name}/configs:alter", status_code=204,
             openapi_extra=json_body(ConfigAlter))
async def alter_configs(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    """Set and delete several configs atomically: ``{"data": [{name, value, operation}]}``."""
    check_cluster(cluster_id)
    body = await decode_request(request, _alter, ADMIN_BODY_LIMIT)
    st = state(request)
    st.manager.require_topic(topic_name)
    to_set = {e.name: e.value for e in body.data if e.operation == "SET"}
    to_delete = [_known(e.name) for e in body.data if e.operation == "DELETE"]
    st.manager.alter_configs(topic_name, to_set, to_delete)
    return Response(status_code=204)


@router.get(BASE + "/{topic_name}/partitions")
async def list_partitions(cluster_id: str, topic_name: TopicName, request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    logs = st.manager.partitions(topic_name)
    return json_response({"kind": "KafkaPartitionList",
                          "data": [partition_body(st, topic_name, plog, p)
                                   for p, plog in enumerate(logs)]})


@router.get(BASE + "/{topic_name}/partitions/{partition_id}")
async def get_partition(cluster_id: str, topic_name: TopicName, partition_id: PartitionId,
                        request: Request) -> Response:
    check_cluster(cluster_id)
    st = state(request)
    plog = st.manager.log(topic_name, partition_id)
    return json_response(partition_body(st, topic_name, plog, partition_id))


def _known(name: str) -> str:
    if name not in CONFIG_BY_NAME:
        raise ApiError(404, f"topic config {name!r} does not exist; known configs: "
                            f"{', '.join(CONFIG_BY_NAME)}", error_code=40403,
                       name="unknown_config")
    return name
