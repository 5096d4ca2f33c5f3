"""``TopicAdmin`` driven without HTTP (a broker alone): lakelog's own requests in, its
metadata and errors out, the same checks the HTTP answers are made of."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest_api.broker.topics import NewTopic, ReplicaAssignment, TopicAdmin
from log_tables.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    UnknownConfigError,
    UnknownTopicError,
)
from log_tables.hot.log_manager import LogManager


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[TopicAdmin]:
    manager = LogManager(tmp_path / "data")
    try:
        # Alone, creating and changing topics needs neither the Delta tier nor the groups.
        yield TopicAdmin(manager, None, None, 1)  # type: ignore[arg-type]
    finally:
        manager.close()


def test_create_validate_only_and_configs(admin: TopicAdmin) -> None:
    assert admin.controller() is None  # alone: every change is this broker's
    checked = asyncio.run(admin.create(NewTopic("orders", 3, validate_only=True)))
    assert not checked.created and checked.topic.partitions == 3
    assert "orders" not in admin.manager.registry
    made = asyncio.run(admin.create(NewTopic("orders", 3, configs=(
        ("retention.ms", "60000"), ("cleanup.policy", None)))))
    assert made.created and not made.coordinator_slots and made.replication_factor is None
    assert admin.describe("orders").overrides.keys() == {"retention.ms"}
    asyncio.run(admin.set_config("orders", "retention.ms", None))  # back to the default
    assert admin.describe("orders").overrides == {}
    asyncio.run(admin.alter_configs("orders", [("segment.bytes", "1048576")],
                                    validate_only=True))
    assert admin.describe("orders").overrides == {}
    assert asyncio.run(admin.add_partitions("orders", 5)).partitions == 5
    assert admin.config("orders", "retention.ms").name == "orders"


def test_errors_are_the_tables(admin: TopicAdmin) -> None:
    with pytest.raises(InvalidReplicationFactorError, match="more than the 1 live broker"):
        asyncio.run(admin.create(NewTopic("t", 1, replication_factor=2)))
    with pytest.raises(InvalidReplicationFactorError, match="must be 1 or more"):
        asyncio.run(admin.create(NewTopic("t", 1, replication_factor=0)))
    with pytest.raises(InvalidPartitionsError, match=r"name partitions 0\.\.1"):
        asyncio.run(admin.create(NewTopic("t", replicas_assignments=(
            ReplicaAssignment(0, (1,)), ReplicaAssignment(2, (1,))))))
    with pytest.raises(InvalidReplicaAssignmentError, match="lakelog is one broker"):
        asyncio.run(admin.create(NewTopic("t", replicas_assignments=(
            ReplicaAssignment(0, (2,)),))))
    with pytest.raises(InvalidConfigError, match="unknown topic config"):
        asyncio.run(admin.create(NewTopic("t", 1, configs=(("no.such", None),))))
    asyncio.run(admin.create(NewTopic("t", 1)))
    with pytest.raises(UnknownConfigError, match=r"'no\.such' does not exist"):
        admin.config("t", "no.such")
    with pytest.raises(UnknownTopicError):
        admin.describe("absent")
