"""An S3 endpoint on loopback: ``moto_server`` in a subprocess (moto's in-process
ThreadedMotoServer deadlocks with delta-rs, which waits on its own HTTP calls holding
the GIL: /work/spikes/issue22), and a bucket per test with the AWS variables set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
ACCESS_KEY = "lakelog-test-key"
SECRET_KEY = "lakelog-test-secret"


class S3Endpoint(NamedTuple):
    url: str
    proc: subprocess.Popen[bytes]


class S3Bucket(NamedTuple):
    name: str
    env: dict[str, str]
    """The AWS variables that reach it (also set in this process for the test)."""

    @property
    def warehouse(self) -> str:
        return f"s3://{self.name}/warehouse"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(extra_env: dict[str, str] | None = None, timeout_s: float = 60) -> S3Endpoint:
    """``moto_server`` on a free loopback port, once it answers."""
    port = _free_port()
    proc = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(extra_env or {})}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
            return S3Endpoint(url, proc)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start on {url}") from None
            time.sleep(0.1)


def stop_moto(endpoint: S3Endpoint) -> None:
    endpoint.proc.terminate()
    try:
        endpoint.proc.wait(10)
    except subprocess.TimeoutExpired:
        endpoint.proc.kill()
        endpoint.proc.wait(10)


def aws_env(url: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    endpoint = start_moto()
    yield endpoint
    stop_moto(endpoint)


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A new bucket, with the AWS variables that reach it set in this process."""
    import boto3  # type: ignore[import-untyped]

    env = aws_env(s3_endpoint.url)
    name = f"lake-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint.url, aws_access_key_id=ACCESS_KEY,
                 aws_secret_access_key=SECRET_KEY, region_name="us-east-1"
                 ).create_bucket(Bucket=name)
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return S3Bucket(name, env)
