"""Fixtures of the client and CLI tests: a real server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data").start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill()
