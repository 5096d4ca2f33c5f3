"""The schema registry's operations, with Confluent Schema Registry's semantics.

One writer: the broker that serves the registry (alone: itself; in a cluster: the
leader of ``__schemas``-0) loads it from the log at the leader epoch it serves at, and
makes each change by writing its records (durably, fenced by that epoch) before it
applies them here, one change at a time. So an id is given once in the cluster, and a
change the client was told of survives any broker. Where this broker does not serve it,
``serving`` is None and the front passes the request on.

Semantics (Confluent's): registering a schema a subject has already answers its id; a
schema keeps one id in every subject; a version's number is one more than the subject's
highest, deleted ones included; ``latest`` (or -1) is the highest not deleted; a delete
is soft first (the version stays readable with ``deleted=true``) and permanent only after;
compatibility is checked against the versions not deleted; READONLY refuses writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from ingest_api.broker.schemas.compatibility import DEFAULT_LEVEL, level, problems
from ingest_api.broker.schemas.formats import (
    SCHEMA_TYPES,
    Reference,
    Resolve,
    Schema,
    canonical,
)
from ingest_api.broker.schemas.store import SchemaLog, wait_settled
from log_tables.errors import (
    IncompatibleSchemaError,
    InvalidModeError,
    InvalidSchemaError,
    InvalidVersionError,
    OperationNotPermittedError,
    ReferenceExistsError,
    SchemaNotFoundError,
    SchemaVersionNotSoftDeletedError,
    SchemaVersionSoftDeletedError,
    ServiceUnavailableError,
    SubjectLevelCompatibilityNotConfiguredError,
    SubjectLevelModeNotConfiguredError,
    SubjectNotFoundError,
    SubjectNotSoftDeletedError,
    SubjectSoftDeletedError,
    VersionNotFoundError,
)
from log_tables.typed.registry_state import (
    Record,
    RegistryState,
    Version,
    id_record,
    setting_record,
    version_record,
)

MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
DEFAULT_MODE = "READWRITE"
LATEST = -1


def version_number(value: str | int) -> int:
    """A version as a path gives it: a number from 1, or ``latest`` / -1 (``LATEST``)."""
    if isinstance(value, str) and value.lower() == "latest":
        return LATEST
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number != LATEST and not 1 <= number <= 2**31 - 1:
        raise InvalidVersionError(f"invalid version {value!r}: a number from 1 to "
                                  f"2147483647, or 'latest' (or -1)")
    return number


def mode(value: object) -> str:
    name = str(value).upper() if isinstance(value, str) else ""
    if name not in MODES:
        raise InvalidModeError(f"invalid mode {value!r}; one of {', '.join(MODES)}")
    return name


class SchemaRegistry:
    """The registry served from ``log`` (see the module)."""

    def __init__(self, log: SchemaLog) -> None:
        self.log = log
        self._state: RegistryState | None = None
        self._epoch: int | None = None
        self._lock = asyncio.Lock()

    # -- serving -------------------------------------------------------------------
    async def serving(self) -> RegistryState | None:
        """The registry as loaded at the epoch this broker serves it at (loaded again
        when that changed); None where another broker serves it."""
        epoch = self.log.epoch()
        if epoch is None:
            return None
        if self._state is None or self._epoch != epoch:
            async with self._lock:
                return await self._loaded()
        return self._state

    async def _loaded(self) -> RegistryState | None:
        """``serving``'s answer, under ``_lock`` (a change begins with it, so that it never
        works on a registry read before a failed write or at an older epoch)."""
        epoch = self.log.epoch()
        if epoch is None:
            return None
        if self._state is None or self._epoch != epoch:
            await wait_settled(self.log)  # (only what can no longer be lost)
            self._state = await asyncio.to_thread(self._load)
            self._epoch = epoch
        return self._state

    def _load(self) -> RegistryState:
        state = RegistryState()
        for key, value in self.log.load():
            state.apply(key, value)
        return state

    async def _write(self, state: RegistryState, records: Sequence[Record]) -> None:
        """Records durably in the log, then in ``state`` (under ``_lock``)."""
        assert self._epoch is not None
        try:
            await self.log.write(records, self._epoch)
        except BaseException:
            # The records may be in the log all the same (appended, then too few
            # replicas, or a timeout): read it again before the next change, so that an
            # id they took is never given to another schema.
            self._state = None
            raise
        for key, value in records:
            state.apply(key, value)

    async def _writable(self, subject: str | None, *, importing: bool = False
                        ) -> RegistryState:
        """The registry to change (under ``_lock``), if the mode allows."""
        state = await self._changing()
        current = self.mode_of(state, subject)
        if current in ("READONLY", "READONLY_OVERRIDE") or (
                importing and current != "IMPORT"):
            raise OperationNotPermittedError(
                f"{'subject ' + repr(subject) if subject else 'the registry'} is in mode "
                f"{current}" + (": ids and versions are given only in IMPORT mode"
                                if importing else ": it takes no writes"))
        return state

    async def _changing(self) -> RegistryState:
        """The registry to change, under ``_lock``."""
        state = await self._loaded()
        if state is None:
            raise ServiceUnavailableError("the schema registry moved to another broker "
                                          "while this change waited; try again")
        return state

    # -- look-ups ------------------------------------------------------------------
    def resolver(self, state: RegistryState) -> Resolve:
        def resolve(ref: Reference) -> Schema:
            v = state.subjects.get(ref.subject, {}).get(
                ref.version if ref.version != LATEST else
                max((x.version for x in state.live(ref.subject)), default=0))
            if v is None:
                raise InvalidSchemaError(f"reference {ref.name!r}: subject {ref.subject!r} "
                                         f"has no version {ref.version}")
            return v.schema
        return resolve

    def subjects(self, state: RegistryState, deleted: bool = False, prefix: str = ""
                 ) -> list[str]:
        return sorted(s for s, versions in state.subjects.items() if s.startswith(prefix)
                      and (deleted or any(not v.deleted for v in versions.values())))

    def versions(self, state: RegistryState, subject: str, deleted: bool = False
                 ) -> list[int]:
        all_versions = state.subjects.get(subject, {})
        out = sorted(n for n, v in all_versions.items() if deleted or not v.deleted)
        if not out:
            raise SubjectNotFoundError(f"subject {subject!r} not found")
        return out

    def version(self, state: RegistryState, subject: str, number: int,
                deleted: bool = False) -> Version:
        all_versions = state.subjects.get(subject)
        if not all_versions or not (deleted or any(not v.deleted
                                                   for v in all_versions.values())):
            raise SubjectNotFoundError(f"subject {subject!r} not found")
        if number == LATEST:
            live = [v for _, v in sorted(all_versions.items()) if deleted or not v.deleted]
            return live[-1]
        v = all_versions.get(number)
        if v is None or (v.deleted and not deleted):
            raise VersionNotFoundError(f"subject {subject!r} has no version {number}")
        return v

    def schema_by_id(self, state: RegistryState, schema_id: int) -> Schema:
        schema = state.schema(schema_id)
        if schema is None:
            raise SchemaNotFoundError(f"no schema of id {schema_id}")
        return schema

    def lookup(self, state: RegistryState, subject: str, schema: Schema,
               deleted: bool = False) -> Version:
        """The subject's version of the schema (``POST /subjects/{subject}``)."""
        versions = state.subjects.get(subject)
        if not versions or not (deleted or any(not v.deleted for v in versions.values())):
            raise SubjectNotFoundError(f"subject {subject!r} not found")
        for _, v in sorted(state.subjects[subject].items()):
            if v.schema.key == schema.key and (deleted or not v.deleted):
                return v
        raise SchemaNotFoundError(f"subject {subject!r} has no such schema")

    def level_of(self, state: RegistryState, subject: str | None) -> str:
        return state.configs.get(subject) or state.configs.get(None) or DEFAULT_LEVEL

    def mode_of(self, state: RegistryState, subject: str | None) -> str:
        return state.modes.get(subject) or state.modes.get(None) or DEFAULT_MODE

    def subject_level(self, state: RegistryState, subject: str | None,
                      default_to_global: bool) -> str:
        if subject is None or default_to_global:
            return self.level_of(state, subject)
        found = state.configs.get(subject)
        if found is None:
            raise SubjectLevelCompatibilityNotConfiguredError(
                f"subject {subject!r} has no compatibility level of its own")
        return found

    def subject_mode(self, state: RegistryState, subject: str | None,
                     default_to_global: bool) -> str:
        if subject is None or default_to_global:
            return self.mode_of(state, subject)
        found = state.modes.get(subject)
        if found is None:
            raise SubjectLevelModeNotConfiguredError(
                f"subject {subject!r} has no mode of its own")
        return found

    def parse(self, state: RegistryState, schema_type: str | None, text: str,
              references: Sequence[Reference], normalize: bool = False) -> Schema:
        return canonical((schema_type or "AVRO").upper(), text, references,
                         self.resolver(state), normalize)

    def referenced_by(self, state: RegistryState, subject: str, number: int) -> list[int]:
        v = self.version(state, subject, number, deleted=True)
        return sorted({x.id for versions in state.subjects.values() for x in versions.values()
                       if any(r.subject == subject and r.version == v.version
                              for r in x.schema.references)})

    def test(self, state: RegistryState, subject: str, schema: Schema,
             number: int | None) -> list[str]:
        """Why ``schema`` would break the subject's level: against one version, or
        (``number`` None) the versions the level names."""
        compat = self.level_of(state, subject)
        live = [v.schema for v in state.live(subject)]
        if number is None:
            return problems(compat, schema, live, self.resolver(state))
        if not live and number == LATEST:
            return []
        one = self.version(state, subject, number).schema
        return problems(compat.replace("_TRANSITIVE", ""), schema, [one],
                        self.resolver(state))

    # -- changes -------------------------------------------------------------------
    async def register(self, subject: str, schema_type: str | None, text: str,
                       references: Sequence[Reference], normalize: bool = False,
                       schema_id: int | None = None, number: int | None = None) -> Version:
        """Register the schema under the subject (its version; an existing one as it is)."""
        importing = schema_id is not None or number is not None
        async with self._lock:
            state = await self._writable(subject, importing=importing)
            schema = self.parse(state, schema_type, text, references, normalize)
            versions = state.subjects.get(subject, {})
            for _, v in sorted(versions.items()):
                if v.schema.key == schema.key and not v.deleted and not importing:
                    return v
            if not importing:
                found = problems(self.level_of(state, subject), schema,
                                 [v.schema for v in state.live(subject)], self.resolver(state))
                if found:
                    raise IncompatibleSchemaError(
                        f"schema being registered is incompatible with an earlier schema for "
                        f"subject {subject!r}: {'; '.join(found)}")
            known = state.id_of(schema)
            if schema_id is not None:
                other = state.schema(schema_id)
                if other is not None and other.key != schema.key:
                    raise OperationNotPermittedError(
                        f"id {schema_id} is another schema's already")
                if known is not None and known != schema_id:
                    raise OperationNotPermittedError(
                        f"the schema has id {known} already; import it with that id")
            new_id = schema_id if schema_id is not None else known if known is not None \
                else state.next_id
            new_number = number if number is not None else max(versions, default=0) + 1
            if number is not None and number in versions:
                raise OperationNotPermittedError(
                    f"subject {subject!r} has a version {number} already")
            v = Version(subject, new_number, new_id, schema)
            records = [version_record(v, subject, new_number)]
            if new_id >= state.next_id:
                records.insert(0, id_record(new_id + 1))
            await self._write(state, records)
            return state.subjects[subject][new_number]

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        async with self._lock:
            state = await self._writable(subject)
            versions = state.subjects.get(subject)
            if not versions:
                raise SubjectNotFoundError(f"subject {subject!r} not found")
            if permanent:
                live = [n for n, v in versions.items() if not v.deleted]
                if live:
                    raise SubjectNotSoftDeletedError(
                        f"subject {subject!r} must be soft-deleted before it is deleted "
                        "permanently")
                numbers = sorted(versions)
                self._no_references(state, subject, numbers)
                records = [version_record(None, subject, n) for n in numbers]
                records += [setting_record("CONFIG", subject, None),
                            setting_record("MODE", subject, None)]
            else:
                numbers = sorted(n for n, v in versions.items() if not v.deleted)
                if not numbers:
                    raise SubjectSoftDeletedError(
                        f"subject {subject!r} was soft-deleted; delete it with "
                        "permanent=true to remove it for good")
                self._no_references(state, subject, numbers)
                records = [version_record(replace(versions[n], deleted=True), subject, n)
                           for n in numbers]
            await self._write(state, records)
            return numbers

    async def delete_version(self, subject: str, number: int, permanent: bool = False
                             ) -> int:
        async with self._lock:
            state = await self._writable(subject)
            v = self.version(state, subject, number, deleted=True) if number != LATEST \
                else self.version(state, subject, LATEST)
            if permanent and not v.deleted:
                raise SchemaVersionNotSoftDeletedError(
                    f"version {v.version} of subject {subject!r} must be soft-deleted before "
                    "it is deleted permanently")
            if not permanent and v.deleted:
                raise SchemaVersionSoftDeletedError(
                    f"version {v.version} of subject {subject!r} was soft-deleted")
            self._no_references(state, subject, [v.version])
            record = version_record(None if permanent else replace(v, deleted=True), subject,
                                    v.version)
            await self._write(state, [record])
            return v.version

    def _no_references(self, state: RegistryState, subject: str, numbers: list[int]) -> None:
        for n in numbers:
            users = [x for versions in state.subjects.values() for x in versions.values()
                     if not x.deleted and x.subject != subject and any(
                         r.subject == subject and r.version == n for r in x.schema.references)]
            if users:
                raise ReferenceExistsError(
                    f"version {n} of subject {subject!r} is referred to by "
                    f"{', '.join(f'{u.subject} version {u.version}' for u in users)}")

    async def set_level(self, subject: str | None, value: object) -> str:
        name = level(value)
        async with self._lock:
            state = await self._changing()
            await self._write(state, [setting_record("CONFIG", subject, name)])
        return name

    async def delete_level(self, subject: str | None) -> str:
        async with self._lock:
            state = await self._changing()
            before = self.subject_level(state, subject, subject is None)
            await self._write(state, [setting_record("CONFIG", subject, None)])
        return before

    async def set_mode(self, subject: str | None, value: object) -> str:
        name = mode(value)
        async with self._lock:
            state = await self._changing()
            await self._write(state, [setting_record("MODE", subject, name)])
        return name

    async def delete_mode(self, subject: str | None) -> str:
        async with self._lock:
            state = await self._changing()
            before = self.subject_mode(state, subject, subject is None)
            await self._write(state, [setting_record("MODE", subject, None)])
        return before


__all__ = ["LATEST", "MODES", "SCHEMA_TYPES", "SchemaRegistry", "mode", "version_number"]
