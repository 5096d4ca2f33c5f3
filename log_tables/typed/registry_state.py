"""The schema registry as the records of ``__schemas`` make it (the broker's registry
serves it; the typed tables' job reads it from a replica: ``log_tables.typed.catalog``).

Each record's key says what it is (JSON, as Confluent's ``_schemas`` keys are):
``{"keytype": "SCHEMA", "subject", "version"}`` with the version's id, schema and
whether it is soft-deleted (a null value: deleted for good); ``{"keytype": "CONFIG",
"subject"}`` a compatibility level (subject null: the global one; a null value: unset);
``{"keytype": "MODE", "subject"}`` a mode; ``{"keytype": "ID"}`` the next schema id
to give, written with every new id so that an id is never given twice, even once the
schemas of it are deleted for good and compacted away. The newest record of a key wins
(the topic is compacted), so a replay from the log start gives the registry.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Record = tuple[bytes, bytes | None]


@dataclass(frozen=True, slots=True)
class Reference:
    """A named schema this one uses: ``subject``'s ``version``, known as ``name``."""

    name: str
    subject: str
    version: int

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class Schema:
    """A schema as stored: its type, canonical text and references."""

    schema_type: str
    text: str
    references: tuple[Reference, ...] = ()

    @property
    def key(self) -> tuple[str, str, tuple[Reference, ...]]:
        """What makes two schemas the same (and so of the same id)."""
        return self.schema_type, self.text, self.references


Resolve = Callable[[Reference], Schema]
"""A reference's schema (raises ``InvalidSchemaError`` when it does not exist)."""


@dataclass(slots=True)
class Version:
    """One version of a subject."""

    subject: str
    version: int
    id: int
    schema: Schema
    deleted: bool = False


@dataclass(slots=True)
class RegistryState:
    """Subjects with their versions, schemas by id, levels and modes."""

    subjects: dict[str, dict[int, Version]] = field(default_factory=dict)
    configs: dict[str | None, str] = field(default_factory=dict)
    modes: dict[str | None, str] = field(default_factory=dict)
    next_id: int = 1

    # -- queries -------------------------------------------------------------------
    def schema(self, schema_id: int) -> Schema | None:
        """The schema of an id, while any version (even soft-deleted) has it."""
        for v in self.with_id(schema_id):
            return v.schema
        return None

    def with_id(self, schema_id: int) -> Iterable[Version]:
        for versions in self.subjects.values():
            for v in versions.values():
                if v.id == schema_id:
                    yield v

    def id_of(self, schema: Schema) -> int | None:
        """The id of a schema any subject has (a schema keeps one id everywhere)."""
        for versions in self.subjects.values():
            for v in versions.values():
                if v.schema.key == schema.key:
                    return v.id
        return None

    def live(self, subject: str) -> list[Version]:
        """The subject's versions not deleted, oldest first."""
        return [v for _, v in sorted(self.subjects.get(subject, {}).items()) if not v.deleted]

    # -- applying records ----------------------------------------------------------
    def apply(self, key: bytes, value: bytes | None) -> None:
        """A record of ``__schemas``; one that is not the registry's is logged and passed
        over (so that a bad record never stops the registry loading)."""
        try:
            k = json.loads(key)
            v = None if value is None else json.loads(value)
            self._apply(k, v)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("__schemas: a record that is not the registry's (%s) passed over: %r",
                        exc, key[:200])

    def _apply(self, k: dict[str, Any], v: dict[str, Any] | None) -> None:
        kind = k["keytype"]
        if kind == "SCHEMA":
            subject, version = str(k["subject"]), int(k["version"])
            if v is None:
                versions = self.subjects.get(subject, {})
                versions.pop(version, None)
                if not versions:
                    self.subjects.pop(subject, None)
                return
            schema = Schema(str(v.get("schemaType", "AVRO")), str(v["schema"]), tuple(
                Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                for r in v.get("references") or []))
            schema_id = int(v["id"])
            self.subjects.setdefault(subject, {})[version] = Version(
                subject, version, schema_id, schema, bool(v.get("deleted", False)))
            self.next_id = max(self.next_id, schema_id + 1)
        elif kind in ("CONFIG", "MODE"):
            target = self.configs if kind == "CONFIG" else self.modes
            name: str | None = k.get("subject")
            if v is None:
                target.pop(name, None)
            else:
                target[name] = str(v["compatibilityLevel" if kind == "CONFIG" else "mode"])
        elif kind == "ID":
            if v is not None:
                self.next_id = max(self.next_id, int(v["next"]))
        else:
            raise ValueError(f"unknown keytype {kind!r}")


def _key(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _value(doc: dict[str, Any] | None) -> bytes | None:
    return None if doc is None else json.dumps(doc, separators=(",", ":")).encode()


def version_record(v: Version | None, subject: str, version: int) -> Record:
    """A version as its record (None: deleted for good)."""
    key = _key({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})
    if v is None:
        return key, None
    doc: dict[str, Any] = {"subject": subject, "version": version, "id": v.id,
                           "schemaType": v.schema.schema_type, "schema": v.schema.text,
                           "deleted": v.deleted}
    if v.schema.references:
        doc["references"] = [r.as_json() for r in v.schema.references]
    return key, _value(doc)


def setting_record(kind: str, subject: str | None, value: str | None) -> Record:
    """A subject's (None: the global) compatibility level (``CONFIG``) or mode (``MODE``);
    a None value unsets it."""
    name = "compatibilityLevel" if kind == "CONFIG" else "mode"
    return (_key({"keytype": kind, "subject": subject, "magic": 0}),
            _value(None if value is None else {name: value}))


def id_record(next_id: int) -> Record:
    return _key({"keytype": "ID", "magic": 0}), _value({"next": next_id})
