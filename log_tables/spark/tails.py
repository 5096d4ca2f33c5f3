"""The hot tails a cluster broker's data directory lacks, read from the partitions' leaders.

In a cluster, a broker's data directory holds the hot logs of the partitions it has a
replica of, each readable up to the high watermark that replica published (a leader's
own; a follower's, the one it learnt from its last fetch), and the shared warehouse holds
every partition below its tiered offset. The rest (the tail of a partition with no
replica here, and what a follower has not yet learnt is committed) is on the partitions'
leaders. Readers of the data directory (``read_topic``, the SQL views, the ``lakelog``
source) get it from there, through the brokers' own Arrow fetch:

- the driver asks the data directory's broker (its URL is in ``cluster.json``) once per
  topic for its partitions (``GET .../topics/{t}/partitions``: that broker gathers each
  partition's leader and high watermark from the leaders), and once for the brokers'
  addresses (``log_tables.spark.leaders``); each partition is read up to the larger of
  its local end and its leader's high watermark;
- a task reads what the data directory holds (its replica up to the high watermark it
  published, then the Delta tier), and fetches the rest from the leader (``GET
  .../records``, ``Accept: application/vnd.apache.arrow.stream``, paging by
  ``Lakelog-Next-Offset``), keeping the offsets below the planned end. A leader that does
  not answer: the data directory's broker, which forwards to whoever leads now.

Credentials: ``LAKELOG_API_KEY`` when set, else the broker's own key
(``security/broker.key``): a session attached to a data directory reads as the broker
beside it does (it reads that broker's files already); none with authentication off.
The key travels to the tasks inside the reader, never in options, plans or logs. When the
broker does not answer the driver (stopped, say), a read holds what the data directory
holds, as before, and says so in a warning.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pyarrow as pa

from log_tables.cold.topic_reader import (
    SPARK_SCHEMA,
    hot_end_offset,
    read_range,
    read_tiered,
)
from log_tables.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    LakelogError,
    OffsetOutOfRangeError,
)
from log_tables.hot.isolation import READ_COMMITTED, Isolation
from log_tables.layout import Layout
from log_tables.leadership import CLUSTER_FILE, read_broker_address

log = logging.getLogger(__name__)

CLUSTER = "/v3/clusters/lakelog"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
NEXT_OFFSET = "Lakelog-Next-Offset"
BROKER_KEY = Path("security") / "broker.key"
"""A broker's own key in its data directory (``ingest_api.broker.security``'s ``broker.key``)."""
MAX_RECORDS = 10_000
"""Records asked per fetch (a broker's ``max_fetch_records`` by default)."""
MAX_BYTES = 8 * 1024 * 1024
FETCH_WAIT_MS = 500
"""A fetch at a leader's end waits this long for its high watermark to pass it (a new
leader's starts where it was as a follower, and rises as its followers fetch)."""
RETRY_S = 30.0
"""How long a read keeps asking while leaders move or do not answer before it fails."""
TIMEOUT_S = 10.0
MAX_CA_BYTES = 1024 * 1024
"""A CA bundle larger than this is refused (it travels to every task)."""
LOCAL_ONLY = "reading only the partitions' tails held here and the Delta tier"
RETRIABLE_STATUSES = (421, 429, 502, 503, 504)


@dataclass(frozen=True)
class TailSource:
    """Where the data directory's broker answers, and how readers authenticate to the
    brokers (picklable: Spark ships it to the tasks inside the reader)."""

    url: str
    ca_pem: str | None = field(default=None, repr=False)
    """The brokers' CA bundle itself (PEM), read where the read is planned: a task on
    another machine needs no file at the path ``cluster.json`` names; None: the system's
    CAs."""
    api_key: str | None = field(default=None, repr=False)
    """``<key id>:<secret>``; None: send none."""
    cluster_id: str | None = None
    """The cluster the broker at ``url`` must belong to (``cluster.json``'s); None: not
    checked."""

    def client(self, timeout_s: float = TIMEOUT_S) -> httpx.Client:
        """A client for the brokers; a LakelogError when the CA bundle is not one."""
        key_id, sep, secret = (self.api_key or "").partition(":")
        # A context is made here, in the task: it does not pickle (and httpx deprecates paths).
        try:
            verify: ssl.SSLContext | bool = True if self.ca_pem is None else \
                ssl.create_default_context(cadata=self.ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise LakelogError(f"the CA bundle for {self.url} holds no usable certificate "
                               f"({exc})") from exc
        return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), verify=verify,
                            auth=httpx.BasicAuth(key_id, secret) if sep else None)


