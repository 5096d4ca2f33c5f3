"""A broker's registration racing the end of its earlier session's ephemeral node.

The race (the node is there at ``create``, gone at ``get``: ZooKeeper ended the killed
process's session between the two calls) cannot be aimed at for real, so a stand-in
client answers in that order; the broker's own code runs unchanged. CI once met it for
real (test_controller_steps: a broker restarted right after its SIGKILL)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

from cluster.broker import ClusterBroker


class RacingClient:
    """``create`` finds the earlier node; it is gone by ``get``; ``create`` then works."""

    client_id = (7, b"")

    def __init__(self) -> None:
        self.calls: list[str] = []

    def create(self, path: str, value: bytes, ephemeral: bool) -> None:
        self.calls.append("create")
        if self.calls.count("create") == 1:
            raise NodeExistsError()

    def get(self, path: str) -> Any:
        self.calls.append("get")
        raise NoNodeError()


def test_registration_retries_when_the_earlier_node_goes_between_create_and_get(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = RacingClient()
    broker = SimpleNamespace(client=client, broker_id=1, info=SimpleNamespace(),
                             session=SimpleNamespace(session_timeout_s=1.0))
    monkeypatch.setattr("cluster.broker.encode", lambda info: b"{}")
    ClusterBroker._register(broker, 5.0)  # type: ignore[arg-type]
    assert client.calls == ["create", "get", "create"]
