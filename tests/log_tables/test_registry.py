from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from log_tables.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    StorageError,
    TopicExistsError,
    UnknownTopicError,
)
from log_tables.registry import TopicRegistry

ROOT = Path(__file__).resolve().parents[2]


def test_create_list_describe_delete(tmp_path: Path) -> None:
    registry = TopicRegistry(tmp_path)
    created = registry.create("orders", 3, {"cleanup.policy": "compact"})
    registry.create("audit", 1)
    assert [t.name for t in registry.list()] == ["audit", "orders"]
    orders = TopicRegistry(tmp_path).describe("orders")  # persisted
    assert orders == created and orders.partitions == 3
    assert orders.config.compact and orders.overrides == {"cleanup.policy": "compact"}
    registry.delete("audit")
    assert [t.name for t in TopicRegistry(tmp_path).list()] == ["orders"]
    with pytest.raises(UnknownTopicError, match="audit"):
        registry.describe("audit")
    with pytest.raises(UnknownTopicError):
        registry.delete("audit")


def test_invalid_requests_name_what_to_fix(tmp_path: Path) -> None:
    registry = TopicRegistry(tmp_path)
    registry.create("a", 1)
    with pytest.raises(TopicExistsError, match="'a'"):
        registry.create("a", 1)
    with pytest.raises(InvalidTopicError, match="bad name"):
        registry.create("bad name", 1)
    with pytest.raises(InvalidPartitionsError, match="10001"):
        registry.create("b", 10_001)
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        registry.create("c", 1, {"retention.ms": "forever"})
    with pytest.raises(InvalidTopicError, match="only in case"):  # one Spark SQL view name
        registry.create("A", 1)
    with pytest.raises(InvalidTopicError, match="reserved"):
        registry.create("consumer_offsets", 1)
    assert [t.name for t in registry.list()] == ["a"]


def test_alter_configs_and_add_partitions(tmp_path: Path) -> None:
    registry = TopicRegistry(tmp_path)
    registry.create("t", 2, {"retention.ms": "5000", "segment.bytes": "4096"})
    altered = registry.alter_configs("t", {"retention.ms": "9000"}, delete_configs=["segment.bytes"])
    assert altered.overrides == {"retention.ms": "9000"}
    assert altered.config.segment_bytes == 64 * 1024 * 1024  # back to the default
    with pytest.raises(InvalidConfigError):
        registry.alter_configs("t", {"segment.bytes": "-3"})
    with pytest.raises(InvalidConfigError):
        registry.alter_configs("t", delete_configs=["nope"])
    assert registry.add_partitions("t", 5).partitions == 5
    with pytest.raises(InvalidPartitionsError, match="only grow"):
        registry.add_partitions("t", 4)
    assert TopicRegistry(tmp_path).describe("t").partitions == 5


@pytest.mark.parametrize("step", ["write", "fsync", "replace", "fsync_dir"])
def test_failure_at_each_step_of_a_write_keeps_the_old_state(tmp_path: Path, step: str) -> None:
    # Injected faults: a crash cannot be aimed at one syscall for real, so each
    # step of the atomic write is made to fail and the state left behind checked.
    registry = TopicRegistry(tmp_path)
    registry.create("kept", 1)
    target = {"write": "os.write", "fsync": "os.fsync", "replace": "os.replace",
              "fsync_dir": "log_tables.files.fsync_dir"}[step]
    with mock.patch(target, side_effect=OSError(5, "injected")), pytest.raises(StorageError):
        registry.create("lost", 1)
    names = [t.name for t in TopicRegistry(tmp_path).list()]
    if step == "fsync_dir":
        assert names == ["kept", "lost"]  # renamed already: the new state, whole
    else:
        assert names == ["kept"]


@pytest.mark.slow
def test_killed_writer_leaves_old_or_new_state(tmp_path: Path) -> None:
    for round_ in range(5):
        proc = subprocess.Popen([sys.executable, "-m", "tests.log_tables.registry_proc", str(tmp_path)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        last = -1
        deadline = time.monotonic() + 30
        while last < 5 * (round_ + 1) and time.monotonic() < deadline:
            last = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        topics = TopicRegistry(tmp_path).list()
        names = sorted(int(t.name[1:]) for t in topics)
        assert names == list(range(len(names))), "registry is not a prefix of what was created"
        assert len(names) >= last + 1, "a topic reported as created was lost"
        for t in topics:
            i = int(t.name[1:])
            assert t.partitions == 1 + i % 5 and t.overrides == {"retention.ms": str(1000 + i)}
