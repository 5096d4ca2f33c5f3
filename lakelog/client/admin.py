"""The admin client (Kafka's ``Admin``): topics, consumer groups, ACLs, API keys, deleted
records and segment rolls; what ``lakelog topics|groups|acls|keys`` and ``delete-records``
call.

    from lakelog.client import AdminClient

    with AdminClient("http://127.0.0.1:8080") as admin:
        admin.create_topic("orders", partitions=3, configs={"retention.ms": "3600000"})
        print(admin.list_topics())

Each call is retried as ``retry.py`` says while the server cannot be reached, within
``default_api_timeout_ms``: a GET after any failure, the others only when they surely never
arrived. One attempt may take ``request_timeout_ms`` (a slow answer is not an unreachable
server). An error answer raises ``LakelogClientError`` (``LakelogTimeoutError`` once the
deadline passed); answers are the server's JSON bodies.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from lakelog.client.bootstrap import bootstrap_urls, describe_servers
from lakelog.client.errors import error_from
from lakelog.client.http import api_client
from lakelog.client.retry import Attempts, RetryPolicy, call

Json = dict[str, Any]
K = TypeVar("K")
V = TypeVar("V")
Pairs = Mapping[K, V] | Iterable[tuple[K, V]]
"""A mapping, or (key, value) pairs in the order given (as the CLI's repeated options)."""


def _pairs(pairs: Pairs[K, V] | None) -> Iterable[tuple[K, V]]:
    return pairs.items() if isinstance(pairs, Mapping) else pairs or ()


class AdminClient:
    """Admin calls to one server. ``deadline_setting`` names the deadline in a
    ``LakelogTimeoutError``'s message (the CLI names its ``--retry-timeout-ms``)."""

    def __init__(self, url: str | Sequence[str], *, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True,
                 request_timeout_ms: float = 60_000, default_api_timeout_ms: float = 60_000,
                 retry_backoff_ms: float = 100, retry_backoff_max_ms: float = 1000,
                 deadline_setting: str | None = None) -> None:
        if default_api_timeout_ms < 0:
            raise ValueError("default_api_timeout_ms must be 0 or more")
        self.bootstrap_servers = bootstrap_urls(url)
        """The brokers given (``url``: one, a list, or a string of them with commas)."""
        self.url = self.bootstrap_servers[0]
        self._where = describe_servers(self.bootstrap_servers)
        self.policy = RetryPolicy(retry_backoff_ms=retry_backoff_ms,
                                  retry_backoff_max_ms=retry_backoff_max_ms,
                                  request_timeout_ms=request_timeout_ms)
        self.default_api_timeout_ms = default_api_timeout_ms
        self.deadline_setting = (deadline_setting or
                                 f"default_api_timeout_ms={default_api_timeout_ms:g}")
        self._http = api_client(self.bootstrap_servers, "", api_key, verify,
                                request_timeout_ms / 1000)

    def request(self, method: str, path: str, body: object | None = None,
                ok: Iterable[int] = (200,)) -> Any:
        """One call below the cluster's path (``/topics``, ...): the answer's JSON (None
        when it has no body) if its status is in ``ok``, else its ``LakelogClientError``."""
        attempts = Attempts(self.policy, time.monotonic() + self.default_api_timeout_ms / 1000,
                            f"{method} {path}", self._where, self.deadline_setting)
        # "" is the cluster itself: its URL has no trailing slash (httpx's base URL has one).
        target = path or str(self._http.base_url).rstrip("/")
        r = call(lambda _: self._http.request(method, target, json=body), attempts,
                 idempotent=method == "GET")
        if r.status_code not in tuple(ok):
            raise error_from(r)
        return r.json() if r.content else None

    # -- topics ------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, configs: Pairs[str, str] | None = None,
                     replication_factor: int | None = None) -> Json:
        """Create a topic; ``replication_factor``: copies of each partition, at most the
        live brokers (None: the server's ``default_replication_factor``)."""
        body: Json = {"topic_name": name, "partitions_count": partitions,
                      "configs": [{"name": k, "value": v} for k, v in _pairs(configs)]}
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        return dict(self.request("POST", "/topics", body, ok=(201,)))

    def describe_cluster(self) -> Json:
        """The cluster: its id and a link to its controller broker."""
        return dict(self.request("GET", ""))

    def list_brokers(self) -> list[Json]:
        """The live brokers (id, host, port, rack)."""
        return list(self.request("GET", "/brokers")["data"])

    def list_topics(self) -> list[Json]:
        return list(self.request("GET", "/topics")["data"])

    def describe_topic(self, name: str) -> Json:
        return dict(self.request("GET", f"/topics/{name}"))

    def list_partitions(self, topic: str) -> list[Json]:
        """Each partition's log start offset, high watermark and size."""
        return list(self.request("GET", f"/topics/{topic}/partitions")["data"])

    def describe_configs(self, topic: str) -> list[Json]:
        """Every config of the topic, with ``is_default``."""
        return list(self.request("GET", f"/topics/{topic}/configs")["data"])

    def create_partitions(self, topic: str, count: int) -> Json:
        """Raise the partition count to ``count`` (never lower)."""
        return dict(self.request("PATCH", f"/topics/{topic}", {"partitions_count": count}))

    def alter_configs(self, topic: str, set_configs: Pairs[str, str] | None = None,
                      delete_configs: Iterable[str] = ()) -> None:
        """Set configs and reset others to their defaults, in one call."""
        changes = [{"name": k, "value": v, "operation": "SET"} for k, v in _pairs(set_configs)]
        changes += [{"name": n, "operation": "DELETE"} for n in delete_configs]
        self.request("POST", f"/topics/{topic}/configs:alter", {"data": changes}, ok=(204,))

    def delete_topic(self, name: str) -> None:
        self.request("DELETE", f"/topics/{name}", ok=(204,))

    def list_offsets(self, topic: str, partition: int, spec: str) -> int:
        """The partition's offset for ``earliest``, ``latest`` or a timestamp spec."""
        return int(self.request(
            "GET", f"/topics/{topic}/partitions/{partition}/offsets?spec={spec}")["offset"])

    def delete_records(self, topic: str, before: Pairs[int, int]) -> list[Json]:
        """Kafka's DeleteRecords: each partition's log start moves to its offset (-1: the
        end); the answer has each ``low_watermark``."""
        return list(self.request("POST", f"/topics/{topic}/records:delete", {
            "partitions": [{"partition_id": p, "offset": o} for p, o in _pairs(before)]}
        )["partitions"])

    def roll_segments(self, topic: str) -> list[Json]:
        """Seal every partition's active segment; the answer has each ``end_offset``."""
        return list(self.request("POST", f"/topics/{topic}/segments:roll")["partitions"])

    # -- consumer groups ---------------------------------------------------------------------

    def list_groups(self) -> list[Json]:
        return list(self.request("GET", "/consumer-groups")["data"])

    def describe_group(self, group: str) -> Json:
        """State, members and every partition's committed offset, log end offset and lag."""
        return dict(self.request("GET", f"/consumer-groups/{group}"))

    def list_group_offsets(self, group: str) -> list[Json]:
        return list(self.request("GET", f"/consumer-groups/{group}/offsets")["offsets"])

    def alter_group_offsets(self, group: str, offsets: list[Json]) -> None:
        """Commit ``{"topic_name", "partition_id", "offset"}`` entries for a group."""
        self.request("POST", f"/consumer-groups/{group}/offsets", {"offsets": offsets})

    def reset_group_offsets(self, group: str, spec: Json) -> Json:
        """``offsets:reset`` with ``spec`` (``to``, ``dry_run``, ...): the new offsets."""
        return dict(self.request("POST", f"/consumer-groups/{group}/offsets:reset", spec))

    def delete_group(self, group: str) -> None:
        self.request("DELETE", f"/consumer-groups/{group}", ok=(204,))

    # -- security ----------------------------------------------------------------------------

    def create_acl(self, acl: Json) -> Json:
        return dict(self.request("POST", "/acls", acl, ok=(200, 201)))

    def delete_acl(self, acl: Json) -> None:
        self.request("POST", "/acls:delete", acl, ok=(204,))

    def list_acls(self, principal: str | None = None) -> list[Json]:
        query = f"?principal={principal}" if principal else ""
        return list(self.request("GET", f"/acls{query}")["data"])

    def create_api_key(self, principal: str) -> Json:
        """A new key: ``key_id`` and ``secret`` (shown only in this answer)."""
        return dict(self.request("POST", "/api-keys", {"principal": principal}, ok=(201,)))

    def list_api_keys(self) -> list[Json]:
        return list(self.request("GET", "/api-keys")["data"])

    def delete_api_key(self, key_id: str) -> None:
        self.request("DELETE", f"/api-keys/{key_id}", ok=(204,))

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
