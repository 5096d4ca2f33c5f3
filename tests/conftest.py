"""Shared fixtures: factories for partition logs and registries on real files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from log_tables.clock import ManualClock
from log_tables.config import TopicConfig
from log_tables.partition_log import PartitionLog

OpenLog = Callable[..., PartitionLog]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock) -> Iterator[OpenLog]:
    """Open (or reopen) the partition log under ``tmp_path/log`` with config overrides."""
    opened: list[PartitionLog] = []

    def factory(directory: Path | None = None, **config: object) -> PartitionLog:
        plog = PartitionLog.open(directory or tmp_path / "log", TopicConfig(**config),  # type: ignore[arg-type]
                                 name="t-0", clock=clock)
        opened.append(plog)
        return plog

    yield factory
    for plog in opened:
        plog.abandon()
