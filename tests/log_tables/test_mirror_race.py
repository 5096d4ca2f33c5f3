"""A topic being mirrored from ZooKeeper is in the registry before its logs are open.

Found in CI: ``GET /topics/t/partitions`` right after another broker created ``t`` answered
500 (a KeyError) while this broker's watch was still opening the partitions' logs. The
slow open is held here with an event around the real ``_open_partition``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from log_tables.errors import UnknownPartitionError
from log_tables.hot.log_manager import LogManager
from log_tables.hot.partition_log import PartitionLog
from log_tables.registry import TopicMetadata

DEADLINE = 30.0


def _hold_second_open(manager: LogManager, monkeypatch: pytest.MonkeyPatch
                      ) -> tuple[threading.Event, threading.Event]:
    """(reached, release): the mirror blocks opening partition 1 until ``release``."""
    reached, release = threading.Event(), threading.Event()
    real: Callable[[TopicMetadata, int], PartitionLog] = manager._open_partition

    def slow_open(topic: TopicMetadata, partition: int) -> PartitionLog:
        if partition == 1:
            reached.set()
            assert release.wait(DEADLINE)
        return real(topic, partition)

    monkeypatch.setattr(manager, "_open_partition", slow_open)
    return reached, release


def _mirror_in_background(manager: LogManager, topic: TopicMetadata) -> threading.Thread:
    t = threading.Thread(target=manager.mirror_topic, args=(topic,), daemon=True)
    t.start()
    return t


def _answer_in_background(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as e:  # the failure itself is what the test looks at
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("lookup", ["partitions", "log"])
def test_lookups_during_a_mirror_wait_for_the_logs_instead_of_failing(
        manager: LogManager, monkeypatch: pytest.MonkeyPatch, lookup: str) -> None:
    topic = TopicMetadata("mirrored", "id-1", 3)
    reached, release = _hold_second_open(manager, monkeypatch)
    mirror = _mirror_in_background(manager, topic)
    assert reached.wait(DEADLINE)
    assert "mirrored" in manager.registry  # registered, partition 1 and 2 not open yet
    call = ((lambda: manager.partitions("mirrored")) if lookup == "partitions"
            else (lambda: manager.log("mirrored", 2)))
    asker, out = _answer_in_background(call)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline and not out:  # it must still be waiting
        asker.join(0.05)
    assert out == [], f"answered before the logs were open: {out!r}"
    release.set()
    asker.join(DEADLINE)
    mirror.join(DEADLINE)
    assert len(out) == 1 and not isinstance(out[0], Exception), out
    if lookup == "partitions":
        assert [p.name for p in out[0]] == ["mirrored-0", "mirrored-1", "mirrored-2"]  # type: ignore[attr-defined]
    else:
        assert out[0].name == "mirrored-2"  # type: ignore[attr-defined]


def test_a_partition_beyond_the_topic_is_still_unknown(manager: LogManager) -> None:
    manager.mirror_topic(TopicMetadata("mirrored", "id-1", 2))
    with pytest.raises(UnknownPartitionError):
        manager.log("mirrored", 5)


def test_a_partition_beyond_the_topic_does_not_wait_for_a_mirror(
        manager: LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    reached, release = _hold_second_open(manager, monkeypatch)
    mirror = _mirror_in_background(manager, TopicMetadata("mirrored", "id-1", 3))
    try:
        assert reached.wait(DEADLINE)
        asker, out = _answer_in_background(lambda: manager.log("mirrored", 5))
        asker.join(DEADLINE / 2)  # the mirror holds the lock until released
        assert len(out) == 1 and isinstance(out[0], UnknownPartitionError), out
    finally:
        release.set()
        mirror.join(DEADLINE)
