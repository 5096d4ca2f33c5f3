"""``log_tables.spark.leaders``: what the driver asks the brokers before a read plans,
and every way that asking can fail. The brokers here are stand-ins on real sockets
(``Stub``): the statuses they answer (a 503 on demand, a 403 for one topic) cannot be
had from a real broker at will; the real cluster is ``tests/cluster/test_spark_tails.py``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from log_tables.errors import BrokerNotAvailableError
from log_tables.spark.leaders import LeaderBound, leader_bounds, leader_offset_for_timestamp
from log_tables.spark.tails import CLUSTER, TailSource

DEAD = "http://127.0.0.1:1"
"""Where nothing listens: every connection is refused."""
OFFSETS = f"{CLUSTER}/topics/t/partitions/0/offsets"
BROKERS = f"{CLUSTER}/brokers"
BROKER_2 = {"broker_id": 2, "host": "127.0.0.1", "port": 9002}


def partitions(topic: str) -> str:
    return f"{CLUSTER}/topics/{topic}/partitions"


def led_by_2(high_watermark: int) -> dict[str, Any]:
    """A partitions answer: partition 0, led by broker 2."""
    return {"data": [{"partition_id": 0, "leader_id": 2, "log_start_offset": 0,
                      "high_watermark": high_watermark, "size_bytes": 10 * high_watermark}]}


class Stub:
    """A broker stand-in: each path answers its queued (status, body) in turn, the last
    one again (404 for a path without answers); every request's path and headers kept."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                stub.requests.append((path, dict(self.headers)))
                queue = stub.answers.get(path) or [(404, {"message": "no such path"})]
                status, body = queue.pop(0) if len(queue) > 1 else queue[0]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    s.thread.start()
    yield s
    s.server.shutdown()
    s.server.server_close()
    s.thread.join(5)


def test_an_offset_for_a_timestamp_is_asked_again_through_retriable_answers(
        stub: Stub) -> None:
    stub.answers[OFFSETS] = [(503, {"message": "loading"}), (429, {"message": "slow down"}),
                             (421, {"message": "not the leader"}), (200, {"offset": 42})]
    leader = LeaderBound(2, stub.url, 0, 100, 0)
    assert leader_offset_for_timestamp(TailSource(stub.url), leader, "t", 0, 1000) == 42
    assert stub.paths() == [OFFSETS] * 4


def test_a_leader_that_does_not_answer_is_asked_through_the_data_directory_s_broker(
        stub: Stub) -> None:
    stub.answers[OFFSETS] = [(200, {"offset": 7})]
    leader = LeaderBound(2, DEAD, 0, 100, 0)
    assert leader_offset_for_timestamp(TailSource(stub.url), leader, "t", 0, 1000) == 7


def test_an_offset_no_broker_answers_for_is_lakelog_s_broker_not_available(
        stub: Stub) -> None:
    stub.answers[OFFSETS] = [(503, {"message": "loading"})]
    for source in (TailSource(DEAD), TailSource(stub.url)):
        with pytest.raises(BrokerNotAvailableError,
                           match=r"could not be asked of its leader within 0\.3s") as caught:
            leader_offset_for_timestamp(source, LeaderBound(2, DEAD, 0, 100, 0), "t", 0, 1000,
                                        retry_s=0.3)
        assert caught.value.retriable


def test_a_topic_the_key_may_not_describe_is_read_locally_and_the_others_from_leaders(
        stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    """A LAKELOG_API_KEY (which outranks the broker's key) that may describe one topic of
    two: the other's leaders are unknown (read locally, with a warning), not a failure of
    every topic's read; a key the broker does not know at all leaves the whole read local."""
    stub.answers[BROKERS] = [(200, {"data": [BROKER_2]})]
    stub.answers[partitions("hers")] = [(200, led_by_2(9))]
    stub.answers[partitions("not-hers")] = [
        (403, {"message": "principal 'alice' may not describe topic 'not-hers'"})]
    stub.answers[partitions("gone-wrong")] = [(500, {"message": "boom"})]
    source = TailSource(stub.url, api_key="alice:pw")
    with caplog.at_level(logging.WARNING):
        found = leader_bounds(source, ["hers", "not-hers", "gone-wrong"])
    assert found == {"hers": {0: LeaderBound(2, "http://127.0.0.1:9002", 0, 9, 90)}}
    assert "answered 403 (principal 'alice' may not describe topic 'not-hers'): reading the " \
        "tails of partitions led by other brokers needs a key that may read them; lakelog " \
        "uses LAKELOG_API_KEY, else the broker's own key" in caplog.text
    assert "held here and the Delta tier, for topic not-hers" in caplog.text
    assert "answered 500 (boom): reading only the partitions' tails held here and the Delta " \
        "tier, for topic gone-wrong" in caplog.text
    caplog.clear()
    stub.answers[BROKERS] = [(401, {"message": "unknown API key"})]
    with caplog.at_level(logging.WARNING):
        assert leader_bounds(source, ["hers"]) is None
    assert "answered 401 (unknown API key)" in caplog.text


def test_a_broker_of_another_cluster_gets_no_key_and_leaves_the_read_local(
        stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    """cluster.json's address answered by a broker of another cluster, or by a server on
    its own (no cluster): asked its /healthz without the key, and nothing more."""
    stub.answers[BROKERS] = [(200, {"data": [BROKER_2]})]
    stub.answers[partitions("t")] = [(200, led_by_2(9))]
    source = TailSource(stub.url, api_key="alice:pw", cluster_id="c1")
    for health in ({"status": "ok", "cluster_id": "c2"}, {"status": "ok"}):
        stub.answers["/healthz"] = [(200, health)]
        stub.requests.clear()
        with caplog.at_level(logging.WARNING):
            assert leader_bounds(source, ["t"]) is None
        assert stub.paths() == ["/healthz"]
        assert "authorization" not in {h.lower() for h in stub.requests[0][1]}
    assert f"{stub.url} answers for cluster c2 (/healthz: 200), not for this data " \
        "directory's cluster c1 (cluster.json)" in caplog.text
    assert f"{stub.url} answers for no cluster" in caplog.text
    stub.answers["/healthz"] = [(200, {"status": "ok", "cluster_id": "c1"})]
    assert leader_bounds(source, ["t"]) == {
        "t": {0: LeaderBound(2, "http://127.0.0.1:9002", 0, 9, 90)}}
