"""One nemesis run, start to verdict (Jepsen's shape: a cluster, clients, faults, a check).

1. ZooKeeper and three brokers, each in a network namespace of its own; a topic of
   ``PARTITIONS`` partitions, replication factor 3, ``min.insync.replicas`` 2.
2. Two idempotent acks=all producers (one given broker 1 alone, one brokers 2 and 3)
   sending keyed records as fast as they can; a group of two consumers (given brokers
   2 and 1, 3 and 1) committing every second; a watch on the committed offsets; a
   transactional producer committing (and aborting one in five) transactions over the
   partitions of a second topic; a consume-transform-produce process (``ctp.py``) from
   the transactional topics to a third.
3. The seed's faults for ``seconds`` (``faults.py``, and on the process ``clients.py``),
   then every fault healed, every broker running.
4. The ISR whole again, the producers flushed, the consumers caught up with the high
   watermarks; each partition read from its log start to its high watermark; the
   consume-transform-produce process caught up with its input; the transactional topics'
   tables tiered to their ends (by the brokers' job processes, under the faults); the
   brokers stopped cleanly and their replicas compared byte for byte.
5. ``checker``'s figures: lost, duplicated, misplaced, out of order, unseen, commits
   backwards, replicas that differ; and of the transactions, read ``read_committed``
   once no transaction is open: committed records lost or duplicated, aborted ones
   seen, transactions seen in part; of the consume-transform-produce process, inputs
   without exactly one output; of the tables, what differs from the logs and what any
   version of them shows of a transaction in part.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pyarrow as pa

from consumer_groups.hashing import group_slot
from log_tables.registry import TXN_STATE_TOPIC
from tests.cluster.nemesis import ctp, tables
from tests.cluster.nemesis.checker import (
    FinalLog,
    Verdict,
    check_ctp,
    check_records,
    check_replicas,
    check_transactions,
    check_txn_offsets,
)
from tests.cluster.nemesis.clients import ClientNemesis, CtpProcess, client_schedule
from tests.cluster.nemesis.cluster import NemesisCluster, nemesis_cluster
from tests.cluster.nemesis.faults import Nemesis, schedule
from tests.cluster.nemesis.network import network
from tests.cluster.nemesis.schemas import Registering, check_schemas
from tests.cluster.nemesis.workload import CommitWatch, Consuming, Producing, Transacting
from tests.server import CLUSTER

log = logging.getLogger("nemesis")
_T = TypeVar("_T")

TOPIC = "nemesis"
TXN_TOPIC = "nemesis-txn"
TXN_TOPIC2 = "nemesis-txn-2"
GROUP = "nemesis-group"
PARTITIONS = 6
SESSION_TIMEOUT_MS = 4000
BROKER_ENV = {
    "LAKELOG_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    "LAKELOG_REPLICA_LAG_TIME_MAX_MS": "4000",
    "LAKELOG_LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS": "10",
    "LAKELOG_PRODUCE_TIMEOUT_MS": "10000",
    # Each broker's job process tiers (one Spark JVM each, started on the first segment
    # to tier): the transactional topics roll a segment every second.
    "LAKELOG_TIER_INTERVAL_MS": "1000",
    "LAKELOG_ROLL_CHECK_INTERVAL_MS": "200",
    "LAKELOG_SPARK_MASTER": "local[1]",
}
TIERED_CONFIGS = [{"name": "segment.ms", "value": "1000"}]
HEAL_S = 180.0
"""Deadline of each wait once the faults stop: a cluster that has not recovered by then
fails the run."""


class NotRecovered(AssertionError):
    pass


def wait_for(condition: Callable[[], _T | None], what: str, timeout_s: float = HEAL_S) -> _T:
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise NotRecovered(f"not within {timeout_s:g}s: {what}")
        time.sleep(0.1)
    return found


def _create_topic(cluster: NemesisCluster, topic: str = TOPIC,
                  configs: list[dict[str, str]] | None = None) -> None:
    def created() -> bool:
        try:
            r = httpx.post(cluster.url(1) + CLUSTER + "/topics", timeout=10, json={
                "topic_name": topic, "partitions_count": PARTITIONS, "replication_factor": 3,
                "configs": [{"name": "min.insync.replicas", "value": "2"}, *(configs or [])]})
        except httpx.HTTPError:
            return False
        return r.status_code == 201

    wait_for(created, f"topic {topic} created", 60)
    _wait_in_sync(cluster, 60, topic)


def _wait_in_sync(cluster: NemesisCluster, timeout_s: float = HEAL_S,
                  topic: str = TOPIC) -> None:
    def whole() -> bool:
        states = [cluster.state(topic, p) for p in range(PARTITIONS)]
        return all(s is not None and s.leader > 0 and len(s.isr) == 3 for s in states)

    wait_for(whole, f"every partition of {topic} led with three in-sync replicas", timeout_s)


def _high_watermarks(cluster: NemesisCluster, acked_ends: dict[int, int]) -> dict[int, int]:
    """Each partition's high watermark once it covers every acknowledged offset (a leader
    elected a moment ago starts from the high watermark it had as a follower and raises it
    as its followers fetch: read too soon, it hides the last acknowledged records)."""
    def reached(p: int) -> int | None:
        r = cluster.any_get(f"/topics/{TOPIC}/partitions/{p}/offsets", spec="latest")
        hw = int(r.json()["offset"]) if r is not None else -1
        return hw if hw >= acked_ends.get(p, 0) else None

    return {p: wait_for(lambda p=p: reached(p),  # type: ignore[misc]
                        f"partition {p}'s high watermark past its acknowledged records")
            for p in range(PARTITIONS)}


def _read(cluster: NemesisCluster, partition: int, end: int, topic: str = TOPIC,
          isolation: str = "read_uncommitted") -> list[tuple[int, bytes]]:
    """The partition from its log start to ``end``, through any broker (as Arrow)."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset < end:
        def page(offset: int = offset) -> httpx.Response | None:
            for i in cluster.ids:
                try:
                    r = httpx.get(
                        f"{cluster.url(i)}{CLUSTER}/topics/{topic}/partitions/{partition}/records",
                        params={"offset": offset, "max_records": 10_000, "max_bytes": 8 << 20,
                                "isolation_level": isolation},
                        headers={"accept": "application/vnd.apache.arrow.stream"}, timeout=30)
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    return r
            return None

        r = wait_for(page, f"partition {partition} from offset {offset}")
        table = pa.ipc.open_stream(io.BytesIO(r.content)).read_all()
        offsets = table.column("offset").to_pylist()
        values = table.column("value").to_pylist()
        out += [(o, v) for o, v in zip(offsets, values, strict=True) if o < end]
        before, offset = offset, int(r.headers["lakelog-next-offset"])
        if not offsets and offset <= before:
            raise NotRecovered(f"partition {partition}: nothing at {offset}, below the "
                               f"high watermark {end}")
    return out


