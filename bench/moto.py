"""An S3 endpoint on loopback for benchmarks and tests: ``moto_server`` (``moto[server]``)
in a subprocess, speaking the real S3 HTTP protocol.

Always a subprocess: moto's in-process ``ThreadedMotoServer`` deadlocks with delta-rs,
which waits on its own HTTP calls while holding the GIL (docs/architecture.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import NamedTuple

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
ACCESS_KEY = "lakelog-test-key"
SECRET_KEY = "lakelog-test-secret"


class S3Endpoint(NamedTuple):
    url: str
    proc: subprocess.Popen[bytes]


def start_moto(extra_env: dict[str, str] | None = None, timeout_s: float = 60) -> S3Endpoint:
    """``moto_server`` on a free loopback port, once it answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
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
    """The AWS variables that reach the endpoint at ``url``."""
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true"}


def make_bucket(endpoint: S3Endpoint, prefix: str = "lake") -> str:
    """A new bucket on ``endpoint``; returns its name."""
    import boto3  # type: ignore[import-untyped]

    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint.url, aws_access_key_id=ACCESS_KEY,
                 aws_secret_access_key=SECRET_KEY, region_name="us-east-1"
                 ).create_bucket(Bucket=name)
    return name
