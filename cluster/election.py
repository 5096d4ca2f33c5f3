"""What the controller makes of one partition's state: Kafka's leader election rules
(``PartitionLeaderElectionAlgorithms``) and ISR removal in ZooKeeper mode, as pure
functions of the state, the replicas and the live brokers (cluster.controller writes
what they return).

A broker is *usable* when it is registered and did not restart since the controller
last looked (a new registration, "bounced": its log may miss what it had not flushed,
and it has to catch up like any returning follower).

``after_brokers_changed`` (the controller's reconcile, step 2):

- the leader is usable: the ISR loses its members that are not (a follower whose
  session ended, or that restarted), leader and leader epoch unchanged: only a change
  of leader raises the epoch;
- otherwise a new leader: the first usable ISR member in replica order, the ISR
  keeping its usable members (Kafka's offline partition election, clean);
- no usable ISR member but a bounced one: it leads again, alone in the ISR. Its log is
  the most complete there is (every other ISR member is gone);
- none at all: with ``unclean.leader.election.enable``, the first live replica leads
  with ISR = [it] (acknowledged records it lacks are lost, as in Kafka); else the
  partition is offline (leader -1) with its ISR kept, so that a member leads again as
  soon as it returns. The ISR is never made empty. When all its members went at once
  it is kept whole: the ZooKeeper ISR is what acks=all waited for, so each of them holds
  every acknowledged record;

``after_brokers_changed_recordless`` (the same step for a partition that holds no
records, a coordinator slot whose state is kept elsewhere): every live replica is in
sync, a returning one included; the leader stays while it is usable, else the first
usable replica (or a bounced one) leads at leader epoch + 1; none live: offline.

``to_preferred`` (preferred leader election): the first replica leads again when it is
live and in the ISR, leader epoch + 1, ISR unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import NamedTuple

from cluster.model import NO_LEADER, PartitionState


class Change(NamedTuple):
    """A partition's next state and why: "isr" (members removed, same leader and epoch),
    "leader" (a clean election or offline), "unclean" (an out-of-sync replica leads)."""

    state: PartitionState
    kind: str


def after_brokers_changed(state: PartitionState, replicas: Sequence[int],
                          live: Collection[int], bounced: Collection[int], unclean: bool,
                          controller_epoch: int) -> Change | None:
    """The state step 2 writes for a partition given the live and bounced brokers (None:
    nothing to change)."""
    def usable(b: int) -> bool:
        return b in live and b not in bounced

    in_sync = [b for b in state.isr if usable(b)]
    if state.leader != NO_LEADER and usable(state.leader):
        if in_sync == state.isr:
            return None
        return Change(PartitionState(state.leader, state.leader_epoch, in_sync,
                                     controller_epoch), "isr")
    epoch = state.leader_epoch + 1
    clean = [b for b in replicas if b in in_sync]
    if clean:
        return Change(PartitionState(clean[0], epoch, in_sync, controller_epoch), "leader")
    back = [b for b in replicas if b in state.isr and b in live]
    if back:
        return Change(PartitionState(back[0], epoch, [back[0]], controller_epoch), "leader")
    anyone = [b for b in replicas if b in live]
    if unclean and anyone:
        return Change(PartitionState(anyone[0], epoch, [anyone[0]], controller_epoch),
                      "unclean")
    if state.leader == NO_LEADER:
        return None  # still offline
    return Change(PartitionState(NO_LEADER, epoch, list(state.isr), controller_epoch), "leader")


def after_brokers_changed_recordless(state: PartitionState, replicas: Sequence[int],
                                     live: Collection[int], bounced: Collection[int],
                                     controller_epoch: int) -> Change | None:
    """The state step 2 writes for a partition without records (None: nothing to change)."""
    alive = [b for b in replicas if b in live]
    usable = [b for b in alive if b not in bounced]
    if state.leader != NO_LEADER and state.leader in usable:
        if alive == state.isr:
            return None
        return Change(PartitionState(state.leader, state.leader_epoch, alive,
                                     controller_epoch), "isr")
    if alive:
        leader = (usable or alive)[0]
        return Change(PartitionState(leader, state.leader_epoch + 1, alive, controller_epoch),
                      "leader")
    if state.leader == NO_LEADER:
        return None
    return Change(PartitionState(NO_LEADER, state.leader_epoch + 1, list(state.isr),
                                 controller_epoch), "leader")


def to_preferred(state: PartitionState, replicas: Sequence[int], live: Collection[int],
                 controller_epoch: int) -> PartitionState | None:
    """The state a preferred leader election writes (None: the first replica leads
    already, or cannot: not live, or not in sync)."""
    preferred = replicas[0]
    if state.leader == preferred or preferred not in live or preferred not in state.isr:
        return None
    return PartitionState(preferred, state.leader_epoch + 1, list(state.isr), controller_epoch)


def imbalanced(placements: dict[tuple[str, int], tuple[Sequence[int], PartitionState]],
               percentage: int) -> list[tuple[str, int]]:
    """Kafka's leader imbalance check: per broker, the partitions it is the preferred
    replica of and does not lead; where they are more than ``percentage`` % of its
    preferred ones, all of them (to move back), in order."""
    preferred_of: dict[int, list[tuple[tuple[str, int], bool]]] = {}
    for key, (replicas, state) in sorted(placements.items()):
        if replicas:
            preferred_of.setdefault(replicas[0], []).append((key, state.leader == replicas[0]))
    out: list[tuple[str, int]] = []
    for _broker, partitions in sorted(preferred_of.items()):
        elsewhere = [key for key, led in partitions if not led]
        if len(elsewhere) * 100 > percentage * len(partitions):
            out.extend(elsewhere)
    return sorted(out)
