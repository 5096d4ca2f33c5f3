"""HTTP request bodies and response bodies, once: decoded and encoded with msgspec
(fast, with error paths like ``$.entries[3].key``).

Shapes follow Confluent REST Proxy v3: key/value envelopes
``{"type": "BINARY"|"STRING"|"JSON", "data": ...}`` (BINARY data is base64),
headers ``[{"name", "value" (base64)}]``, topics with ``topic_name``,
``partitions_count`` and ``configs: [{name, value}]``.

Request and response Structs are declared ``gc=False``: they hold no reference cycles, and
keeping thousands of them per request out of the cyclic garbage collector's
sight is what keeps decoding as fast in the server as in a bare endpoint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from log_tables.records import MAX_TIMESTAMP_MS

INT64_MAX = 2**63 - 1
# Offsets, ids and epoch-ms times are Kafka's int64: larger numbers are refused (422).
NonNegative = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Sequence = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Epoch = Annotated[int, Meta(ge=0, le=32_767)]
EpochMs = Annotated[int, Meta(ge=0, le=MAX_TIMESTAMP_MS)]
MAX_HEADERS = 1_000


class BinaryData(msgspec.Struct, tag_field="type", tag="BINARY", forbid_unknown_fields=True,
                 gc=False):
    """Bytes, base64-encoded in JSON."""

    data: bytes | None = None


class StringData(msgspec.Struct, tag_field="type", tag="STRING", forbid_unknown_fields=True,
                 gc=False):
    """Text, stored as UTF-8."""

    data: str | None = None


class JsonData(msgspec.Struct, tag_field="type", tag="JSON", forbid_unknown_fields=True,
               gc=False):
    """Any JSON value, stored as its compact encoding."""

    data: Any = None


class _SchemaData(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, gc=False):
    """Data with a schema of the registry (Confluent REST v3): ``schema_id``, or ``subject``
    (else the topic's by ``subject_name_strategy``) and ``schema_version`` (else the
    latest). Stored in Confluent's wire format (``ingest_api.broker.schemas.serde``)."""

    data: Any = None
    subject: str | None = None
    subject_name_strategy: str | None = None
    schema_id: Annotated[int, Meta(ge=1, le=2**31 - 1)] | None = None
    schema_version: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None


class AvroData(_SchemaData, tag="AVRO"):
    """Data to write with an Avro schema."""


class JsonSchemaData(_SchemaData, tag="JSONSCHEMA"):
    """Data to write with a JSON Schema."""


class ProtobufData(_SchemaData, tag="PROTOBUF"):
    """Data to write with a Protobuf schema (as its first message, from JSON)."""


SCHEMA_ENVELOPES = (AvroData, JsonSchemaData, ProtobufData)


class EncodedData(msgspec.Struct, gc=False):
    """A schema envelope once encoded (never decoded from a body): what is stored, and
    the type its delivery report names."""

    tag: str
    data: bytes


PlainEnvelope = BinaryData | StringData | JsonData
"""The envelopes of the usual entries (``PlainEntry``, ``ProducerEntry``): an entry with a
schema envelope is decoded as a ``BatchEntry``, so the usual bodies need no look for them."""
Envelope = BinaryData | StringData | JsonData | AvroData | JsonSchemaData | ProtobufData
ENVELOPE_TYPES: tuple[str, ...] = tuple(
    str(t.__struct_config__.tag) for t in (BinaryData, StringData, JsonData,
                                           *SCHEMA_ENVELOPES))
"""The ``type`` names a key or value may have, as a 422 lists them."""


