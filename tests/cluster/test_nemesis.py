"""The nemesis in the suite: two seeds of 20 s (``tests/cluster/nemesis``; the long run
over many seeds is ``python -m tests.cluster.nemesis``, see docs/cluster.md).

Each seed deals a random mix of faults on three real brokers, each in a network
namespace of its own (SIGKILL and SIGSTOP past and short of the session of any broker,
the controller, a leader, the bootstrap broker; ZooKeeper restarted; a broker cut off
from ZooKeeper or from the other brokers), under two idempotent acks=all producers, a
consumer group, two transactional producers (two topics, offsets in each transaction,
one zombie in ten) and a consume-transform-produce process (SIGKILLed mid-commit and
SIGSTOPped past its timeouts), while the brokers' job processes tier the transactional
topics; it counts what a replicated log must never do, in the logs and in the Delta
tables. Every count must be 0.

``LAKELOG_NEMESIS_SEED`` replays one seed, ``LAKELOG_NEMESIS_SECONDS`` lengthens it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.nemesis.network import NetworkUnavailable
from tests.cluster.nemesis.run import run_nemesis

pytestmark = pytest.mark.slow

SEEDS = [int(os.environ["LAKELOG_NEMESIS_SEED"])] if os.environ.get("LAKELOG_NEMESIS_SEED") \
    else [205, 4242]
"""205 found the loss of a new leader's acknowledgements before it replicated (its own
test: ``test_replication_steps.py::test_a_new_leader_acknowledges_nothing_before_it_replicates``)."""
SECONDS = float(os.environ.get("LAKELOG_NEMESIS_SECONDS", "20"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_acknowledged_is_lost_under_the_nemesis(seed: int, tmp_path: Path) -> None:
    try:
        verdict = run_nemesis(seed, SECONDS, tmp_path)
    except NetworkUnavailable as exc:
        pytest.fail(f"{exc} (CI runs as root; so can you: sudo)", pytrace=False)
    print(f"\nmeasured: nemesis {verdict.summary()}")
    for line in verdict.faults:
        print(f"  {line}")
    assert verdict.acknowledged > 1000, verdict.summary()
    assert verdict.transactions > 0, verdict.summary()  # the transactional checks ran
    assert verdict.ctp_transactions > 0, verdict.summary()
    assert verdict.schemas_registered > 0, verdict.summary()  # the registry was used
    assert verdict.dealt >= verdict.scheduled // 2, verdict.summary()  # faults, not skips
    assert verdict.ok, (f"replay: LAKELOG_NEMESIS_SEED={seed} LAKELOG_NEMESIS_SECONDS="
                        f"{SECONDS:g}; {verdict.summary()}; examples: {verdict.examples}")


def test_networks_one_after_another_in_one_process_each_get_their_names() -> None:
    """A seed's network is made right after the last one's closed, in the same process
    (two seeds here, many in ``python -m tests.cluster.nemesis``): closing deletes each
    veth pair at once. The kernel removes a deleted namespace's interfaces only later, so
    the next network found its veth names taken ("File exists": three seeds of eight in a
    long run, and the second of two networks made back to back)."""
    from tests.cluster.nemesis.network import network

    for seed in range(10):
        try:
            with network(3, seed) as net:
                assert sorted(net.namespaces) == [1, 2, 3]
        except NetworkUnavailable as exc:
            pytest.fail(f"network {seed}: {exc}", pytrace=False)
