"""A transactional producer's side of Kafka's transactions (``Producer(transactional_id=)``).

States, as Kafka's ``TransactionManager``: ``uninitialized`` until ``init_transactions``,
then ``ready``; ``begin_transaction`` makes it ``in_transaction``; the sender adds each
partition to the transaction before its first records go (``add_partitions``, on the
sender's thread); ``commit``/``abort`` end it and take the epoch the coordinator answers
(KIP-890: a new one each time). A failed write makes the transaction ``abortable``
(commit refuses; abort clears it); ``producer_fenced`` (another instance initialised) and
``invalid_producer_id_mapping`` make the producer ``fatal``: only ``close`` is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast
from urllib.parse import quote

import httpx

from lakelog.client.errors import LakelogClientError, raise_for, typed
from lakelog.client.retry import Attempts, RetryPolicy, call
from lakelog.client.structs import TopicPartition
from log_tables import errors as e

UNINITIALIZED, READY, IN_TRANSACTION, ABORTABLE, FATAL = (
    "uninitialized", "ready", "in_transaction", "abortable", "fatal")
FATAL_ERRORS = frozenset({"producer_fenced", "invalid_producer_id_mapping",
                          "transactional_id_not_found", "authorization_failed"})


class GroupMetadata:
    """What ``send_offsets_to_transaction`` needs of a consumer (Kafka's
    ``ConsumerGroupMetadata``): its group, member id and member epoch, which fence the
    offsets if the member is no longer the group's (KIP-447)."""

    def __init__(self, group_id: str, member_id: str | None = None,
                 member_epoch: int = -1) -> None:
        self.group_id = group_id
        self.member_id = member_id
        self.member_epoch = member_epoch

    def __repr__(self) -> str:
        return (f"GroupMetadata({self.group_id!r}, member_id={self.member_id!r}, "
                f"member_epoch={self.member_epoch})")