def tail_source(layout: Layout) -> TailSource | None:
    """How to reach the brokers from ``layout``'s data directory; None when it is not a
    cluster broker's (or its broker wrote no address yet), or (with a warning) when the
    CA bundle it names cannot be read here."""
    address = read_broker_address(Path(layout.data_dir))
    if address is None:
        return None
    ca_pem = None
    if address.tls_ca is not None:
        try:
            with open(address.tls_ca, "rb") as f:
                data = f.read(MAX_CA_BYTES + 1)
            if len(data) > MAX_CA_BYTES or not data.strip():
                raise ValueError(f"empty, or over {MAX_CA_BYTES} bytes")
            ca_pem = data.decode("ascii")
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            log.warning("the brokers' CA bundle %s (named in %s) cannot be read here (%s): "
                        "%s", address.tls_ca, CLUSTER_FILE, exc, LOCAL_ONLY)
            return None
    key = os.environ.get("LAKELOG_API_KEY") or None
    if key is None:
        try:
            key = (Path(layout.data_dir) / BROKER_KEY).read_text().strip() or None
        except OSError:
            key = None  # authentication off, or a file this user may not read
    return TailSource(address.url, ca_pem, key, address.cluster_id)


class RetriableStatus(Exception):
    """A status worth asking again (or another broker) for; caught wherever it is raised."""


def checked_get(http: httpx.Client, url: str, **kwargs: object) -> httpx.Response:
    """``GET url``: a LakelogError on 401/403, RetriableStatus on a retriable status."""
    r = http.get(url, **kwargs)  # type: ignore[arg-type]
    if r.status_code in (401, 403):
        raise LakelogError(
            f"{url} answered {r.status_code} ({message_of(r)}): reading the tails of partitions "
            f"led by other brokers needs a key that may read them; lakelog uses "
            f"LAKELOG_API_KEY, else the broker's own key in the data directory's {BROKER_KEY}")
    if r.status_code in RETRIABLE_STATUSES:
        raise RetriableStatus(f"{r.status_code} {message_of(r)}")
    return r


def first_answer(http: httpx.Client, urls: list[str], path: str, **kwargs: object
                 ) -> tuple[str, httpx.Response] | str:
    """(url, answer) of the first of ``urls`` to answer ``GET path`` with neither a
    connection failure nor a retriable status; else why none did."""
    why = "no broker to ask"
    for url in urls:
        try:
            return url, checked_get(http, url + path, **kwargs)
        except (httpx.TransportError, RetriableStatus) as exc:
            why = f"{url}: {exc or type(exc).__name__}"
    return why


def message_of(r: httpx.Response) -> str:
    """The ``message`` of an error body, else the start of its text."""
    try:
        return str(r.json().get("message", r.text[:200]))
    except ValueError:
        return r.text[:200]


def read_tail(layout: Layout, source: TailSource, leader_url: str | None, topic: str,
              partition: int, start: int, end: int, tiered: int = 0, *,
              fail_on_data_loss: bool = True,
              isolation: Isolation = READ_COMMITTED) -> Iterator[pa.RecordBatch]:
    """Records ``start .. end-1``: the local replica's up to the high watermark it
    published, the Delta tier's below ``tiered`` (an offset the planner saw tiered), the
    rest from the leader."""
    position = start
    held = min(end, hot_end_offset(layout, topic, partition, isolation, start))
    if position < held:
        yield from read_range(layout, topic, partition, position, held,
                              fail_on_data_loss=fail_on_data_loss, isolation=isolation)
        position = held
    if position < min(end, tiered):
        position = yield from read_tiered(layout, topic, partition, position, min(end, tiered))
    if position < end:
        yield from fetch_range(source, leader_url, topic, partition, position, end,
                               fail_on_data_loss=fail_on_data_loss, isolation=isolation)