class HeaderIn(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: Annotated[str, Meta(min_length=1, max_length=32_768)]
    value: bytes | None = None


class ProduceRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """One record to produce. Without ``partition_id``, a key picks the partition
    (Kafka's murmur2); keyless records are spread evenly."""

    partition_id: NonNegative | None = None
    key: Envelope | None = None
    value: Envelope | None = None
    headers: Annotated[list[HeaderIn], Meta(max_length=MAX_HEADERS)] | None = None
    timestamp: EpochMs | datetime | None = None
    producer_id: NonNegative | None = None
    producer_epoch: Epoch | None = None
    sequence: Sequence | None = None


class BatchEntry(ProduceRecord, kw_only=True, gc=False):
    id: Annotated[str, Meta(min_length=1, max_length=256)]


class BatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    entries: list[BatchEntry]


EntryIdText = Annotated[str, Meta(min_length=1, max_length=256)]


class PlainEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A batch entry of an id, a key and a value only, the usual one: decoded without the
    fields it has not (a body with any other field is decoded as a ``BatchRequest``)."""

    key: PlainEnvelope | None = None
    value: PlainEnvelope | None = None
    id: EntryIdText
    partition_id: ClassVar[None] = None
    headers: ClassVar[None] = None
    timestamp: ClassVar[None] = None
    producer_id: ClassVar[None] = None
    producer_epoch: ClassVar[None] = None
    sequence: ClassVar[None] = None


class ProducerEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """An idempotent producer's batch entry, as lakelog's ``Producer`` sends it: a
    partition, a key, a value and the producer's fields, each one there."""

    partition_id: NonNegative
    key: PlainEnvelope | None = None
    value: PlainEnvelope | None = None
    id: EntryIdText
    producer_id: NonNegative
    producer_epoch: Epoch
    sequence: Sequence
    headers: ClassVar[None] = None
    timestamp: ClassVar[None] = None


class PlainBatch(msgspec.Struct, forbid_unknown_fields=True):
    entries: list[PlainEntry]


class ProducerBatch(msgspec.Struct, forbid_unknown_fields=True):
    entries: list[ProducerEntry]


AnyEntry = BatchEntry | PlainEntry | ProducerEntry
"""A decoded batch entry: the fast shapes are tried first (``routers.records``)."""


class EntryId(msgspec.Struct):
    """Only the id of an entry that is otherwise invalid (to report it by)."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class RawBatch(msgspec.Struct, forbid_unknown_fields=True):
    """A batch whose entries are decoded one by one (so an invalid one fails alone)."""

    entries: list[msgspec.Raw]


class ConfigEntry(msgspec.Struct, forbid_unknown_fields=True):
    """A config to set; a null value leaves the default (as if the entry were not there)."""

    name: str
    value: str | None = None


class ReplicasAssignment(msgspec.Struct, forbid_unknown_fields=True):
    partition_id: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    broker_ids: list[int]


class TopicCreate(msgspec.Struct, forbid_unknown_fields=True):
    """Confluent's CreateTopicRequestData. ``validate_only``: check it, create nothing."""

    topic_name: str
    partitions_count: int | None = None
    replication_factor: int | None = None
    replicas_assignments: Annotated[list[ReplicasAssignment], Meta(max_length=10_000)] | None = None
    configs: list[ConfigEntry] = []
    validate_only: bool = False


class TopicPatch(msgspec.Struct, forbid_unknown_fields=True):
    partitions_count: int


class ConfigUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """A null (or missing) value resets the config to its default."""

    value: str | None = None


class ConfigAlterEntry(msgspec.Struct, forbid_unknown_fields=True):
    """SET (the default; a null value resets) or DELETE (back to the default)."""

    name: str
    value: str | None = None
    operation: Literal["SET", "DELETE"] | None = None


class ConfigAlter(msgspec.Struct, forbid_unknown_fields=True):
    data: list[ConfigAlterEntry]
    validate_only: bool = False


class ProducerInit(msgspec.Struct, forbid_unknown_fields=True):
    """Empty for a new producer id; an existing id to bump its epoch (fencing old instances)."""

    producer_id: NonNegative | None = None


class DeleteRecordsPartition(msgspec.Struct, forbid_unknown_fields=True):
    partition_id: NonNegative
    offset: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]
    """Delete every record below this offset; -1: the high watermark (everything)."""


class DeleteRecordsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Kafka's DeleteRecords for some partitions of one topic."""

    partitions: Annotated[list[DeleteRecordsPartition], msgspec.Meta(min_length=1, max_length=10_000)]


TopicName = Annotated[str, Meta(min_length=1, max_length=249)]
Name = Annotated[str, Meta(min_length=1, max_length=249)]


class PartitionRef(msgspec.Struct, forbid_unknown_fields=True):
    topic_name: TopicName
    partition_id: NonNegative


class JoinRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Join a consumer group (KIP-848 style: the server assigns)."""

    topics: Annotated[list[TopicName], Meta(min_length=1, max_length=1_000)]
    session_timeout_ms: Annotated[int, Meta(ge=1_000, le=1_800_000)] = 45_000
    group_instance_id: Name | None = None
    assignor: Literal["range", "roundrobin", "cooperative-sticky"] | None = None
    auto_offset_reset: Literal["earliest", "latest", "none"] = "latest"
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"


class HeartbeatRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``owned``: the partitions the member still holds (acknowledges revocations); without
    it, the heartbeat after the one that announced a revocation acknowledges it."""

    member_epoch: Annotated[int, Meta(ge=0)]
    owned: Annotated[list[PartitionRef], Meta(max_length=100_000)] | None = None


class OffsetEntry(msgspec.Struct, forbid_unknown_fields=True):
    topic_name: TopicName
    partition_id: NonNegative
    offset: NonNegative
    metadata: Annotated[str, Meta(max_length=4096)] | None = None
    topic_id: Annotated[str, Meta(max_length=64)] | None = None
    """The id of the topic the offset is in (as a group poll's ``positions`` give it):
    refused (``unknown_topic_id``) if the topic of that name has another id now."""


class CommitRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Commit offsets (the next record to read) as member ``member_id`` at ``member_epoch``;
    without a member id (epoch -1) only while the group has no members."""

    offsets: Annotated[list[OffsetEntry], Meta(min_length=1, max_length=10_000)]
    member_id: Name | None = None
    member_epoch: Annotated[int, Meta(ge=-1)] = -1


class PositionEntry(msgspec.Struct, forbid_unknown_fields=True):
    topic_name: TopicName
    partition_id: NonNegative
    offset: NonNegative | None
    """None: back to the committed offset (or the reset policy)."""


class SeekRequest(msgspec.Struct, forbid_unknown_fields=True):
    positions: Annotated[list[PositionEntry], Meta(min_length=1, max_length=100_000)]


class ResetRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Reset a group's committed offsets (only while it has no members)."""

    to: Literal["earliest", "latest", "offset", "datetime"]
    offset: NonNegative | None = None
    datetime: datetime | None = None
    topics: Annotated[list[TopicName], Meta(min_length=1, max_length=1_000)] | None = None
    dry_run: bool = False


Principal = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._@-]+$")]


class AclBody(msgspec.Struct, forbid_unknown_fields=True):
    """One ACL: ``principal`` may do ``operation`` on the resource(s)."""

    principal: Principal
    resource_type: Literal["topic", "group", "cluster"]
    operation: Literal["produce", "consume", "describe", "alter", "delete", "commit", "admin"]
    resource_name: Annotated[str, Meta(min_length=1, max_length=249)] = "lakelog"
    pattern_type: Literal["literal", "prefixed"] = "literal"


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new API key for ``principal`` (its secret is in the answer, and only there)."""

    principal: Principal


REQUEST_MODELS: tuple[type[msgspec.Struct], ...] = (
    ProduceRecord, BatchRequest, TopicCreate, TopicPatch, ConfigUpdate, ConfigAlter, ProducerInit,
    DeleteRecordsRequest, JoinRequest, HeartbeatRequest, CommitRequest, SeekRequest, ResetRequest,
    AclBody, KeyCreate,
)


# -- responses -------------------------------------------------------------------------


# A fetch's records are the broker core's answer (ingest_api.broker.fetch), named here too.
from ingest_api.broker.fetch import Data as Data  # noqa: E402
from ingest_api.broker.fetch import FetchedRecord as FetchedRecord  # noqa: E402
from ingest_api.broker.fetch import Header as Header  # noqa: E402
from ingest_api.broker.fetch import RemoteFetch as RemoteFetch  # noqa: E402


class Success(msgspec.Struct, gc=False):
    """A batch entry's delivery report: Confluent's ``ProduceResponse`` with the entry's id."""

    id: str
    error_code: int
    cluster_id: str
    topic_name: str
    partition_id: int
    offset: int
    timestamp: msgspec.Raw
    """The record's time as an RFC 3339 JSON string."""
    key: msgspec.Raw | None
    value: msgspec.Raw | None
    """``{"type", "size"}``: the envelope's type and the bytes stored (null for a null)."""
