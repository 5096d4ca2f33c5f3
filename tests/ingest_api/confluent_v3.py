"""JSON Schemas for the parts of Confluent REST Proxy v3 that lakelog implements.

Written for lakelog's tests from Confluent's OpenAPI document "REST Admin API",
version 3.0.0 (repository confluentinc/kafka-rest, file ``api/v3/openapi.yaml``),
components ``schemas``: Resource, ResourceCollection, Relationship, Error, ClusterData,
BrokerData, TopicData, TopicConfigData (AbstractConfigData, ConfigSynonymData),
PartitionData, ReplicaData, ReassignmentData, ProduceResponse (ProduceResponseData), the
consumer-group views (ConsumerGroupData, ConsumerData, ConsumerAssignmentData,
ConsumerLagData, ConsumerGroupLagSummaryData) and their ``...DataList`` collections, as
the document states their required fields, types and nullability; ``kind`` values as in
its examples. They are not a copy of the document.

That document has no ``records:batch`` and no List Partition Offsets; their shapes here
(successes as ProduceResponse plus ``id``, failures as Error plus ``id``, 422/42208 for an
empty batch, a null body or ids used twice; ``KafkaPartitionWithOffsets``) follow Confluent
Cloud's documentation of the endpoints and kafka-rest's own sources (``ProduceBatchAction``,
``ListPartitionOffsetsAction``, ``PartitionWithOffsetsData``).

Fields lakelog adds (``error``, ``topic_id``, ``log_start_offset``, ...) are allowed:
the document does not close its objects.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
NULLABLE_STRING: Schema = {"type": ["string", "null"]}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}

RELATIONSHIP: Schema = {"type": "object", "required": ["related"],
                        "properties": {"related": STRING}}
ERROR: Schema = {"type": "object", "required": ["error_code", "message"],
                 "properties": {"error_code": INTEGER, "message": NULLABLE_STRING}}
# ConfigSource is an x-extensible-enum; lakelog uses only these of its values.
CONFIG_SOURCE: Schema = {"enum": ["DYNAMIC_TOPIC_CONFIG", "STATIC_BROKER_CONFIG", "DEFAULT_CONFIG"]}


def resource(kind: str, required: dict[str, Schema], optional: dict[str, Schema] | None = None
             ) -> Schema:
    """``allOf: [Resource, {required..., properties...}]`` with ``kind`` fixed."""
    return {"type": "object", "required": ["kind", "metadata", *required],
            "properties": {"kind": {"const": kind},
                           "metadata": {"type": "object", "required": ["self"],
                                        "properties": {"self": STRING,
                                                       "resource_name": NULLABLE_STRING}},
                           **required, **(optional or {})}}


def collection(kind: str, item: Schema) -> Schema:
    """``allOf: [ResourceCollection, {data: [item]}]``."""
    return {"type": "object", "required": ["kind", "metadata", "data"],
            "properties": {"kind": {"const": kind},
                           "metadata": {"type": "object", "required": ["self"],
                                        "properties": {"self": STRING, "next": NULLABLE_STRING}},
                           "data": {"type": "array", "items": item}}}


CLUSTER = resource("KafkaCluster", {
    "cluster_id": STRING, "acls": RELATIONSHIP, "brokers": RELATIONSHIP,
    "broker_configs": RELATIONSHIP, "consumer_groups": RELATIONSHIP, "topics": RELATIONSHIP,
    "partition_reassignments": RELATIONSHIP}, {"controller": RELATIONSHIP})
BROKER = resource("KafkaBroker", {
    "cluster_id": STRING, "broker_id": INTEGER, "configs": RELATIONSHIP,
    "partition_replicas": RELATIONSHIP},
    {"host": NULLABLE_STRING, "port": {"type": ["integer", "null"]}, "rack": NULLABLE_STRING})
TOPIC = resource("KafkaTopic", {
    "cluster_id": STRING, "topic_name": STRING, "is_internal": BOOLEAN,
    "replication_factor": INTEGER, "partitions_count": INTEGER, "partitions": RELATIONSHIP,
    "configs": RELATIONSHIP, "partition_reassignments": RELATIONSHIP})
TOPIC_CONFIG = resource("KafkaTopicConfig", {
    "cluster_id": STRING, "topic_name": STRING, "name": STRING, "is_default": BOOLEAN,
    "is_read_only": BOOLEAN, "is_sensitive": BOOLEAN, "source": CONFIG_SOURCE,
    "synonyms": {"type": "array", "items": {
        "type": "object", "required": ["name", "source"],
        "properties": {"name": STRING, "value": NULLABLE_STRING, "source": CONFIG_SOURCE}}}},
    {"value": NULLABLE_STRING})
PARTITION = resource("KafkaPartition", {
    "cluster_id": STRING, "topic_name": STRING, "partition_id": INTEGER,
    "replicas": RELATIONSHIP, "reassignment": RELATIONSHIP}, {"leader": RELATIONSHIP})
REPLICA = resource("KafkaReplica", {
    "cluster_id": STRING, "topic_name": STRING, "partition_id": INTEGER, "broker_id": INTEGER,
    "is_leader": BOOLEAN, "is_in_sync": BOOLEAN, "broker": RELATIONSHIP})
REASSIGNMENT = resource("KafkaReassignment", {
    "cluster_id": STRING, "topic_name": STRING, "partition_id": INTEGER,
    "adding_replicas": {"type": "array", "items": INTEGER},
    "removing_replicas": {"type": "array", "items": INTEGER}, "replicas": RELATIONSHIP})
CONFIG_ENTRY: Schema = {"type": "object"}  # lakelog has no dynamic broker configs: lists are empty

CLUSTER_LIST = collection("KafkaClusterList", CLUSTER)
BROKER_LIST = collection("KafkaBrokerList", BROKER)
TOPIC_LIST = collection("KafkaTopicList", TOPIC)
TOPIC_CONFIG_LIST = collection("KafkaTopicConfigList", TOPIC_CONFIG)
PARTITION_LIST = collection("KafkaPartitionList", PARTITION)
REPLICA_LIST = collection("KafkaReplicaList", REPLICA)
REASSIGNMENT_LIST = collection("KafkaReassignmentList", REASSIGNMENT)
CLUSTER_CONFIG_LIST = collection("KafkaClusterConfigList", CONFIG_ENTRY)
BROKER_CONFIG_LIST = collection("KafkaBrokerConfigList", CONFIG_ENTRY)

PRODUCE_RESPONSE_DATA: Schema = {
    "type": ["object", "null"], "required": ["size"],
    "properties": {"size": INTEGER, "type": NULLABLE_STRING, "subject": NULLABLE_STRING,
                   "schema_id": {"type": ["integer", "null"]},
                   "schema_version": {"type": ["integer", "null"]}}}
PRODUCE_RESPONSE: Schema = {
    "type": "object", "required": ["error_code", "cluster_id", "topic_name", "partition_id",
                                   "offset"],
    "properties": {"error_code": {"const": 200}, "cluster_id": STRING, "topic_name": STRING,
                   "partition_id": INTEGER, "offset": INTEGER,
                   "timestamp": {"type": ["string", "null"], "format": "date-time"},
                   "key": PRODUCE_RESPONSE_DATA, "value": PRODUCE_RESPONSE_DATA}}
BATCH_SUCCESS: Schema = {"allOf": [PRODUCE_RESPONSE, {"type": "object", "required": ["id"],
                                                     "properties": {"id": STRING}}]}
BATCH_FAILURE: Schema = {"allOf": [ERROR, {"type": "object", "required": ["id"],
                                          "properties": {"id": STRING}}]}
BATCH_RESPONSE: Schema = {
    "type": "object", "required": ["successes", "failures"],
    "properties": {"successes": {"type": "array", "items": BATCH_SUCCESS},
                   "failures": {"type": "array", "items": BATCH_FAILURE}}}

# List Partition Offsets (``GET .../partitions/{partition_id}/offset``): the partition with
# its earliest and latest offsets; its one ``offset_type`` is ``earliest_and_latest``.
INT64: Schema = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
PARTITION_OFFSETS = resource("KafkaPartitionWithOffsets", {
    "cluster_id": STRING, "topic_name": STRING, "partition_id": INTEGER,
    "earliest_offset": INT64, "latest_offset": INT64})

# The consumer-group views: ConsumerGroupData, ConsumerData, ConsumerAssignmentData,
# ConsumerLagData and ConsumerGroupLagSummaryData (offsets and lags are int64).
CONSUMER_GROUP = resource("KafkaConsumerGroup", {
    "cluster_id": STRING, "consumer_group_id": STRING, "is_simple": BOOLEAN,
    "partition_assignor": STRING, "state": STRING, "coordinator": RELATIONSHIP,
    "consumers": RELATIONSHIP, "lag_summary": RELATIONSHIP})
CONSUMER = resource("KafkaConsumer", {
    "cluster_id": STRING, "consumer_group_id": STRING, "consumer_id": STRING,
    "client_id": STRING, "assignments": RELATIONSHIP}, {"instance_id": NULLABLE_STRING})
ASSIGNMENT = resource("KafkaConsumerAssignment", {
    "cluster_id": STRING, "consumer_group_id": STRING, "consumer_id": STRING,
    "topic_name": STRING, "partition_id": INTEGER, "partition": RELATIONSHIP,
    "lag": RELATIONSHIP})
LAG = resource("KafkaConsumerLag", {
    "cluster_id": STRING, "consumer_group_id": STRING, "topic_name": STRING,
    "partition_id": INTEGER, "current_offset": INT64, "log_end_offset": INT64, "lag": INT64,
    "consumer_id": STRING, "client_id": STRING}, {"instance_id": NULLABLE_STRING})
LAG_SUMMARY = resource("KafkaConsumerGroupLagSummary", {
    "cluster_id": STRING, "consumer_group_id": STRING, "max_lag_consumer_id": STRING,
    "max_lag_client_id": STRING, "max_lag_topic_name": STRING,
    "max_lag_partition_id": INTEGER, "max_lag": INT64, "total_lag": INT64,
    "max_lag_consumer": RELATIONSHIP, "max_lag_partition": RELATIONSHIP},
    {"max_lag_instance_id": NULLABLE_STRING})
CONSUMER_GROUP_LIST = collection("KafkaConsumerGroupList", CONSUMER_GROUP)
CONSUMER_LIST = collection("KafkaConsumerList", CONSUMER)
ASSIGNMENT_LIST = collection("KafkaConsumerAssignmentList", ASSIGNMENT)
LAG_LIST = collection("KafkaConsumerLagList", LAG)
