"""ACLs and principals: Kafka's model without deny rules.

An ACL is ``{principal, resource_type, resource_name, pattern_type, operation}``:
``topic``/``group`` resources by exact name (``literal``) or ``prefixed``; operations
``produce``, ``consume``, ``describe``, ``alter``, ``delete`` (topics), ``consume``,
``commit``, ``describe``, ``alter``, ``delete`` (groups), ``write`` and ``describe``
(``transactional_id``s: a transactional producer's), and ``admin`` on the
``cluster``, which allows everything (Kafka's super users): topic creation, ACL and key
changes among it. Any operation on a resource implies ``describe`` of it, as in Kafka.

A principal is 1-200 characters of ``[A-Za-z0-9._@-]``; ``broker-N`` names broker N,
which authenticates with a key of its own (``security.SecurityStore.broker_credentials``)
and which users may not take. The store of ACLs and keys is ``ingest_api.broker.security``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

RESOURCE_TYPES = ("topic", "group", "cluster", "transactional_id")
PATTERN_TYPES = ("literal", "prefixed")
OPERATIONS = {
    "topic": ("produce", "consume", "describe", "alter", "delete"),
    "group": ("consume", "commit", "describe", "alter", "delete"),
    "cluster": ("describe", "admin"),
    "transactional_id": ("write", "describe"),
}
CLUSTER = "lakelog"
_BROKER_PRINCIPAL = re.compile(r"broker-[0-9]+")


class SecurityError(ValueError):
    """A bad key or ACL definition (the message says what to fix)."""


@dataclass(frozen=True, slots=True)
class Acl:
    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str

    def __post_init__(self) -> None:
        if not valid_principal(self.principal):
            raise SecurityError("principal must be 1-200 characters of [A-Za-z0-9._@-]")
        if self.resource_type not in RESOURCE_TYPES:
            raise SecurityError(f"resource_type must be one of {', '.join(RESOURCE_TYPES)}")
        if self.pattern_type not in PATTERN_TYPES:
            raise SecurityError(f"pattern_type must be one of {', '.join(PATTERN_TYPES)}")
        allowed = OPERATIONS[self.resource_type]
        if self.operation not in allowed:
            raise SecurityError(f"operation on a {self.resource_type} must be one of "
                                f"{', '.join(allowed)}")
        if self.resource_type == "cluster" and (self.resource_name, self.pattern_type) != (
                CLUSTER, "literal"):
            raise SecurityError(f"the cluster resource is named '{CLUSTER}' (literal)")
        if not self.resource_name or len(self.resource_name) > 249:
            raise SecurityError("resource_name must be 1-249 characters")

    def covers(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "literal":
            return name == self.resource_name
        return name.startswith(self.resource_name)


def allows(acls: Iterable[Acl], resource_type: str, name: str, operation: str) -> bool:
    """Whether one principal's ``acls`` allow ``operation`` on the resource: cluster
    ``admin`` allows everything, and any operation on a resource its ``describe``."""
    for a in acls:
        if a.resource_type == "cluster" and a.operation == "admin":
            return True
        if a.covers(resource_type, name) and (
                a.operation == operation or operation == "describe"):
            return True
    return False


def valid_principal(name: str) -> bool:
    """1-200 characters of ``[A-Za-z0-9._@-]``."""
    return 0 < len(name) <= 200 and all(c.isalnum() or c in "._@-" for c in name) and name.isascii()


def broker_principal(broker_id: int) -> str:
    """The principal broker ``broker_id`` authenticates as: ``broker-N``."""
    return f"broker-{int(broker_id)}"


def is_broker_principal(name: str | None) -> bool:
    """Whether ``name`` is a broker's own principal (``broker-<digits>``)."""
    return name is not None and _BROKER_PRINCIPAL.fullmatch(name) is not None
