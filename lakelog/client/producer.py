"""The producer: batching, partitioning, idempotence, retries, and recovery from refusals.

Records are queued per partition; a partition's batch is ready when it holds
``batch_size`` bytes or ``batch_records`` records, or its first record has waited
``linger_ms`` (Kafka's meanings). A sender thread puts ready batches of one topic and
leader into a ``records:batch`` request and sends it over its own HTTP/1.1 connections
(one thread and a selector, no thread per request), up to
``max_in_flight_requests_per_connection`` requests per broker at once, but never two
for one partition: Kafka keeps several of a partition's batches in flight because they
go in order on one TCP connection, and its broker refuses a batch whose sequence skips
ahead. Requests over several HTTP connections may reach the server in any order, and
the server refuses a skip just as Kafka's broker does (its dedup window of 5 runs is
for retries, not reordering), so a partition's next batch waits for its previous
answer. The ready partitions are spread over the requests a broker has room for.
Keyed records are partitioned client-side with Kafka's murmur2 (the server's and Kafka's
Java client's partition).

``send`` does little on the caller's thread (Kafka's split): it appends the record to
the accumulator's incoming queue without a lock and answers with a light Future
(``futures.FutureRecordMetadata``); what came in is moved to the partitions' queues in
bulk, murmur2 over numpy for all the keys at once (``accumulator.py``), and the ready
batches are taken into requests (``sender.py``, ``flights.py``), by the sender thread or,
every ``DRAIN_AT`` records, by ``send`` itself taking a turn of the sender's loop; a
request is encoded in one call (``batches.encode_body``), and its answer completes its
records together, under one lock per producer (``futures.Deliveries``).
``send_many`` counts the answers of many records in a ``Tally`` (no Future each:
``lakelog produce``).

Idempotence (the default): every record carries the producer id, epoch and a sequence
number, consecutive per partition, so a request sent again after a broken connection
is answered with the original offsets, never appended twice. What happens after a
failure, as Kafka's producer (its TransactionManager) does it:

1. A request that gets no answer, or a "try again" answer, is sent again unchanged
   (same sequences) within ``retries``, ``retry_backoff_ms`` and ``delivery_timeout_ms``.
2. A record the server refuses for its own sake (too large, invalid) is not appended
   and uses no sequence there, so the records after it in its partition are refused as
   ``out_of_order_sequence`` (the gap). The refused record's future fails with its
   error; the partition's next sequence goes back to the first failed record's, and the
   records refused only because of the gap are queued again at the front of their
   partition (new sequences), so later records go on and nothing is duplicated.
3. A request refused whole (e.g. 404 for a topic that does not exist) appended
   nothing: its records fail and the sequences go back to where the request started.
4. When the outcome is unknown (the deadline passed after a broken connection) or the
   sequences disagree with the server's (an ``out_of_order_sequence`` no refusal
   explains, ``unknown_producer_id``), the producer takes a new epoch and starts every
   partition at sequence 0 again (Kafka's epoch bump): a record whose outcome is
   unknown fails, the others are sent again under the new epoch.

How records go on the wire, and what an answer does to each (2 and 4), is in
``batches.py``; the requests, their retries and 1-4 in ``sender.py``.
"""


from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from time import monotonic
from types import TracebackType
from typing import Any, Literal

from lakelog.client.accumulator import DRAIN_AT, RecordAccumulator
from lakelog.client.batches import MAX_BATCH_ENTRIES, to_entry
from lakelog.client.bootstrap import bootstrap_urls, describe_servers
from lakelog.client.errors import raise_for
from lakelog.client.futures import Deliveries, FutureRecordMetadata, Tally, in_callback
from lakelog.client.http import api_client, authorization, default_api_key, tls_verify
from lakelog.client.leaders import Leaders
from lakelog.client.retry import (
    MAX_RETRIES,
    Attempts,
    RetryPolicy,
    call,
    resolve_request_timeout_ms,
)
from lakelog.client.sender import MAX_IN_FLIGHT, Sender
from lakelog.client.structs import TopicPartition
from lakelog.client.transactions import IN_TRANSACTION, GroupMetadata, TransactionManager