def run_nemesis(seed: int, seconds: float, directory: Path) -> Verdict:
    """One run; the verdict holds every figure (``Verdict.ok``: all counted are 0)."""
    verdict = Verdict(seed, seconds)
    faults = schedule(seed, seconds, SESSION_TIMEOUT_MS / 1000)
    verdict.scheduled = len(faults)
    with network(3, seed) as net, nemesis_cluster(directory, net, env=BROKER_ENV) as cluster:
        _create_topic(cluster)
        for topic in (TXN_TOPIC, TXN_TOPIC2, ctp.OUTPUT):
            _create_topic(cluster, topic, TIERED_CONFIGS)
        urls = [cluster.url(i) for i in cluster.ids]
        # p1 has broker 1 alone (the bootstrap faults aim at it), the others a list.
        producers = [Producing("p1", urls[0], TOPIC),
                     Producing("p2", [urls[1], urls[2]], TOPIC)]
        consumers = [Consuming("c1", [urls[1], urls[0]], GROUP, TOPIC),
                     Consuming("c2", [urls[2], urls[0]], GROUP, TOPIC)]
        watch = CommitWatch(urls, GROUP)
        transacting = [Transacting("t1", urls, [TXN_TOPIC, TXN_TOPIC2], PARTITIONS),
                       Transacting("t2", [urls[2], urls[1]], [TXN_TOPIC2, TXN_TOPIC],
                                   PARTITIONS)]
        registering = Registering(urls)
        for worker in [*producers, *consumers, watch, *transacting, registering]:
            worker.start()
        process = CtpProcess(directory, urls, [TXN_TOPIC, TXN_TOPIC2])
        process.start()
        wait_for(lambda: all(p.acked for p in producers), "the first acknowledgements", 60)
        nemesis = Nemesis(cluster, faults, topic=TOPIC, partitions=PARTITIONS, bootstrap=1,
                          # transaction_state_log_num_partitions: 16, the default
                          coordinator=(TXN_STATE_TOPIC, group_slot(transacting[0].tid, 16)))
        on_client = ClientNemesis(process, client_schedule(seed, seconds))
        on_client.start()
        try:
            nemesis.run()
        finally:
            on_client.heal()
            nemesis.heal()
        verdict.faults = sorted(nemesis.history + on_client.history)
        verdict.dealt = nemesis.dealt
        verdict.ctp_kills_mid_commit = on_client.mid_commit
        if nemesis.errors or on_client.errors:
            raise NotRecovered(f"faults not dealt: {nemesis.errors + on_client.errors}")
        _wait_in_sync(cluster)
        for t in transacting:
            t.stop()
        registering.stop()
        check_schemas(verdict, registering, urls)
        verdict.unanswered = sum(p.finish(120) for p in producers)
        acked_ends: dict[int, int] = {}
        for producer in producers:
            for partition, offset in producer.acked.values():
                acked_ends[partition] = max(acked_ends.get(partition, 0), offset + 1)
        hws = _high_watermarks(cluster, acked_ends)
        wait_for(lambda: _caught_up(consumers, hws), "the consumers caught up")
        for c in consumers:
            c.stop()
        watch.stop()
        final: FinalLog = {p: _read(cluster, p, hw) for p, hw in hws.items()}
        stable = {topic: {p: _stable_end(cluster, topic, p) for p in range(PARTITIONS)}
                  for topic in (TXN_TOPIC, TXN_TOPIC2)}
        inputs = {(topic, p): _read(cluster, p, end, topic, "read_committed")
                  for topic, ends in stable.items() for p, end in ends.items()}
        committed: FinalLog = {i: inputs[key] for i, key in enumerate(sorted(inputs))}
        group_offsets = {t.label: _group_offsets(cluster, t.group).get((t.topics[0], 0))
                         for t in transacting}
        wait_for(lambda: _transformed(cluster, inputs), "the consume-transform-produce "
                 "process's committed offsets past its input")
        process.kill()
        verdict.ctp_transactions = sum(1 for line in process.lines()
                                       if line.startswith("committed "))
        stable[ctp.OUTPUT] = {p: _stable_end(cluster, ctp.OUTPUT, p) for p in range(PARTITIONS)}
        outputs = {p: _read(cluster, p, end, ctp.OUTPUT, "read_committed")
                   for p, end in stable[ctp.OUTPUT].items()}
        check_ctp(verdict, inputs, outputs)
        warehouse = directory / "warehouse"
        writers = [tables.TxnWriter(t.label, t.topics, t.per_txn, t.outcomes)
                   for t in transacting]
        for topic, ends in stable.items():
            tables.wait_tiered(warehouse, topic, ends, wait_for)
            log_of = outputs if topic == ctp.OUTPUT else {
                p: inputs[(topic, p)] for p in range(PARTITIONS)}
            tables.check_table(verdict, tables.table_path(warehouse, topic), log_of)
            if topic != ctp.OUTPUT:
                tables.check_torn(verdict, tables.table_path(warehouse, topic), topic, writers)
        cluster.stop_all()
        acked = {v: loc for p in producers for v, loc in p.acked.items()}
        verdict.failed = sum(len(p.failed) for p in producers)
        verdict.longest_gap_s = max(p.longest_gap_s for p in producers)
        check_records(verdict, acked, final,
                      [s for c in consumers for s in c.stretches])
        verdict.commits_backwards = len(watch.backwards)
        verdict.examples["commits_backwards"] = watch.backwards[:10]
        outcomes = {t.label: t.outcomes for t in transacting}
        check_transactions(verdict, outcomes, transacting[0].per_txn, committed)
        check_txn_offsets(verdict, outcomes, group_offsets)
        verdict.zombie_commits = sum(t.zombie_commits for t in transacting)
        verdict.examples["txn_errors"] = [e for t in transacting for e in t.errors[:5]]
        check_replicas(verdict, [cluster.servers[i].data_dir for i in cluster.ids], TOPIC, hws)
    return verdict


