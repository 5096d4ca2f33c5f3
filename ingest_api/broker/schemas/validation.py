"""Broker-side schema validation (Confluent Server's ``confluent.value.schema.validation``
and ``confluent.key.schema.validation`` topic configs): with it on, a key or value must be
in Confluent's wire format (a zero byte, then a 4-byte schema id) with an id registered,
and not deleted, under its subject; the subject by the topic's
``confluent.*.subject.name.strategy`` (``<topic>-value``; the record's full name; or
``<topic>-<full name>``). A null key or value (a tombstone) passes. A record that fails
is refused alone (``InvalidRecordError``: Kafka's INVALID_RECORD), saying why.

Which subjects an id is under is asked of the registry (here, or the broker serving it)
and a yes is kept for ``KEEP_S``; a no is asked again, so that a schema registered a
moment before its first record is found.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from ingest_api.broker.schemas.formats import AVRO, PROTOBUF, Schema
from ingest_api.broker.schemas.source import RegistrySource
from log_tables.config import TopicConfig
from log_tables.errors import InvalidRecordError, LakelogError, SchemaNotFoundError
from log_tables.typed import protobuf

KEEP_S = 30.0
MAX_KEPT = 10_000


class SchemaValidation:
    def __init__(self, source: RegistrySource) -> None:
        self.source = source
        self._yes: dict[tuple[str, int], float] = {}
        self._names: dict[int, str] = {}
        """Record names by schema id (an id's schema never changes)."""

    @staticmethod
    def applies(config: TopicConfig) -> bool:
        return config.confluent_key_schema_validation or config.confluent_value_schema_validation

    async def check(self, topic: str, config: TopicConfig,
                    keys: Sequence[bytes | None], values: Sequence[bytes | None]
                    ) -> dict[int, LakelogError]:
        """The records (by index) whose key or value the topic's validation refuses."""
        errors: dict[int, LakelogError] = {}
        for is_key, on, strategy, blobs in (
                (True, config.confluent_key_schema_validation,
                 config.confluent_key_subject_name_strategy, keys),
                (False, config.confluent_value_schema_validation,
                 config.confluent_value_subject_name_strategy, values)):
            if not on:
                continue
            part = "key" if is_key else "value"
            verdicts: dict[int, str | None] = {}
            for i, blob in enumerate(blobs):
                if blob is None or i in errors:
                    continue
                if len(blob) < 5 or blob[0] != 0:
                    errors[i] = InvalidRecordError(
                        f"record {i}'s {part} is not in Confluent's wire format (a zero byte "
                        f"and a schema id first), and confluent.{part}.schema.validation is "
                        "on for this topic: serialize it with a registry's serializer")
                    continue
                schema_id = int.from_bytes(blob[1:5], "big")
                if schema_id not in verdicts:
                    verdicts[schema_id] = await self._why_not(topic, is_key, strategy, schema_id)
                why = verdicts[schema_id]
                if why is not None:
                    errors[i] = InvalidRecordError(f"record {i}'s {part}: {why}")
        return errors

    async def _why_not(self, topic: str, is_key: bool, strategy: str, schema_id: int
                       ) -> str | None:
        """Why the id is not one the subject has (None: it is)."""
        now = time.monotonic()
        try:
            subject = await self._subject(topic, is_key, strategy, schema_id)
        except SchemaNotFoundError:
            return f"schema id {schema_id} is not registered"
        kept = self._yes.get((subject, schema_id))
        if kept is not None and kept > now:
            return None
        if subject in {s for s, _ in await self.source.versions_of(schema_id)}:
            if len(self._yes) >= MAX_KEPT:
                self._yes.clear()
            self._yes[(subject, schema_id)] = now + KEEP_S
            return None
        return (f"schema id {schema_id} is not registered under subject {subject!r} "
                f"({strategy}); register it there first")

    async def _subject(self, topic: str, is_key: bool, strategy: str, schema_id: int) -> str:
        if strategy == "TopicNameStrategy":
            return f"{topic}-{'key' if is_key else 'value'}"
        name = self._names.get(schema_id)
        if name is None:
            name = record_name(await self.source.by_id(schema_id))
            if len(self._names) >= MAX_KEPT:
                self._names.clear()
            self._names[schema_id] = name
        return name if strategy == "RecordNameStrategy" else f"{topic}-{name}"


def record_name(schema: Schema) -> str:
    """A schema's full record name (Avro: namespace and name; JSON Schema: its title)."""
    if schema.schema_type == PROTOBUF:
        return protobuf.first_name(protobuf.file_proto(schema.text))
    doc = json.loads(schema.text)
    if not isinstance(doc, dict):
        return str(doc)
    if schema.schema_type == AVRO:
        name = str(doc.get("name", ""))
        namespace = doc.get("namespace")
        return name if "." in name or not namespace else f"{namespace}.{name}"
    return str(doc.get("title", ""))
