"""Helpers of the client and CLI tests."""

from __future__ import annotations

import httpx

from tests.ingest_api.helpers import fetch_all
from tests.server import ServerProcess


def make_topic(server: ServerProcess, name: str, partitions: int = 1, **configs: str) -> None:
    """Create a topic; ``configs`` by their Kafka names, e.g. ``**{"max.message.bytes": "4096"}``."""
    with server.client() as c:
        r = c.post("/topics", json={"topic_name": name, "partitions_count": partitions,
                                    "configs": [{"name": k, "value": v}
                                                for k, v in configs.items()]})
        assert r.status_code == 201, r.text


def values(server: ServerProcess, topic: str, partition: int) -> list[str | None]:
    """Every value of a partition, in offset order (STRING format)."""
    with httpx.Client(base_url=server.url + "/v3/clusters/lakelog", timeout=30) as c:
        return [r["value"]["data"] if r["value"] else None
                for r in fetch_all(c, topic, partition, fmt="STRING")]