def _stable_end(cluster: NemesisCluster, topic: str, partition: int) -> int:
    """A transactional topic's partition end once no transaction is open there (its
    last stable offset is its high watermark)."""
    def stable() -> int | None:
        bounds = []
        for isolation in ("read_committed", "read_uncommitted"):
            r = cluster.any_get(f"/topics/{topic}/partitions/{partition}/records",
                                offset=0, max_records=1, isolation_level=isolation)
            if r is None:
                return None
            bounds.append(int(r.json()["high_watermark"]))
        return bounds[0] if bounds[0] == bounds[1] else None

    return wait_for(stable, f"{topic}-{partition}: every transaction ended")


def _transformed(cluster: NemesisCluster,
                 inputs: dict[tuple[str, int], list[tuple[int, bytes]]]) -> bool:
    """Whether the consume-transform-produce group's committed offsets are past every
    committed input record."""
    offsets = _group_offsets(cluster, ctp.GROUP)
    return all(not records or offsets.get(key, 0) > records[-1][0]
               for key, records in inputs.items())


def _group_offsets(cluster: NemesisCluster, group: str) -> dict[tuple[str, int], int]:
    """A group's committed offsets (a transactional producer's group: its last committed
    transaction's number at partition 0 of its first topic)."""
    def ask() -> list[dict[str, object]] | None:
        for i in cluster.ids:
            try:
                r = httpx.get(f"{cluster.url(i)}{CLUSTER}/consumer-groups/{group}/offsets",
                              timeout=10)
            except httpx.HTTPError:
                continue
            if r.status_code in (200, 404):  # 404: no offset ever committed
                return list(r.json().get("offsets", [])) if r.status_code == 200 else []
        return None

    rows = wait_for(lambda: (lambda got: None if got is None else [got])(ask()),
                    f"group {group}'s offsets")[0]
    return {(str(o["topic_name"]), int(str(o["partition_id"]))): int(str(o["offset"]))
            for o in rows}


def _caught_up(consumers: list[Consuming], hws: dict[int, int]) -> bool:
    highest: dict[int, int] = {}
    for c in consumers:
        for p, stretch in c.stretches:
            if stretch.offsets:
                highest[p] = max(highest.get(p, -1), stretch.offsets[-1])
    return all(hw == 0 or highest.get(p, -1) >= hw - 1 for p, hw in hws.items())


def write_json(verdicts: list[Verdict], path: Path) -> None:
    path.write_text(json.dumps([v.as_json() for v in verdicts], indent=1, default=str))
