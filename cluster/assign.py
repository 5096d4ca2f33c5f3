"""Replica assignment, as Kafka's AdminUtils assigns replicas to brokers.

Leaders go round the brokers (partition p's leader is broker ``(start + p) % n``), and
followers follow at a shift that grows every ``n`` partitions, so that leaders and
replicas spread evenly. With racks, the brokers are first listed alternating racks
(rack a, rack b, rack c, rack a, ...) and a follower is taken from a rack that has no
replica yet while there is one, so that losing a rack loses at most one copy.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from log_tables.errors import InvalidConfigError


def rack_alternated(brokers: Sequence[tuple[int, str | None]]) -> list[int]:
    """Broker ids ordered rack by rack in turn (each rack's brokers in id order)."""
    racks: dict[str, list[int]] = {}
    for broker_id, rack in sorted(brokers):
        racks.setdefault(rack or "", []).append(broker_id)
    order = [racks[r] for r in sorted(racks)]
    out: list[int] = []
    for i in range(max((len(ids) for ids in order), default=0)):
        out.extend(ids[i] for ids in order if i < len(ids))
    return out


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(topic: str, brokers: Sequence[tuple[int, str | None]], partitions: int,
                    replication_factor: int, first_partition: int = 0) -> list[list[int]]:
    """Replicas (leader first) of partitions ``first_partition .. first_partition +
    partitions - 1`` over ``brokers`` ((id, rack) pairs). The start is a hash of the topic's
    name, so that one-partition topics do not all land on the same broker."""
    n = len(brokers)
    if replication_factor < 1:
        raise InvalidConfigError("replication.factor", str(replication_factor),
                                 "must be at least 1")
    if replication_factor > n:
        raise InvalidConfigError(
            "replication.factor", str(replication_factor),
            f"larger than the {n} live broker(s); start more brokers or ask for at most {n}")
    racked = any(rack for _, rack in brokers)
    ids = rack_alternated(brokers) if racked else sorted(b for b, _ in brokers)
    rack_of = dict(brokers)
    n_racks = len({rack_of[b] for b in ids})
    start = zlib.crc32(topic.encode()) % n
    shift = zlib.crc32(topic.encode()[::-1]) % n
    out: list[list[int]] = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        if not racked:
            replicas += [ids[_follower_index(first, shift, j, n)]
                         for j in range(replication_factor - 1)]
        else:
            racks_used = {rack_of[ids[first]]}
            k = 0
            while len(replicas) < replication_factor:
                candidate = ids[_follower_index(first, shift, k, n)]
                k += 1
                if candidate in replicas:
                    continue
                if rack_of[candidate] in racks_used and len(racks_used) < n_racks \
                        and k <= n * n:
                    continue  # a rack without a copy comes first, while there is one
                replicas.append(candidate)
                racks_used.add(rack_of[candidate])
                if len(racks_used) == n_racks:
                    racks_used = set()  # every rack has one: start a new round
        out.append(replicas)
    return out


def grow(replicas: Sequence[Sequence[int]], live: Sequence[int], target: int
         ) -> list[list[int]] | None:
    """Each partition's replicas with live brokers added up to ``target`` (None: every
    partition has as many already). The least loaded broker first; among equals, a start
    that turns with the partition, so that one broker's partitions do not all get the
    same other broker (when it dies, they move to several)."""
    if all(len(rs) >= target for rs in replicas):
        return None
    load = {b: 0 for b in live}
    for rs in replicas:
        for b in rs:
            if b in load:
                load[b] += 1
    grown: list[list[int]] = []
    for p, rs in enumerate(replicas):
        out = list(rs)
        free = [b for b in sorted(load) if b not in out]
        turned = free[p % len(free):] + free[:p % len(free)] if free else []
        for b in sorted(turned, key=lambda b: load[b])[:max(0, target - len(out))]:
            out.append(b)
            load[b] += 1
        grown.append(out)
    return grown
