"""A broker of a cluster issues producer ids from ZooKeeper's blocks, given to its
``LogManager`` when it is built (no swap at run time): ids are unique across brokers and
an epoch bumped through one broker fences the others."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.client import KazooClient

from cluster.producer_ids import PRODUCER_BLOCK_SIZE, ClusterProducerIds
from log_tables.errors import UnknownProducerIdError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.producer_ids import ProducerIdManager, ProducerIds


def test_brokers_issue_disjoint_ids_and_share_epochs(zk: KazooClient, tmp_path: Path) -> None:
    one: ProducerIds = ClusterProducerIds(zk, 1)
    two: ProducerIds = ClusterProducerIds(zk, 2)
    first = [one.init_producer()[0] for _ in range(3)]
    second = [two.init_producer()[0] for _ in range(3)]
    assert first == [0, 1, 2] and second == [PRODUCER_BLOCK_SIZE + i for i in range(3)]
    assert two.init_producer(first[0]) == (first[0], 1)  # bumped through another broker
    assert one.init_producer(first[0]) == (first[0], 2)
    one.check(second[0], 0)  # issued by broker 2: known to broker 1 too
    with pytest.raises(UnknownProducerIdError):
        one.init_producer(10 * PRODUCER_BLOCK_SIZE)


def test_the_log_manager_uses_the_producer_ids_it_is_given(zk: KazooClient,
                                                            tmp_path: Path) -> None:
    alone = LogManager(tmp_path / "alone")
    assert isinstance(alone.producer_ids, ProducerIdManager)
    alone.close()
    ids = ClusterProducerIds(zk, 7)
    manager = LogManager(tmp_path / "broker", producer_ids=ids)
    try:
        assert manager.producer_ids is ids
        assert manager.producer_ids.init_producer() == (0, 0)
        assert not (tmp_path / "broker" / "producers.json").exists()
    finally:
        manager.close()
