"""What the driver asks the brokers before a read of a cluster broker's data directory
plans: each partition's leader with the leader's log start, high watermark and hot bytes
(``leader_bounds``: the data directory's broker answers them), and an offset by time from
a partition's leader (``leader_offset_for_timestamp``). The tasks' fetch is
``log_tables.spark.tails``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import NamedTuple
from urllib.parse import quote, urlsplit

import httpx

from log_tables.cold.topic_reader import PartitionBounds
from log_tables.errors import BrokerNotAvailableError, LakelogError
from log_tables.spark.tails import (
    CLUSTER,
    LOCAL_ONLY,
    RETRY_S,
    RetriableStatus,
    TailSource,
    checked_get,
    first_answer,
    message_of,
)

log = logging.getLogger(__name__)


class LeaderBound(NamedTuple):
    """A partition as its leader answered the data directory's broker."""

    leader: int
    """The leader's broker id; -1: offline (nothing to fetch)."""
    leader_url: str | None
    log_start_offset: int
    high_watermark: int
    size_bytes: int
    """Bytes of the leader's hot log."""


def leader_bounds(source: TailSource, topics: Iterable[str]
                  ) -> dict[str, dict[int, LeaderBound]] | None:
    """Per topic and partition, its leader and the leader's log start, high watermark and
    hot bytes; None (with a warning) when the data directory's broker does not answer.

    The broker must be of the data directory's cluster (``/healthz``, asked without the
    key, names it), else the read is local, with a warning: another cluster's broker (or
    a server on its own) may have the address since.

    A topic whose partitions it does not answer (401/403: a ``LAKELOG_API_KEY`` that may
    not describe it, which outranks the broker's key) is left out, with a warning: its
    leaders are unknown, and it is read from what this data directory holds."""
    try:
        client = source.client()
    except LakelogError as exc:  # a CA bundle that is not one
        log.warning("%s: %s", exc.message, LOCAL_ONLY)
        return None
    deadline = time.monotonic() + RETRY_S / 6
    with client as http:
        while True:
            try:
                other = _other_cluster(http, source)
                if other is not None:
                    log.warning("%s: %s", other, LOCAL_ONLY)
                    return None
                urls = _broker_urls(http, source.url)
                found: dict[str, dict[int, LeaderBound]] = {}
                for topic in topics:
                    try:
                        found[topic] = _partitions(http, source.url, topic, urls)
                    except LakelogError as exc:
                        log.warning("%s: %s, for topic %s", exc.message, LOCAL_ONLY, topic)
                return found
            except LakelogError as exc:  # the brokers' list refused: a key it does not know
                log.warning("%s: %s", exc.message, LOCAL_ONLY)
                return None
            except (httpx.TransportError, RetriableStatus) as exc:
                if time.monotonic() < deadline and isinstance(exc, RetriableStatus):
                    time.sleep(0.2)
                    continue
                log.warning("the broker of this data directory (%s) did not answer (%s): %s",
                            source.url, exc, LOCAL_ONLY)
                return None


def merged(bounds: PartitionBounds, leader: LeaderBound | None) -> PartitionBounds:
    """A partition's bounds as this data directory holds them, with its leader's where
    they are further: its high watermark, and its log start (retention there moves it)."""
    if leader is None or leader.leader < 0:
        return bounds
    end = max(bounds.high_watermark, leader.high_watermark)
    start = min(max(bounds.log_start_offset, leader.log_start_offset), end)
    return bounds._replace(log_start_offset=start, high_watermark=end)


def _other_cluster(http: httpx.Client, source: TailSource) -> str | None:
    """Why the broker at ``source.url`` is not of the data directory's cluster (its
    ``/healthz``, asked without the key, names another cluster or none); None when it is."""
    if source.cluster_id is None:
        return None
    r = http.get(f"{source.url}/healthz", auth=None)  # the key goes to this cluster alone
    try:
        found = r.json().get("cluster_id")
    except (ValueError, AttributeError):
        found = None
    if found == source.cluster_id:
        return None
    return (f"{source.url} answers for {f'cluster {found}' if found else 'no cluster'} "
            f"(/healthz: {r.status_code}), not for this data directory's cluster "
            f"{source.cluster_id} (cluster.json): another server now has its address?")


def _broker_urls(http: httpx.Client, url: str) -> dict[int, str]:
    r = checked_get(http, f"{url}{CLUSTER}/brokers")
    if r.status_code != 200:
        raise LakelogError(f"{url}: listing the brokers answered {r.status_code} "
                           f"({message_of(r)})")
    scheme = urlsplit(url).scheme
    return {int(b["broker_id"]): f"{scheme}://{b['host']}:{b['port']}" for b in r.json()["data"]}


def _partitions(http: httpx.Client, url: str, topic: str, urls: dict[int, str]
                ) -> dict[int, LeaderBound]:
    r = checked_get(http, f"{url}{CLUSTER}/topics/{quote(topic, safe='')}/partitions")
    if r.status_code == 404:  # deleted meanwhile: the local registry's view stands
        return {}
    if r.status_code != 200:
        raise LakelogError(f"{url}: the partitions of {topic} answered {r.status_code} "
                           f"({message_of(r)})")
    return {int(b["partition_id"]): LeaderBound(
        int(b["leader_id"]), urls.get(int(b["leader_id"])), int(b["log_start_offset"]),
        int(b["high_watermark"]), int(b["size_bytes"])) for b in r.json()["data"]}


def leader_offset_for_timestamp(source: TailSource, leader: LeaderBound, topic: str,
                                partition: int, timestamp_ms: int, retry_s: float = RETRY_S
                                ) -> int | None:
    """Kafka's ListOffsets by time, as the partition's leader answers it (None: no record
    that late). A leader that does not answer (or answers a retriable status): the data
    directory's broker, which forwards; both asked again for ``retry_s``, then
    BrokerNotAvailableError, as a task's fetch."""
    urls = list(dict.fromkeys(u for u in (leader.leader_url, source.url) if u))
    path = f"{CLUSTER}/topics/{quote(topic, safe='')}/partitions/{partition}/offsets"
    deadline = time.monotonic() + retry_s
    with source.client() as http:
        while isinstance(answer := first_answer(
                http, urls, path, params={"spec": "timestamp", "timestamp": timestamp_ms}), str):
            if time.monotonic() > deadline:
                raise BrokerNotAvailableError(
                    f"{topic}-{partition}: the offset for timestamp {timestamp_ms} could not "
                    f"be asked of its leader within {retry_s:g}s ({answer}); try again")
            time.sleep(0.1)
    r = answer[1]
    if r.status_code != 200:
        raise LakelogError(f"{topic}-{partition}: the offset for a timestamp answered "
                           f"{r.status_code} ({message_of(r)})")
    found = r.json().get("offset")
    return None if found is None else int(found)
