from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from log_tables.hot.log_manager import LogManager
from tests.server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server for the API tests (each test makes its own topics)."""
    proc = ServerProcess(tmp_path_factory.mktemp("api") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def make_topic(client: httpx.Client) -> Callable[..., str]:
    """Create a topic with a fresh name; returns the name."""

    def factory(partitions: int = 1, **configs: str) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        body = {"topic_name": name, "partitions_count": partitions,
                "configs": [{"name": k.replace("_", "."), "value": v} for k, v in configs.items()]}
        r = client.post("/topics", json=body)
        assert r.status_code == 201, r.text
        return name

    return factory


@pytest.fixture
def spawn_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Servers of one test (crash tests, special settings); killed at the end."""
    started: list[ServerProcess] = []

    def factory(data_dir: Path | None = None, **env: str) -> ServerProcess:
        proc = ServerProcess(data_dir or tmp_path / "data",
                             {f"LAKELOG_{k.upper()}": v for k, v in env.items()})
        started.append(proc)
        return proc.start()

    yield factory
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    """Real logs for a transaction coordinator as an object: topic ``t`` of two
    partitions."""
    m = LogManager(tmp_path / "data")
    m.create_topic("t", 2)
    yield m
    m.close()