log = logging.getLogger(__name__)


class Producer:
    """Batching, idempotent producer; ``send`` returns a Future of ``RecordMetadata``
    (a ``FutureRecordMetadata``: not a ``concurrent.futures.Future``, see its doc).

    Kafka's settings, in milliseconds: ``linger_ms`` (how long a partition's first record
    waits for more), ``batch_size`` (bytes of one partition's batch; ``batch_bytes`` is its
    older spelling; ``batch_records`` bounds the records too),
    ``max_in_flight_requests_per_connection`` (requests awaiting an answer, per broker),
    ``retries`` (default unbounded: the deadline bounds), ``retry_backoff_ms``,
    ``retry_backoff_max_ms``, ``request_timeout_ms`` (one attempt; ``timeout_s`` is its
    older spelling, in seconds), ``delivery_timeout_ms`` (from ``send`` to the record's
    answer, retries included) and ``max_block_ms`` (how long ``send`` may wait for topic
    metadata or for room in the buffer). ``max_buffered_records`` bounds the records not
    yet in a request (``send`` counts without a lock: threads sending at the same moment
    may pass it by one record each).
    """

    def __init__(self, url: str | Sequence[str], *, acks: Literal["all", "1", "0"] = "all",
                 linger_ms: float = 5.0, batch_records: int = 1000, batch_bytes: int = 1 << 20,
                 batch_size: int | None = None, max_in_flight_requests_per_connection: int = 5,
                 max_buffered_records: int = 100_000, idempotent: bool = True,
                 retries: int = MAX_RETRIES, retry_backoff_ms: float = 100,
                 retry_backoff_max_ms: float = 1000, request_timeout_ms: float | None = None,
                 delivery_timeout_ms: float = 120_000, max_block_ms: float = 60_000,
                 timeout_s: float | None = None, api_key: str | None = None,
                 verify: str | bool | ssl.SSLContext = True,
                 transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000) -> None:
        if not 1 <= batch_records <= MAX_BATCH_ENTRIES:
            raise ValueError(f"batch_records must be within 1..{MAX_BATCH_ENTRIES} "
                             "(the server's batch limit)")
        if delivery_timeout_ms <= 0 or max_block_ms < 0:
            raise ValueError("delivery_timeout_ms must be above 0 and max_block_ms 0 or more")
        if not 1 <= max_in_flight_requests_per_connection <= MAX_IN_FLIGHT:
            raise ValueError("max_in_flight_requests_per_connection must be within "
                             f"1..{MAX_IN_FLIGHT}")
        if batch_size is not None:
            batch_bytes = batch_size
        if batch_bytes < 1:
            raise ValueError("batch_size must be 1 or more")
        if transactional_id is not None and (not idempotent or acks != "all"):
            raise ValueError("a transactional producer is idempotent with acks='all' (Kafka's "
                             "rule): leave idempotent and acks at their defaults")
        self.bootstrap_servers = bootstrap_urls(url)
        """The brokers given (``url``: one, a list, or a string of them with commas)."""
        self.url = self.bootstrap_servers[0]
        where = describe_servers(self.bootstrap_servers)
        self.policy = RetryPolicy(retries, retry_backoff_ms, retry_backoff_max_ms,
                                  resolve_request_timeout_ms(request_timeout_ms, timeout_s, 30_000))
        self._http = api_client(self.bootstrap_servers, "", api_key, verify,
                                self.policy.request_timeout_ms / 1000)
        key = api_key or default_api_key(self.bootstrap_servers)
        self._leaders = Leaders(self.url, self._http)
        self._where = where
        self.acks = acks
        self.linger_s = linger_ms / 1000
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.max_in_flight = max_in_flight_requests_per_connection
        self.max_buffered = max_buffered_records
        self.idempotent = idempotent
        self.retries = retries
        self.delivery_timeout_ms = delivery_timeout_ms
        self.max_block_ms = max_block_ms
        self._partitions: dict[str, int] = {}
        self._deliveries = Deliveries()
        self._accumulator = RecordAccumulator(
            self._partitions, self._deliveries, linger_s=self.linger_s,
            batch_records=batch_records, batch_bytes=batch_bytes,
            max_buffered=max_buffered_records)
        self.transactional_id = transactional_id
        self._txn = None if transactional_id is None else TransactionManager(
            self._http, transactional_id, transaction_timeout_ms, self.policy, where)
        if self._txn is not None:  # any record failing makes its transaction abort
            self._deliveries.on_failure = self._txn.failed
        self._sender = Sender(self._accumulator, self._deliveries, self._leaders, self._http,
                              self.policy, url=where, acks=acks, idempotent=idempotent,
                              delivery_timeout_ms=delivery_timeout_ms,
                              max_in_flight=max_in_flight_requests_per_connection,
                              authorization=authorization(key),
                              verify=tls_verify(verify), txn=self._txn)

    @property
    def requests_sent(self) -> int:
        """``records:batch`` requests sent so far (attempts; retries included)."""
        return self._sender.requests_sent

    def partitions_for(self, topic: str) -> int:
        """The topic's partition count (asked once, retried within ``max_block_ms``)."""
        n = self._partitions.get(topic)
        if n is None:
            attempts = Attempts(self.policy, time.monotonic() + self.max_block_ms / 1000,
                                f"GET /topics/{topic}", self._where,
                                f"max_block_ms={self.max_block_ms:g}")
            r = call(lambda t: self._http.get(f"/topics/{topic}", timeout=t), attempts,
                     idempotent=True)
            raise_for(r)
            n = self._partitions[topic] = int(r.json()["partitions_count"])
        return n

    def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
             partition: int | None = None, headers: Iterable[tuple[str, bytes]] = (),
             timestamp_ms: int | None = None) -> FutureRecordMetadata:
        """Queue one record; waits up to ``max_block_ms`` while ``max_buffered_records``
        are waiting (then ``LakelogTimeoutError``). A key or value that is not bytes, str
        or None fails the record's future with ``TypeError``."""
        if self._txn is not None and self._txn.state != IN_TRANSACTION:
            self._txn.refuse_send()
        if partition is None and topic not in self._partitions:
            self.partitions_for(topic)  # here, so that its max_block_ms is send's
        extra = None
        if headers or timestamp_ms is not None:
            extra = (tuple(headers), timestamp_ms)
            to_entry(0, key, value, *extra)  # raises here what could not be sent
        acc = self._accumulator
        incoming = acc.incoming
        if len(incoming) >= acc.room and (acc.closed or not in_callback()):
            # A callback runs in the turn that frees room: it cannot wait for it (its
            # records go over the bound, one for each record answered).
            acc.wait_for_room(topic, 1, self.max_block_ms, self._where)
        record = FutureRecordMetadata(self._deliveries, topic, monotonic(), key, value,
                                      partition, extra)
        incoming.append(record)
        # Read after the append: see accumulator.py on waking without a race.
        if acc.sleeping or len(incoming) == acc.wake_count or acc.closed:
            self._appended()
        elif len(incoming) % DRAIN_AT == 0:  # sent from here while still in the CPU's caches
            self._sender.assist()
        return record

    def _appended(self) -> None:
        """Wake the sender thread; after ``close``, make sure a record appended while the
        producer closed has its answer."""
        if self._accumulator.closed and not self._sender.alive():
            self._deliveries.fail(self._accumulator.leftovers(),
                                  RuntimeError("the producer is closed"))
        else:
            self._accumulator.wake()

    def send_many(self, topic: str, records: Sequence[tuple[bytes | str | None,
                                                            bytes | str | None]],
                  tally: Tally | None = None) -> Tally:
        """Queue many ``(key, value)`` records of one topic, partitioned as ``send`` does;
        their answers are counted in ``tally`` (a new one if None), not in Futures. Waits
        for room as ``send`` does."""
        if self._txn is not None and self._txn.state != IN_TRANSACTION:
            self._txn.refuse_send()
        tally = tally if tally is not None else Tally()
        self.partitions_for(topic)
        now = monotonic()
        made = [FutureRecordMetadata(self._deliveries, topic, now, k, v, _tally=tally)
                for k, v in records]
        tally._add(len(made))
        # Through the incoming queue, as send's records: a partition's keep their order.
        self._accumulator.append_many(made, topic, self.max_block_ms, self._where,
                                      wait=not in_callback())
        if len(made) >= DRAIN_AT:
            self._sender.assist()  # as send does: a turn of the loop while they are cached
        return tally

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued and wait for the answers (records sent again after a
        refusal of a record before them included) and for their callbacks to have run.
        Not from a record's callback: that runs on the thread that sends the records, so
        the flush would wait for itself (``RuntimeError``, as Kafka's producer since
        KIP-1118)."""
        if self._sender.on_thread() or in_callback():
            raise RuntimeError(
                "Producer.flush() was called from a record's callback, which runs on the "
                "producer's sender thread: it would wait for that thread forever. Flush "
                "from the thread that sends, not from a callback")
        acc = self._accumulator
        with acc.cond:
            records = acc.waiting() + self._sender.in_flight()
            acc.flush_requested += 1
        acc.wake()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            if self._deliveries.wait(records, timeout_s):
                # Kafka's flush returns after the records' callbacks have run too.
                self._deliveries.wait_callbacks(
                    None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            with acc.cond:
                acc.flush_requested -= 1

    # -- transactions (Kafka's transactional producer) -----------------------------------
    def init_transactions(self, timeout_s: float | None = None) -> None:
        """Register ``transactional_id`` with its coordinator: fences every older producer
        of the id (its next write or commit fails ``ProducerFencedError``) and aborts the
        transaction it left open. Once, before the first transaction."""
        self._transactional("init_transactions").init(timeout_s)

    def begin_transaction(self) -> None:
        """Start a transaction: the records sent until it ends are committed or aborted
        together, in every partition."""
        self._transactional("begin_transaction").begin()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int] | Iterable[Any],
                                    group_metadata: GroupMetadata | str,
                                    timeout_s: float | None = None) -> None:
        """Commit a consumer group's offsets (the next record to read) with the
        transaction: ``{TopicPartition: offset}`` and the consumer's
        ``group_metadata()`` (fenced if the member left the group: KIP-447)."""
        self._transactional("send_offsets_to_transaction").send_offsets(
            offsets, group_metadata, timeout_s)

    def commit_transaction(self, timeout_s: float | None = None) -> None:
        """Flush, then commit: committed readers see every record of the transaction, or
        (it fails) none. After a failed write of it, ``TransactionAbortableError``: abort."""
        txn = self._transactional("commit_transaction")
        self.flush(timeout_s)
        txn.end(True, timeout_s)

    def abort_transaction(self, timeout_s: float | None = None) -> None:
        """Wait for the records in flight, then abort: no committed reader sees any of
        the transaction's records."""
        txn = self._transactional("abort_transaction")
        self.flush(timeout_s)
        txn.end(False, timeout_s)

    def _transactional(self, what: str) -> TransactionManager:
        if self._txn is None:
            raise ValueError(f"{what} needs a Producer made with transactional_id")
        return self._txn

    def close(self) -> None:
        """Send what is queued (within ``delivery_timeout_ms``), then stop. From a
        record's callback (the sender thread), it does not wait: the thread sends what is
        queued and then ends (Kafka's producer closes at once there too)."""
        self._accumulator.close()
        if self._sender.on_thread() or in_callback():
            log.warning("Producer.close() from a record's callback: not waiting for the "
                        "records queued (the thread that sends them is running the callback)")
            return
        self._sender.join()
        # A send that raced with close may have come after the sender thread's last look.
        self._deliveries.fail(self._accumulator.leftovers(),
                              RuntimeError("the producer is closed"))
        self._http.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
