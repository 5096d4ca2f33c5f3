"""Where each partition's leader is, as a Kafka client's metadata says: the brokers
(``GET /brokers``) and each partition's leader (``GET /topics/{t}/partitions``), asked of
any live broker the client was given or has learnt (any broker answers; the brokers
named join the client's list, ``bootstrap.FailoverTransport.learn``) and kept until a
request says a leader moved (``not_leader_or_follower``) or a broker did not answer.

The cluster of one names itself as the leader of everything, so the client talks to the
URL it was given, as before.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import httpx

from lakelog.client.http import transport_of

REFRESH_AFTER_S = 60.0  # metadata.max.age.ms: look again now and then even without errors


class Leaders:
    def __init__(self, bootstrap: str, http: httpx.Client) -> None:
        self.bootstrap = bootstrap.rstrip("/")
        self._scheme = urlsplit(self.bootstrap).scheme or "http"
        self._http = http
        self._lock = threading.Lock()
        self._brokers: dict[int, str] = {}
        self._leaders: dict[str, tuple[float, list[int]]] = {}

    def url(self, topic: str, partition: int) -> str:
        """The leader's URL (the bootstrap URL when the leader is unknown or none)."""
        with self._lock:
            known = self._leaders.get(topic)
        if known is None or time.monotonic() - known[0] > REFRESH_AFTER_S:
            known = self._load(topic)
        leaders = known[1] if known is not None else []
        leader = leaders[partition] if partition < len(leaders) else -1
        return self._brokers.get(leader, self.bootstrap)

    def cached(self, topic: str) -> bool:
        """``url`` of the topic's partitions answers without asking a broker."""
        with self._lock:
            known = self._leaders.get(topic)
        return known is not None and time.monotonic() - known[0] <= REFRESH_AFTER_S

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._leaders.pop(topic, None)

    def _load(self, topic: str) -> tuple[float, list[int]] | None:
        try:
            brokers = self._http.get("/brokers")
            parts = self._http.get(f"/topics/{topic}/partitions")
        except httpx.TransportError:
            return None
        if brokers.status_code != 200 or parts.status_code != 200:
            return None
        found = {int(b["broker_id"]): f"{self._scheme}://{b['host']}:{b['port']}"
                 for b in brokers.json()["data"] if b.get("host") and b.get("port")}
        leaders = [-1] * len(parts.json()["data"])
        for p in parts.json()["data"]:
            leaders[int(p["partition_id"])] = _leader_id(p)
        entry = (time.monotonic(), leaders)
        with self._lock:
            self._brokers.update(found)
            self._leaders[topic] = entry
        if (transport := transport_of(self._http)) is not None:
            transport.learn(found.values())
        return entry


def _leader_id(partition: dict[str, object]) -> int:
    """``leader_id`` (lakelog's), else the id at the end of Confluent's ``leader`` link."""
    leader_id = partition.get("leader_id")
    if isinstance(leader_id, int):
        return leader_id
    leader = partition.get("leader")
    related = leader.get("related", "") if isinstance(leader, dict) else ""
    tail = str(related).rsplit("/", 1)[-1]
    return int(tail) if tail.lstrip("-").isdigit() else -1
