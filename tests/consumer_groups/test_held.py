"""Offsets held at a group's coordinator for transactions coordinated elsewhere
(``consumer_groups.held``): each transaction's until it is released, or until twice its
timeout at most."""

from __future__ import annotations

from consumer_groups.held import HeldOffsets
from log_tables.clock import ManualClock


def test_held_offsets_last_until_released_or_their_transactions_timeout() -> None:
    clock = ManualClock()
    held = HeldOffsets(clock)
    held.hold("g", "t1", {("a", 0)}, timeout_ms=1000)
    held.hold("g", "t1", {("a", 1)}, timeout_ms=1000)  # a second add: both held
    held.hold("g", "t2", {("b", 0)}, timeout_ms=5000)
    held.hold("other", "t1", {("a", 0)}, timeout_ms=1000)
    assert held.partitions("g") == {("a", 0), ("a", 1), ("b", 0)}
    held.release("g", "t2")
    assert held.partitions("g") == {("a", 0), ("a", 1)}
    assert held.partitions("other") == {("a", 0)}
    clock.advance(1000)  # t1's timeout: still held (a decided commit may be finishing)
    assert held.partitions("g") == {("a", 0), ("a", 1)}
    clock.advance(1000)  # twice its timeout: aborted long since, if its release was lost
    assert held.partitions("g") == set()
    assert held.partitions("nobody") == set()
    held.release("g", "t1")  # a release after the timeout: nothing to do
