"""The bodies of lakelog's transaction API (Confluent's REST v3 has none): the calls of
Kafka's transactional producer, one resource per transactional id."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from ingest_api.http.models import Name, NonNegative, OffsetEntry, TopicName

Epoch = Annotated[int, Meta(ge=0, le=32_767)]


class TxnInit(msgspec.Struct, forbid_unknown_fields=True):
    """Kafka's InitProducerId with a transactional id (``transaction.timeout.ms``)."""

    transaction_timeout_ms: Annotated[int, Meta(ge=1, le=2**31 - 1)] = 60_000


class TxnPartition(msgspec.Struct, forbid_unknown_fields=True):
    topic_name: TopicName
    partition_id: NonNegative


class TxnPartitions(msgspec.Struct, forbid_unknown_fields=True):
    """Kafka's AddPartitionsToTxn."""

    producer_id: NonNegative
    producer_epoch: Epoch
    partitions: Annotated[list[TxnPartition], Meta(min_length=1, max_length=10_000)]


class TxnOffsets(msgspec.Struct, forbid_unknown_fields=True):
    """Kafka's AddOffsetsToTxn and TxnOffsetCommit in one: the group's offsets commit
    with the transaction, if ``member_id`` at ``member_epoch`` is the group's (KIP-447)."""

    producer_id: NonNegative
    producer_epoch: Epoch
    group_id: Name
    offsets: Annotated[list[OffsetEntry], Meta(min_length=1, max_length=10_000)]
    member_id: Name | None = None
    member_epoch: Annotated[int, Meta(ge=-1)] = -1


class TxnEnd(msgspec.Struct, forbid_unknown_fields=True):
    """Kafka's EndTxn (the outcome is the path's: ``:commit`` or ``:abort``)."""

    producer_id: NonNegative
    producer_epoch: Epoch


TXN_REQUEST_MODELS = (TxnInit, TxnPartitions, TxnOffsets, TxnEnd)
"""The bodies the OpenAPI document's components describe (``ingest_api.http.app``)."""
