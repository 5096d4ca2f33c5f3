"""Errors of the group coordinator (each mapped to an HTTP status in ``ingest_api.errors``)."""

from __future__ import annotations

from log_tables.errors import LakelogError


class UnknownGroupError(LakelogError):
    code = "group_id_not_found"

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist")


class UnknownMemberError(LakelogError):
    """The member left, timed out or was replaced: rejoin (member epoch 0)."""

    code = "unknown_member_id"

    def __init__(self, group: str, member: str | None) -> None:
        super().__init__(f"member {member!r} is not in consumer group {group!r} (it left, "
                         "missed its session timeout or was replaced): join again")


class StaleMemberEpochError(LakelogError):
    """A call with an epoch other than the member's current one: a zombie, fenced."""

    code = "stale_member_epoch"

    def __init__(self, group: str, member: str, given: int, current: int) -> None:
        super().__init__(f"member {member!r} of consumer group {group!r} sent epoch {given}, "
                         f"its current epoch is {current}: the call is fenced (heartbeat to "
                         "get the current epoch and assignment, or join again)")


class GroupNotEmptyError(LakelogError):
    code = "non_empty_group"

    def __init__(self, group: str, members: int, action: str) -> None:
        super().__init__(f"consumer group {group!r} has {members} active member(s): stop them "
                         f"before you {action}")


class InconsistentGroupError(LakelogError):
    """A join that does not fit the group (another assignor, too many members)."""

    code = "inconsistent_group_protocol"


class NoOffsetError(LakelogError):
    """auto.offset.reset = none and no committed offset (or it is out of range)."""

    code = "no_offset_for_partition"
