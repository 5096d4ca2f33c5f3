"""The Consumer while its server is SIGKILLed and started again: polls return nothing
rather than raising, the member joins again (the server does not keep members over a
restart), and every record is read; a lakelog error only once the outage outlasts
``default_api_timeout_ms``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from lakelog.client import Consumer, LakelogTimeoutError, Producer
from tests.lakelog.helpers import make_topic
from tests.server import ServerProcess

pytestmark = pytest.mark.slow


def _produce(server: ServerProcess, topic: str, items: list[str]) -> None:
    with Producer(server.url) as producer:
        futures = [producer.send(topic, v, key=v) for v in items]
        producer.flush()
        for f in futures:
            f.result(timeout=60)


def test_a_consumer_rides_through_a_server_sigkill_and_joins_again(
        server: ServerProcess) -> None:
    make_topic(server, "t", 2)
    first = [f"a{i}" for i in range(100)]
    _produce(server, "t", first)
    got: list[str] = []
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", format="STRING",
                  session_timeout_ms=5000) as consumer:
        deadline = time.monotonic() + 60
        while len(got) < 100:
            assert time.monotonic() < deadline, len(got)
            got += [r.value for r in consumer.poll(timeout_s=0.5)]
        consumer.commit()
        member = consumer.member_id
        server.kill()
        for _ in range(3):  # down: no records, and no exception
            assert consumer.poll(timeout_s=0.3) == []
        server.start()
        second = [f"b{i}" for i in range(100)]
        _produce(server, "t", second)
        deadline = time.monotonic() + 60
        while not set(first + second) <= set(got):
            assert time.monotonic() < deadline, len(set(first + second) - set(got))
            got += [r.value for r in consumer.poll(timeout_s=0.5)]
        assert consumer.rejoins >= 1 and consumer.member_id != member
        consumer.commit()
    with server.client() as c:
        described = c.get("/consumer-groups/g").json()
    assert described["members"] == [] and all(o["lag"] == 0 for o in described["offsets"])


def test_a_consumer_raises_a_lakelog_error_once_the_server_stays_away(
        tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    make_topic(server, "t", 1)
    consumer = Consumer(server.url, "g", ["t"], format="STRING", session_timeout_ms=5000,
                        default_api_timeout_ms=2000, request_timeout_ms=1000)
    try:
        assert consumer.poll(timeout_s=0.2) == []
        server.kill()
        deadline = time.monotonic() + 60
        with pytest.raises(LakelogTimeoutError) as raised:
            while time.monotonic() < deadline:
                assert consumer.poll(timeout_s=0.5) == []
        message = str(raised.value)
        assert server.url in message and "default_api_timeout_ms=2000" in message
        assert "poll" in message and "Connect" in message
        with pytest.raises(LakelogTimeoutError, match="POST /consumer-groups/g/offsets"):
            consumer.commit({next(iter(consumer.assignment())): 0})
    finally:
        consumer.close()
    with pytest.raises(LakelogTimeoutError, match="POST /consumer-groups/g/members"):
        Consumer(server.url, "g", ["t"], default_api_timeout_ms=1000)


class _LoseOnce(httpx.BaseTransport):
    """Injected faults (a lost answer cannot be had on demand): the first poll reaches the
    server, which moves its positions, but its answer is lost; the client's first attempt
    to move the positions back does not get through either."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.lost_answer = self.failed_resync = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/records") and not self.lost_answer:
            r = self.inner.handle_request(request)
            r.read()
            r.close()
            if r.status_code == 200 and int(r.headers.get("lakelog-record-count", 0)):
                self.lost_answer = True
                raise httpx.ReadError("injected: the answer was lost", request=request)
            return r
        if path.endswith("/positions") and self.lost_answer and not self.failed_resync:
            self.failed_resync = True
            raise httpx.ConnectError("injected: the resync did not get through",
                                     request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_lost_poll_answer_is_read_again_even_when_the_first_resync_fails(
        server: ServerProcess) -> None:
    make_topic(server, "t", 1)
    _produce(server, "t", [f"v{i}" for i in range(100)])
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", format="STRING",
                  session_timeout_ms=5000) as consumer:
        faults = _LoseOnce(consumer._http._transport)
        consumer._http._transport = faults
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < 100:
            assert time.monotonic() < deadline, len(got)
            got += [r.value for r in consumer.poll(timeout_s=0.5, max_records=30)]
        assert faults.lost_answer and faults.failed_resync
        assert got == [f"v{i}" for i in range(100)]


def test_a_consumer_keeps_its_membership_through_a_pause_shorter_than_its_session(
        server: ServerProcess) -> None:
    """The server is paused (SIGSTOP) for 2 s, well within the 20 s session: polls and
    heartbeats time out meanwhile, then go on as the same member (no rejoin)."""
    assert server.proc is not None
    make_topic(server, "t", 1)
    _produce(server, "t", [f"a{i}" for i in range(50)])
    with Consumer(server.url, "g", ["t"], auto_offset_reset="earliest", format="STRING",
                  session_timeout_ms=20_000, request_timeout_ms=500) as consumer:
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < 50:
            assert time.monotonic() < deadline, len(got)
            got += [r.value for r in consumer.poll(timeout_s=0.5)]
        member, epoch = consumer.member_id, consumer.member_epoch
        server.proc.send_signal(signal.SIGSTOP)
        try:
            paused_until = time.monotonic() + 2  # the injected pause
            while time.monotonic() < paused_until:
                assert consumer.poll(timeout_s=0.3) == []
        finally:
            server.proc.send_signal(signal.SIGCONT)
        _produce(server, "t", [f"b{i}" for i in range(50)])
        deadline = time.monotonic() + 60
        while len(got) < 100:
            assert time.monotonic() < deadline, len(got)
            got += [r.value for r in consumer.poll(timeout_s=0.5)]
        assert (consumer.member_id, consumer.member_epoch, consumer.rejoins) == (member, epoch, 0)
        assert got == [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)]
