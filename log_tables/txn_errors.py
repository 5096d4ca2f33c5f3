"""The errors of transactions (Kafka's KIP-98, KIP-447, KIP-890). Part of
``log_tables.errors``'s one table, which gathers them; import them from there.
(kafka_name, code, retriable) on one line each.

A transactional producer treats ``producer_fenced`` and ``invalid_producer_id_mapping`` as
fatal (another instance took over its transactional id, or it never had this id), the
retriable ones by trying again, and ``invalid_txn_state`` and ``transaction_abortable``
by aborting the transaction and beginning another.
"""

from __future__ import annotations

from log_tables.error_root import LakelogError


class ProducerFencedError(LakelogError):
    """A newer instance of the transactional id initialised (or the coordinator aborted a
    transaction that ran past its timeout): this producer's epoch is over."""
    kafka_name, code, retriable = "PRODUCER_FENCED", "producer_fenced", False


class InvalidProducerIdMappingError(LakelogError):
    """The producer id is not the one the transactional id has."""
    kafka_name, code = "INVALID_PRODUCER_ID_MAPPING", "invalid_producer_id_mapping"


class InvalidTxnStateError(LakelogError):
    """The request does not fit the transaction's state (a commit with nothing begun, a
    transactional write to a partition the transaction did not add)."""
    kafka_name, code = "INVALID_TXN_STATE", "invalid_txn_state"


class InvalidTransactionTimeoutError(LakelogError):
    """A ``transaction_timeout_ms`` out of the broker's bounds."""
    kafka_name, code = "INVALID_TRANSACTION_TIMEOUT", "invalid_transaction_timeout"


class ConcurrentTransactionsError(LakelogError):
    """The transactional id's previous commit or abort is still being completed."""
    kafka_name, code, retriable = "CONCURRENT_TRANSACTIONS", "concurrent_transactions", True


class TransactionalIdNotFoundError(LakelogError):
    """No transactional id of this name (it never initialised, or expired)."""
    kafka_name, code = "TRANSACTIONAL_ID_NOT_FOUND", "transactional_id_not_found"


class UnstableOffsetCommitError(LakelogError):
    """Offsets of the partition are pending in an open transaction: asked again once it
    ends, the answer is the committed one."""
    kafka_name, code, retriable = "UNSTABLE_OFFSET_COMMIT", "unstable_offset_commit", True


class TransactionAbortableError(LakelogError):
    """The transaction cannot commit (it timed out, or a write of it failed): abort it
    and begin another."""
    kafka_name, code = "TRANSACTION_ABORTABLE", "transaction_abortable"


TXN_ERRORS: tuple[type[LakelogError], ...] = (
    ProducerFencedError, InvalidProducerIdMappingError, InvalidTxnStateError,
    InvalidTransactionTimeoutError, ConcurrentTransactionsError, TransactionalIdNotFoundError,
    UnstableOffsetCommitError, TransactionAbortableError,
)

__all__ = [
    "TXN_ERRORS",
    "ConcurrentTransactionsError",
    "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "ProducerFencedError",
    "TransactionAbortableError",
    "TransactionalIdNotFoundError",
    "UnstableOffsetCommitError",
]