def fetch_range(source: TailSource, leader_url: str | None, topic: str, partition: int,
                start: int, end: int, *, fail_on_data_loss: bool = True,
                isolation: Isolation = READ_COMMITTED) -> Iterator[pa.RecordBatch]:
    """Records ``start .. end-1`` fetched from the leader (else through the data
    directory's broker), in SPARK_SCHEMA; ``end`` must be at most a high watermark the
    leader answered."""
    urls = list(dict.fromkeys(u for u in (leader_url, source.url) if u))
    path = f"{CLUSTER}/topics/{quote(topic, safe='')}/partitions/{partition}/records"
    position = start
    deadline: float | None = None
    with source.client(TIMEOUT_S + FETCH_WAIT_MS / 1000) as http:
        while position < end:
            got: tuple[list[pa.RecordBatch], int] | int | None = None
            answer = first_answer(http, urls, path, headers={"Accept": ARROW_STREAM}, params={
                "offset": position, "max_records": min(MAX_RECORDS, end - position),
                "max_bytes": MAX_BYTES, "timeout_ms": FETCH_WAIT_MS,
                "isolation_level": isolation.value})
            why = answer if isinstance(answer, str) else ""
            if not isinstance(answer, str):
                got = _answer(answer[1], answer[0], topic, partition, position,
                              fail_on_data_loss)
            if isinstance(got, int):  # a damaged batch skipped
                position, deadline = got, None
                continue
            if got is not None:
                rows, next_offset = got
                yield from below(rows, end)
                if next_offset > position:
                    position, deadline = next_offset, None
                    continue
                why = f"nothing at offset {position} yet"  # the leader's high watermark is behind
            deadline = deadline or time.monotonic() + RETRY_S
            if time.monotonic() > deadline:
                raise BrokerNotAvailableError(
                    f"{topic}-{partition}: offsets {position}..{end - 1} could not be fetched "
                    f"from its leader within {RETRY_S:g}s ({why}); try again")
            time.sleep(0.1)


def _answer(r: httpx.Response, url: str, topic: str, partition: int, position: int,
            fail: bool) -> tuple[list[pa.RecordBatch], int] | int:
    """A fetch's rows and next offset; or, for a damaged batch skipped, the offset after it."""
    if r.status_code == 200:
        return list(pa.ipc.open_stream(r.content)), int(r.headers[NEXT_OFFSET])
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    where = f"{topic}-{partition}"
    if r.status_code == 416:
        raise OffsetOutOfRangeError(where, position, int(body.get("log_start_offset", -1)),
                                    int(body.get("high_watermark", -1)))
    if r.status_code == 410 and "next_offset" in body:
        exc = CorruptRecordError(f"{url}: {body.get('file')}", int(body.get("file_position", 0)),
                                 str(body.get("message")), first_offset=int(body["first_offset"]),
                                 next_offset=int(body["next_offset"]), topic=topic,
                                 partition=partition)
        if fail:
            raise exc
        log.warning("%s (failOnDataLoss is false: skipped)", exc.message)
        return int(body["next_offset"])
    raise LakelogError(f"{where}: {url} answered {r.status_code} ({message_of(r)})")


def below(rows: list[pa.RecordBatch], end: int) -> Iterator[pa.RecordBatch]:
    """The rows with offsets below ``end``, in SPARK_SCHEMA exactly (as Spark wants)."""
    for rb in rows:
        if not rb.num_rows:
            continue
        offsets = rb.column(4).to_numpy()
        keep = int(np.searchsorted(offsets, end))
        if keep:
            part = rb.slice(0, keep)
            yield pa.RecordBatch.from_arrays(part.columns, schema=SPARK_SCHEMA)
        if keep < rb.num_rows:
            return
