"""An S3 endpoint on loopback: ``moto_server`` in a subprocess (``bench/moto.py``: moto's
in-process ThreadedMotoServer deadlocks with delta-rs, which waits on its own HTTP calls
holding the GIL), and a bucket per test with the AWS variables set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from bench.moto import SECRET_KEY, S3Endpoint, aws_env, make_bucket, start_moto, stop_moto
from log_tables.hot.log_manager import LogManager

__all__ = ["SECRET_KEY", "S3Bucket", "S3Endpoint", "aws_env", "start_moto", "stop_moto"]


class S3Bucket(NamedTuple):
    name: str
    env: dict[str, str]
    """The AWS variables that reach it (also set in this process for the test)."""

    @property
    def warehouse(self) -> str:
        return f"s3://{self.name}/warehouse"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    endpoint = start_moto()
    yield endpoint
    stop_moto(endpoint)


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A new bucket, with the AWS variables that reach it set in this process."""
    env = aws_env(s3_endpoint.url)
    name = make_bucket(s3_endpoint)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return S3Bucket(name, env)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[LogManager]:
    """A LogManager on the test's data directory ``tmp_path/data``."""
    manager = LogManager(tmp_path / "data")
    yield manager
    manager.close()
