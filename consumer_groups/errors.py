"""Errors of the group coordinator. They live in ``log_tables.errors`` with every other
error lakelog raises (one table of names, Kafka codes and ``retriable`` for the server and
the client); this module keeps the names where the group code imports them."""

from __future__ import annotations

from log_tables.errors import (
    GroupNotEmptyError,
    InconsistentGroupError,
    NoOffsetError,
    StaleMemberEpochError,
    UnknownGroupError,
    UnknownMemberError,
)

__all__ = [
    "GroupNotEmptyError",
    "InconsistentGroupError",
    "NoOffsetError",
    "StaleMemberEpochError",
    "UnknownGroupError",
    "UnknownMemberError",
]
