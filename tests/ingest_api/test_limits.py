"""Bounded queues and in-flight bytes answer 429 with Retry-After instead of growing."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx
import pytest

from ingest_api.http.body import InFlightBytes
from ingest_api.http.errors import ApiError
from tests.ingest_api.helpers import fetch_all, string
from tests.server import ServerProcess


def test_in_flight_bytes_are_bounded() -> None:
    limit = InFlightBytes(1000)
    with limit.reserve(600):
        with pytest.raises(ApiError) as err, limit.reserve(600):
            pass
        assert err.value.status == 429 and err.value.retry_after_s == 1
        with limit.reserve(400):
            assert limit.current == 1000
    assert limit.current == 0
    with limit.reserve(5000):  # one request alone may be larger than the bound
        assert limit.current == 5000


@pytest.mark.slow
def test_full_partition_queue_is_429(spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(max_queued_records="1000", max_batch_entries="5000")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "q", "partitions_count": 1})
        entries = [{"id": str(i), "partition_id": 0, "value": string("v")} for i in range(1500)]
        r = client.post("/topics/q/records:batch", json={"entries": entries})
        assert r.status_code == 207
        failures = r.json()["failures"]
        assert failures and {f["error_code"] for f in failures} == {42901}
        assert "waiting to be appended" in failures[0]["message"]
        assert len(fetch_all(client, "q", 0)) == len(r.json()["successes"])
        single = client.post("/topics/q/records", json={"value": string("ok")})
        assert single.status_code == 200  # the queue drains; the partition goes on


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_the_server_cleanly(spawn_server: Callable[..., ServerProcess],
                                         sig: signal.Signals) -> None:
    server = spawn_server()
    with server.client() as client:
        client.post("/topics", json={"topic_name": "s", "partitions_count": 2})
        client.post("/topics/s/records", params={"acks": "1"}, json={"value": string("kept")})
    server.stop(sig=sig)  # asserts every partition wrote its clean-shutdown marker
    server.start()
    with server.client() as client:
        assert [r["value"]["data"] for p in (0, 1) for r in fetch_all(client, "s", p, fmt="STRING")] == ["kept"]


def test_huge_heads_slow_clients_and_too_many_connections_are_bounded(
        spawn_server: Callable[..., ServerProcess]) -> None:
    import concurrent.futures
    import socket

    server = spawn_server(request_head_timeout_ms="1000", limit_concurrency="8")

    def raw(payload: bytes, pause_s: float = 0.0) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            try:
                s.sendall(payload)
                time.sleep(pause_s)
                return s.recv(4096)
            except (BrokenPipeError, ConnectionResetError):
                return s.recv(4096)

    ok = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Small: " + b"a" * 10_000 + b"\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200")
    # A 10 MB header is refused once the head passes 64 KiB, not buffered whole.
    big = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10_000_000 + b"\r\n\r\n")
    assert big.startswith(b"HTTP/1.1 431") and b"request_header_too_large" in big
    # Slowloris: half a head, then nothing: 408 after the head timeout, connection closed.
    started = time.monotonic()
    slow = raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a", pause_s=0)
    assert slow.startswith(b"HTTP/1.1 408") and b"request_timeout" in slow
    assert b'"retriable":true' in slow  # nothing was done: a client may send it again
    assert 0.8 < time.monotonic() - started < 5
    # A connection that sends nothing at all is closed too.
    assert raw(b"").startswith(b"HTTP/1.1 408")
    # More concurrent requests than limit_concurrency: the rest get 503 at once.
    with server.client() as c:
        c.post("/topics", json={"topic_name": "t", "partitions_count": 1}).raise_for_status()

    def long_poll(_: int) -> int:
        return httpx.get(f"{server.url}/v3/clusters/lakelog/topics/t/partitions/0/records"
                         "?offset=0&timeout_ms=2000", timeout=10).status_code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(long_poll, range(20)))
    assert statuses.count(503) >= 10 and statuses.count(200) >= 1, statuses
    assert httpx.get(server.url + "/healthz").status_code == 200  # and it still serves


def test_stalled_request_bodies_are_timed_out(spawn_server: Callable[..., ServerProcess]) -> None:
    import socket

    server = spawn_server(request_body_idle_timeout_ms="1000")
    with server.client() as c:
        c.post("/topics", json={"topic_name": "b", "partitions_count": 1}).raise_for_status()
    path = "/v3/clusters/lakelog/topics/b/records"
    record = b'{"value": {"type": "STRING", "data": "r"}}'

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", server.port), timeout=10)

    # Content-Length 100, ten bytes, then silence: 408 after the idle timeout.
    with connect() as s:
        started = time.monotonic()
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + record[:10])
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408") and b"no request body bytes" in answer
        assert 0.8 < time.monotonic() - started < 5
        assert s.recv(4096) == b""  # and closed

    # A streaming produce that stalls after its first record: that record is
    # acknowledged, then the connection is closed (a response had started).
    with connect() as s:
        s.sendall(b"POST " + path.encode() + b"?acks=all HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + b"%x\r\n%s\r\n" % (len(record), record))
        received = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            part = s.recv(4096)
            if not part:
                break
            received += part
        assert time.monotonic() < deadline, "the stalled stream was never closed"
        assert b'"offset":0' in received.replace(b" ", b""), received

    # A body that arrives slowly but never stalls as long as the timeout is served.
    with connect() as s:
        body = b"\n".join([record] * 5)
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), len(body) // 4 + 1):
            s.sendall(body[i:i + len(body) // 4 + 1])
            time.sleep(0.5)
        answer = b""
        while part := s.recv(4096):
            answer += part
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert answer.count(b'"offset"') == 5
    with server.client() as c:
        assert [r["value"]["data"] for r in fetch_all(c, "b", 0, fmt="STRING")] == ["r"] * 6
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert "Traceback" not in server.log_path.read_text(errors="replace")
