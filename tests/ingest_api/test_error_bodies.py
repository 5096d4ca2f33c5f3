"""Every error body says whether trying again can succeed (``retriable``), from the one
error table, next to ``error_code``, ``error`` and ``message``."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable

import httpx

from ingest_api.http.errors import ApiError, error_body
from log_tables import errors as e
from tests.ingest_api.helpers import string
from tests.server import ServerProcess


def _body(r: httpx.Response, status: int, code: int, name: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert (body["error_code"], body["error"]) == (code, name), body
    assert isinstance(body["message"], str) and body["message"]
    return dict(body)


def test_error_bodies_of_a_real_server_carry_retriable(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(1, max_message_bytes="4096")
    body = _body(client.get("/topics/nope-nope"), 404, 40403, "unknown_topic_or_partition")
    assert body["retriable"] is False
    body = _body(client.post(f"/topics/{topic}/records", json={"value": string("x" * 10_000)}),
                 413, 41301, "record_too_large")
    assert body["retriable"] is False
    body = _body(client.post(f"/topics/{topic}/records", content=b"{",
                             headers={"content-type": "application/json"}),
                 400, 400, "malformed_json")
    assert body["retriable"] is False
    body = _body(client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 99}),
                 416, 41601, "offset_out_of_range")
    assert (body["retriable"], body["log_start_offset"], body["high_watermark"]) == (False, 0, 0)
    body = _body(client.get("/no-such-endpoint"), 404, 404, "http_error")
    assert body["retriable"] is False
    failures = client.post(f"/topics/{topic}/records:batch", json={"entries": [
        {"id": "a", "value": string("x" * 10_000)}]}).json()["failures"]
    assert [(f["id"], f["error"], f["retriable"]) for f in failures] == [
        ("a", "record_too_large", False)]


def test_a_malformed_request_head_is_answered_with_retriable(server: ServerProcess) -> None:
    """The protocol's own answers (before the app) carry the flag too."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert httpx.Response(400, content=payload).json()["retriable"] is False


def test_busy_unavailable_and_a_storage_failure_are_retriable() -> None:
    cases: list[tuple[BaseException, int, int, str, bool]] = [
        (e.QueueFullError("full"), 429, 42901, "queue_full", True),
        (ApiError(429, "busy", name="too_many_requests"), 429, 429, "too_many_requests", True),
        (e.LogClosedError("closed"), 503, 50301, "log_closed", True),
        (e.StorageError("disk full", errno.ENOSPC), 507, 50701, "storage_error", True),
        (e.StorageError("i/o", errno.EIO), 500, 50001, "storage_error", True),
        (e.CorruptRecordError("f", 0, "crc"), 410, 41001, "corrupt_record", False),
        (e.UnknownGroupError("g"), 404, 40405, "group_id_not_found", False),
        (ApiError(403, "no", 40301, "authorization_failed"), 403, 40301,
         "authorization_failed", False),
        (ValueError("a bug"), 500, 50000, "internal_error", False),
    ]
    for exc, status, code, name, retriable in cases:
        got_status, body = error_body(exc)
        assert (got_status, body["error_code"], body["error"], body["retriable"]) == (
            status, code, name, retriable), exc
    assert isinstance(ApiError(400, "x"), e.LakelogError)  # one root
