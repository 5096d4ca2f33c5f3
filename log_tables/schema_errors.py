"""The errors of the schema registry (Confluent Schema Registry's, by its names). Part of
``log_tables.errors``'s one table, which gathers them; import them from there. Kafka has
no codes for them (the registry is not in its protocol); the HTTP front answers each with
Confluent's own ``error_code`` (40401 an unknown subject, 409 an incompatible schema,
42201 an invalid one, ...).
"""

from __future__ import annotations

from log_tables.error_root import LakelogError


class SubjectNotFoundError(LakelogError):
    """No subject of this name (or only a soft-deleted one, unless asked for those)."""
    code = "subject_not_found"


class VersionNotFoundError(LakelogError):
    """The subject has no such version."""
    code = "version_not_found"


class SchemaNotFoundError(LakelogError):
    """No schema of this id, or not this schema under the subject."""
    code = "schema_not_found"


class SubjectSoftDeletedError(LakelogError):
    """The subject was soft-deleted: register again, or delete it permanently."""
    code = "subject_soft_deleted"


class SubjectNotSoftDeletedError(LakelogError):
    """A permanent delete of a subject (or version) that was not soft-deleted first."""
    code = "subject_not_soft_deleted"


class SchemaVersionSoftDeletedError(LakelogError):
    """The version was soft-deleted."""
    code = "schema_version_soft_deleted"


class SchemaVersionNotSoftDeletedError(LakelogError):
    """A permanent delete of a version that was not soft-deleted first."""
    code = "schema_version_not_soft_deleted"


class SubjectLevelCompatibilityNotConfiguredError(LakelogError):
    """The subject has no compatibility level of its own (``defaultToGlobal`` gives the
    global one)."""
    code = "subject_level_compatibility_not_configured"


class SubjectLevelModeNotConfiguredError(LakelogError):
    """The subject has no mode of its own."""
    code = "subject_level_mode_not_configured"


class IncompatibleSchemaError(LakelogError):
    """The schema breaks the subject's compatibility level against an earlier version."""
    code = "incompatible_schema"


class InvalidSchemaError(LakelogError):
    """The schema does not parse as its type (or a reference is missing)."""
    code = "invalid_schema"


class InvalidVersionError(LakelogError):
    """A version that is neither a number from 1 nor ``latest`` (or -1)."""
    code = "invalid_version"


class InvalidCompatibilityLevelError(LakelogError):
    """A compatibility level Confluent does not name."""
    code = "invalid_compatibility_level"


class InvalidModeError(LakelogError):
    """A mode Confluent does not name."""
    code = "invalid_mode"


class OperationNotPermittedError(LakelogError):
    """A write the subject's (or the registry's) mode refuses, e.g. READONLY."""
    code = "operation_not_permitted"


class ReferenceExistsError(LakelogError):
    """A delete of a version another schema refers to."""
    code = "reference_exists"


SCHEMA_ERRORS: tuple[type[LakelogError], ...] = (
    SubjectNotFoundError, VersionNotFoundError, SchemaNotFoundError, SubjectSoftDeletedError,
    SubjectNotSoftDeletedError, SchemaVersionSoftDeletedError, SchemaVersionNotSoftDeletedError,
    SubjectLevelCompatibilityNotConfiguredError, SubjectLevelModeNotConfiguredError,
    IncompatibleSchemaError, InvalidSchemaError, InvalidVersionError,
    InvalidCompatibilityLevelError, InvalidModeError, OperationNotPermittedError,
    ReferenceExistsError,
)

__all__ = [
    "SCHEMA_ERRORS",
    "IncompatibleSchemaError",
    "InvalidCompatibilityLevelError",
    "InvalidModeError",
    "InvalidSchemaError",
    "InvalidVersionError",
    "OperationNotPermittedError",
    "ReferenceExistsError",
    "SchemaNotFoundError",
    "SchemaVersionNotSoftDeletedError",
    "SchemaVersionSoftDeletedError",
    "SubjectLevelCompatibilityNotConfiguredError",
    "SubjectLevelModeNotConfiguredError",
    "SubjectNotFoundError",
    "SubjectNotSoftDeletedError",
    "SubjectSoftDeletedError",
    "VersionNotFoundError",
]
