"""A consumer commits the position of every partition assigned to it, as Kafka's does,
a partition that returned nothing too (issue 35): a group restarted with
``auto_offset_reset=latest`` then reads what came to a quiet partition meanwhile."""

from __future__ import annotations

import time

import pytest

from lakelog.client import Consumer, Producer, TopicPartition
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _produce(server: ServerProcess, topic: str, partition: int, n: int, tag: str) -> None:
    with Producer(server.url) as producer:
        futures = [producer.send(topic, f"{tag}{i}", partition=partition) for i in range(n)]
        producer.flush()
        for f in futures:
            f.result(timeout=60)


def _poll_until(consumer: Consumer, done: object, what: str) -> list[tuple[int, str]]:
    got: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while not done(got):  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: got {got}"
        got += [(r.partition, r.value) for r in consumer.poll(timeout_s=0.5)]
    return got


@pytest.mark.parametrize("how", ["commit", "auto-commit"])
def test_a_quiet_partitions_position_is_committed_and_a_latest_restart_reads_it(
        server: ServerProcess, how: str) -> None:
    topic, group = f"quiet-{how}", f"g-{how}"
    make_topic(server, topic, 2)
    quiet = TopicPartition(topic, 1)
    with Consumer(server.url, group, [topic], auto_offset_reset="latest", format="STRING",
                  session_timeout_ms=6_000, enable_auto_commit=how == "auto-commit",
                  auto_commit_interval_ms=100) as consumer:
        # Until the first poll placed both positions at the (empty) ends.
        _poll_until(consumer, lambda _: consumer.position(quiet) == 0, "a position in p1")
        _produce(server, topic, 0, 3, "busy")
        _poll_until(consumer, lambda got: len(got) == 3, "p0's records")
        if how == "commit":
            consumer.commit()
    with server.client() as c:
        committed = {o["partition_id"]: o["offset"]
                     for o in c.get(f"/consumer-groups/{group}/offsets").json()["offsets"]}
    assert committed == {0: 3, 1: 0}
    with server.client() as c:  # the JSON poll carries the positions too
        r = c.post(f"/consumer-groups/{group}-json/members", json={"topics": [topic]})
        member = r.json()["member_id"]
        r = c.get(f"/consumer-groups/{group}-json/members/{member}/records")
        topic_id = c.get(f"/topics/{topic}").json()["topic_id"]
        assert r.json()["positions"] == [
            {"topic_name": topic, "partition_id": p, "offset": o, "topic_id": topic_id}
            for p, o in ((0, 3), (1, 0))]
    _produce(server, topic, 1, 4, "meanwhile")  # to the quiet partition, no member there
    with Consumer(server.url, group, [topic], auto_offset_reset="latest", format="STRING",
                  session_timeout_ms=6_000) as consumer:
        got = _poll_until(consumer, lambda got: len(got) >= 4, "what came meanwhile")
    assert got == [(1, f"meanwhile{i}") for i in range(4)]


EXITING = """
import sys, time
from lakelog.client import Consumer
consumer = Consumer(sys.argv[1], "exiting", ["quiet-exit"], auto_offset_reset="earliest",
                    fetch_max_wait_ms=20_000, session_timeout_ms=30_000)
deadline = time.monotonic() + 60
while not consumer.assignment() and time.monotonic() < deadline:
    consumer.poll(timeout_s=0.5)
consumer.poll(timeout_s=0.5)  # a long poll of up to 20 s is now in flight
print(time.monotonic(), flush=True)  # and the program ends without closing it
"""


def test_a_program_ends_without_waiting_for_a_long_poll_in_flight(
        server: ServerProcess) -> None:
    """A program ends with a consumer's long poll in flight (fetch_max_wait_ms 20 s,
    nothing to read): it ends at once, not when the poll would (issue 35: ``lakelog
    consume`` spent half a second of every run waiting for one at exit)."""
    import subprocess
    import sys

    make_topic(server, "quiet-exit", 1)
    out = subprocess.run([sys.executable, "-c", EXITING, server.url], capture_output=True,
                         text=True, timeout=120)
    ended = time.monotonic()
    assert out.returncode == 0, out.stderr
    closed = float(out.stdout.strip())
    assert ended - closed < 5, f"the program took {ended - closed:.1f} s to end after its last poll"


def test_a_member_of_a_topic_deleted_and_made_again_reads_the_new_one_from_its_start(
        server: ServerProcess) -> None:
    """A live consumer read 5 records of a topic and committed; the topic is deleted and
    made again under its name while the consumer stays (its assignment looks the same)
    and 8 records come. It reads all 8 and commits 8, and nothing of the old topic's
    positions reaches the new one (found by review: it got the last 3 and committed 8
    on top of the old position)."""
    make_topic(server, "remade", 1)
    _produce(server, "remade", 0, 5, "old")
    with Consumer(server.url, "stays", ["remade"], auto_offset_reset="earliest",
                  format="STRING", session_timeout_ms=30_000, enable_auto_commit=True,
                  auto_commit_interval_ms=100) as consumer:
        got = _poll_until(consumer, lambda got: len(got) == 5, "the old topic")
        consumer.commit()
        with server.client() as c:
            old_id = c.get("/topics/remade").json()["topic_id"]
            assert c.delete("/topics/remade").status_code == 204
            assert c.post("/topics", json={"topic_name": "remade"}).status_code == 201
            assert c.get("/consumer-groups/stays/offsets").json()["offsets"] == []
        _produce(server, "remade", 0, 8, "new")
        got = _poll_until(consumer, lambda got: len(got) >= 8, "the new topic")
        assert got == [(0, f"new{i}") for i in range(8)]
        consumer.commit()
        with server.client() as c:
            offsets = c.get("/consumer-groups/stays/offsets").json()["offsets"]
            assert [o["offset"] for o in offsets] == [8]
            # An offset given with the old topic's id is refused.
            r = c.post("/consumer-groups/stays/offsets", json={
                "member_id": consumer.member_id, "member_epoch": consumer.member_epoch,
                "offsets": [{"topic_name": "remade", "partition_id": 0, "offset": 5,
                             "topic_id": old_id}]})
            assert r.status_code == 404 and r.json()["error"] == "unknown_topic_id", r.text
