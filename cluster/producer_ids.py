"""Producer ids of a broker of a cluster, unique across its brokers (a
``log_tables.hot.producer_ids.ProducerIds``, given to the broker's ``LogManager``).

Ids come in blocks that ZooKeeper hands out (``/latest_producer_id_block``, as Kafka
does in ZooKeeper mode); an id's epoch lives in ``/lakelog/producer_epochs/<id>``.
"""

from __future__ import annotations

import threading

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from cluster.model import PRODUCER_ID_BLOCK, ProducerIdBlock, decode, encode
from cluster.session import unreachable_as
from log_tables.errors import (
    BrokerNotAvailableError,
    InvalidProducerEpochError,
    UnknownProducerIdError,
)
from log_tables.hot.producer_ids import MAX_EPOCH

PRODUCER_BLOCK_SIZE = 1000
PRODUCER_EPOCHS = "/lakelog/producer_epochs"


class ClusterProducerIds:
    """Producer ids from blocks that the cluster hands out in ZooKeeper
    (``/latest_producer_id_block``, Kafka's ZooKeeper-mode allocation), so that ids are
    unique across brokers; an epoch bump is a conditional write of the id's epoch. Each
    partition's producer state fences an older epoch, as a Kafka partition leader does."""

    def __init__(self, client: KazooClient, broker_id: int) -> None:
        """``client``: the broker's ZooKeeper session's (started or not: ZooKeeper is
        first asked when a producer is)."""
        self.client = client
        self.broker_id = broker_id
        self._lock = threading.Lock()
        self._next = 0
        self._last = -1
        self._issued_below = 0
        self._epochs_path_made = False

    def _new_block(self) -> None:
        while True:
            try:
                data, stat = self.client.get(PRODUCER_ID_BLOCK)
            except NoNodeError:
                try:
                    block = ProducerIdBlock(self.broker_id, 0, PRODUCER_BLOCK_SIZE - 1)
                    self.client.create(PRODUCER_ID_BLOCK, encode(block))
                    break
                except NodeExistsError:
                    continue
            last = decode(data, ProducerIdBlock).last
            block = ProducerIdBlock(self.broker_id, last + 1, last + PRODUCER_BLOCK_SIZE)
            try:
                self.client.set(PRODUCER_ID_BLOCK, encode(block), version=stat.version)
                break
            except BadVersionError:
                continue
        self._next, self._last = block.first, block.last
        self._issued_below = block.last + 1

    def init_producer(self, producer_id: int | None = None) -> tuple[int, int]:
        with unreachable_as(BrokerNotAvailableError,
                            f"broker {self.broker_id} issuing a producer id"):
            return self._init_producer(producer_id)

    def _init_producer(self, producer_id: int | None) -> tuple[int, int]:
        with self._lock:
            if producer_id is None:
                if self._next > self._last:
                    self._new_block()
                producer_id = self._next
                self._next += 1
                return producer_id, 0
        self._check_issued(producer_id)
        if not self._epochs_path_made:
            self.client.ensure_path(PRODUCER_EPOCHS)
            self._epochs_path_made = True
        path = f"{PRODUCER_EPOCHS}/{producer_id}"
        while True:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                try:
                    self.client.create(path, b"1")
                    return producer_id, 1
                except NodeExistsError:
                    continue
            epoch = int(data) + 1
            if epoch > MAX_EPOCH:
                raise InvalidProducerEpochError(
                    f"producer id {producer_id} exhausted its epochs; request a new id")
            try:
                self.client.set(path, str(epoch).encode(), version=stat.version)
                return producer_id, epoch
            except BadVersionError:
                continue

    def _check_issued(self, producer_id: int) -> None:
        if producer_id < self._issued_below:
            return
        try:
            data, _ = self.client.get(PRODUCER_ID_BLOCK)
            self._issued_below = max(self._issued_below, decode(data, ProducerIdBlock).last + 1)
        except NoNodeError:
            pass
        if producer_id >= self._issued_below:
            raise UnknownProducerIdError(f"producer id {producer_id} was never issued")

    def check(self, producer_id: int, epoch: int) -> None:
        with unreachable_as(BrokerNotAvailableError,
                            f"broker {self.broker_id} checking producer id {producer_id}"):
            self._check_issued(producer_id)
        if not 0 <= epoch <= MAX_EPOCH:
            raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} is invalid")


