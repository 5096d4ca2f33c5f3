"""Fixtures of the log tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from log_tables.clock import ManualClock
from log_tables.hot.log_manager import LogManager


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    """A log manager on a fresh data directory with a manual clock at 1,000,000 ms."""
    m = LogManager(tmp_path / "data", clock=ManualClock(1_000_000))
    yield m
    m.close()
