"""Server-side assignors (KIP-848: the coordinator assigns): range, round-robin and
cooperative-sticky. Each maps the members' subscriptions to a target assignment;
the coordinator then moves partitions cooperatively (revoked before reassigned).

Members are ordered by their ordering key (the static ``group.instance.id`` when
they have one, else the member id), so a static member rejoining under a new
member id keeps its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from log_tables.errors import InvalidOptionError


class TopicPartition(NamedTuple):
    topic: str
    partition: int


Assignment = dict[str, set[TopicPartition]]


class MemberSpec(NamedTuple):
    """What an assignor knows of a member."""

    order_key: str
    topics: frozenset[str]


def range_assign(members: Mapping[str, MemberSpec], partitions: Mapping[str, int],
                 previous: Mapping[str, set[TopicPartition]]) -> Assignment:
    """Kafka's range: per topic, consecutive runs of partitions to the subscribed members in
    order, the first ``n % m`` members getting one more."""
    out: Assignment = {m: set() for m in members}
    for topic in sorted(partitions):
        subs = sorted((spec.order_key, m) for m, spec in members.items() if topic in spec.topics)
        if not subs:
            continue
        count = partitions[topic]
        per, extra = divmod(count, len(subs))
        start = 0
        for i, (_, m) in enumerate(subs):
            n = per + (1 if i < extra else 0)
            out[m].update(TopicPartition(topic, p) for p in range(start, start + n))
            start += n
    return out


def roundrobin_assign(members: Mapping[str, MemberSpec], partitions: Mapping[str, int],
                      previous: Mapping[str, set[TopicPartition]]) -> Assignment:
    """Kafka's round-robin: every partition of every topic in order, dealt to the
    subscribed members in turn."""
    out: Assignment = {m: set() for m in members}
    ordered = [m for _, m in sorted((spec.order_key, m) for m, spec in members.items())]
    if not ordered:
        return out
    turn = 0
    for topic in sorted(partitions):
        for p in range(partitions[topic]):
            for _ in range(len(ordered)):
                m = ordered[turn % len(ordered)]
                turn += 1
                if topic in members[m].topics:
                    out[m].add(TopicPartition(topic, p))
                    break
    return out


def sticky_assign(members: Mapping[str, MemberSpec], partitions: Mapping[str, int],
                  previous: Mapping[str, set[TopicPartition]]) -> Assignment:
    """Cooperative-sticky: every member keeps what it had (while still subscribed and the
    partition exists); the partitions of members that left, and new ones, go to the
    members with the fewest; then single moves from the fullest to the emptiest eligible
    member until counts differ by at most one among members that could swap."""
    out: Assignment = {m: set() for m in members}
    owner: dict[TopicPartition, str] = {}
    for m in sorted(members, key=lambda m: members[m].order_key):
        for tp in sorted(previous.get(m, ())):
            if (tp.topic in members[m].topics and tp.partition < partitions.get(tp.topic, 0)
                    and tp not in owner):
                out[m].add(tp)
                owner[tp] = m
    every = [TopicPartition(t, p) for t in sorted(partitions) for p in range(partitions[t])]

    def eligible(tp: TopicPartition) -> list[str]:
        return [m for m in members if tp.topic in members[m].topics]

    for tp in every:
        if tp in owner:
            continue
        candidates = eligible(tp)
        if candidates:
            m = min(candidates, key=lambda m: (len(out[m]), members[m].order_key))
            out[m].add(tp)
            owner[tp] = m
    # Balance: move one partition at a time from the fullest member to one with at least
    # two fewer that may take it. Each move strictly lowers the sum of squared counts.
    while True:
        moved = False
        for donor in sorted(members, key=lambda m: (-len(out[m]), members[m].order_key)):
            for tp in sorted(out[donor], reverse=True):
                takers = [m for m in eligible(tp) if len(out[m]) + 1 < len(out[donor])]
                if takers:
                    taker = min(takers, key=lambda m: (len(out[m]), members[m].order_key))
                    out[donor].remove(tp)
                    out[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return out


ASSIGNORS = {"range": range_assign, "roundrobin": roundrobin_assign,
             "cooperative-sticky": sticky_assign}
DEFAULT_ASSIGNOR = "cooperative-sticky"


def assign(name: str, members: Mapping[str, MemberSpec], partitions: Mapping[str, int],
           previous: Mapping[str, set[TopicPartition]]) -> Assignment:
    """The target assignment by the assignor ``name`` (one of ``ASSIGNORS``)."""
    try:
        fn = ASSIGNORS[name]
    except KeyError:
        raise InvalidOptionError(f"unknown assignor {name!r}: use one of "
                                 f"{', '.join(sorted(ASSIGNORS))}") from None
    return fn(members, partitions, previous)