class TransactionManager:
    def __init__(self, http: httpx.Client, transactional_id: str, timeout_ms: int,
                 policy: RetryPolicy, url: str) -> None:
        self.http = http
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.policy = policy
        self.url = url
        self.path = f"/transactions/{quote(transactional_id, safe='')}"
        self.state = UNINITIALIZED
        self.ident: tuple[int, int] | None = None
        """(producer id, epoch) of the transactional id; the sender writes with it."""
        self.added: set[TopicPartition] = set()
        self.error: BaseException | None = None
        """Why the transaction is abortable, or the producer fatal."""
        self._began = False
        """Something of the transaction reached the coordinator (a partition, offsets)."""
        self._lock = threading.Lock()

    # -- the user's calls ------------------------------------------------------------------
    def init(self, timeout_s: float | None) -> None:
        with self._lock:
            self._not_fatal()
            if self.state in (IN_TRANSACTION, ABORTABLE):
                raise _state("init_transactions during a transaction: end it first")
            answer = self._post(":init", {"transaction_timeout_ms": self.timeout_ms},
                                "init_transactions", timeout_s)
            self.ident = (int(answer["producer_id"]), int(answer["producer_epoch"]))
            self.state = READY
            self.added.clear()

    def begin(self) -> None:
        with self._lock:
            self._not_fatal()
            if self.state == UNINITIALIZED:
                raise _state("call init_transactions before begin_transaction")
            if self.state != READY:
                raise _state("a transaction is already in progress: commit or abort it first")
            self.state = IN_TRANSACTION
            self._began = False
            self.added.clear()

    def send_offsets(self, offsets: Mapping[TopicPartition, int] | Iterable[Any],
                     group: GroupMetadata | str, timeout_s: float | None) -> None:
        meta = group if isinstance(group, GroupMetadata) else GroupMetadata(group)
        rows = _offset_rows(offsets)
        with self._lock:
            self._in_transaction("send_offsets_to_transaction")
            assert self.ident is not None
            body = {"producer_id": self.ident[0], "producer_epoch": self.ident[1],
                    "group_id": meta.group_id, "offsets": rows,
                    "member_id": meta.member_id, "member_epoch": meta.member_epoch}
            try:
                self._post("/offsets", body, "send_offsets_to_transaction", timeout_s)
            except LakelogClientError as exc:
                self._failed(exc)
                raise
            self._began = True

    def end(self, commit: bool, timeout_s: float | None) -> None:
        """Commit or abort (the caller flushed first); the new epoch is taken."""
        with self._lock:
            self._not_fatal()
            if self.state == ABORTABLE and commit:
                raise typed(e.TransactionAbortableError)(
                    0, "transaction_abortable",
                    f"the transaction cannot commit (a write of it failed: {self.error}); "
                    "abort it, then begin another")
            if self.state not in (IN_TRANSACTION, ABORTABLE):
                raise _state(f"no transaction to {'commit' if commit else 'abort'}: "
                             "begin_transaction first")
            if not self._began and not self.added:
                self.state, self.error = READY, None  # nothing reached the coordinator
                return
            assert self.ident is not None
            what = "commit_transaction" if commit else "abort_transaction"
            try:
                answer = self._post(":commit" if commit else ":abort",
                                    {"producer_id": self.ident[0],
                                     "producer_epoch": self.ident[1]}, what, timeout_s)
            except LakelogClientError as exc:
                if exc.error in FATAL_ERRORS:
                    self.state, self.error = FATAL, exc
                raise
            self.ident = (int(answer["producer_id"]), int(answer["producer_epoch"]))
            self.state, self.error = READY, None
            self.added.clear()

    def refuse_send(self) -> None:
        """``send`` outside a transaction: raise why (Kafka's producer refuses it too)."""
        self._not_fatal()
        if self.state == ABORTABLE:
            raise typed(e.TransactionAbortableError)(
                0, "transaction_abortable", f"the transaction must abort ({self.error})")
        raise _state("send outside a transaction: begin_transaction first")

    # -- the sender's ------------------------------------------------------------------------
    def add_partitions(self, tps: Iterable[TopicPartition], attempts: Attempts,
                       queued: Callable[[], Iterable[TopicPartition]] = tuple) -> None:
        """Add the partitions not yet in the transaction (before records go to them),
        with those of ``queued`` (the partitions with records waiting) in the same call,
        as Kafka's sender adds every partition sent to since its last add: a transaction
        over six partitions makes one call, not one per partition's first request."""
        wanted = set(tps) - self.added
        if not wanted:
            return
        new = sorted(wanted | (set(queued()) - self.added))
        if self.state != IN_TRANSACTION or self.ident is None:
            raise self.error if isinstance(self.error, LakelogClientError) and \
                self.state in (ABORTABLE, FATAL) else _state(
                "records sent outside a transaction: begin_transaction first")
        body = {"producer_id": self.ident[0], "producer_epoch": self.ident[1],
                "partitions": [{"topic_name": t, "partition_id": p} for t, p in new]}
        r = call(lambda t: self.http.post(self.path + "/partitions", json=body, timeout=t),
                 attempts, idempotent=True)
        try:
            raise_for(r)
        except LakelogClientError as exc:
            self._failed(exc)
            raise
        self.added.update(new)
        self._began = True

    def failed(self, error: BaseException) -> None:
        """A write of the transaction failed: it can only abort (or, fenced, nothing)."""
        with self._lock:
            self._failed(error)

    # -- steps -------------------------------------------------------------------------------
    def _failed(self, error: BaseException) -> None:
        if self.state == FATAL:
            return
        if isinstance(error, LakelogClientError) and error.error in FATAL_ERRORS:
            self.state, self.error = FATAL, error
        elif self.state == IN_TRANSACTION:
            self.state, self.error = ABORTABLE, error

    def _not_fatal(self) -> None:
        if self.state == FATAL:
            assert self.error is not None
            raise self.error

    def _in_transaction(self, what: str) -> None:
        self._not_fatal()
        if self.state == ABORTABLE:
            raise typed(e.TransactionAbortableError)(
                0, "transaction_abortable", f"{what}: the transaction must abort ({self.error})")
        if self.state != IN_TRANSACTION:
            raise _state(f"{what} outside a transaction: begin_transaction first")

    def _post(self, suffix: str, body: dict[str, Any], what: str,
              timeout_s: float | None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout_s if timeout_s is not None
                                       else self.policy.request_timeout_ms / 1000 * 4)
        attempts = Attempts(self.policy, deadline, f"{what} ({self.transactional_id})",
                            self.url, "the call's timeout")
        r = call(lambda t: self.http.post(self.path + suffix, json=body, timeout=t), attempts,
                 idempotent=True)
        raise_for(r)
        return r.json() if r.content else {}


def _state(message: str) -> LakelogClientError:
    return typed(e.InvalidTxnStateError)(0, "invalid_txn_state", message)


def _offset_rows(offsets: Mapping[TopicPartition, int] | Iterable[Any]) -> list[dict[str, Any]]:
    """``{TopicPartition: offset}``, or Kafka-style objects with ``topic``, ``partition``
    and ``offset`` (confluent-kafka's ``TopicPartition`` list)."""
    items: list[tuple[str, int, int]]
    if isinstance(offsets, Mapping):
        items = [(tp[0], tp[1], int(o)) for tp, o in offsets.items()]
    else:
        items = [(str(o.topic), int(o.partition), int(o.offset))
                 for o in cast(Iterable[Any], offsets)]
    if not items:
        raise ValueError("send_offsets_to_transaction needs at least one offset")
    return [{"topic_name": t, "partition_id": p, "offset": o} for t, p, o in items]
