"""Byte-mutation fuzzing of every route that reads a body, path or query (hypothesis).

Each route's valid example body is mutated (bytes flipped, inserted, deleted, the
body truncated, invalid UTF-8 or JSON punctuation spliced in) and sent to a real
server over one keep-alive connection. No answer may be a 5xx, and after each the
same connection (same client port) must answer a plain request.

``LAKELOG_FUZZ_EXAMPLES`` sets the number of examples per test (default 300: a few
seconds each on a loaded two-core machine); raise it for a longer hunt.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ingest_api.helpers import b64
from tests.server import ServerProcess

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("LAKELOG_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
# Bytes that break UTF-8 (a lone continuation byte, a truncated sequence, an overlong
# encoding, a surrogate, a code point past U+10FFFF) or JSON's structure.
SPLICES = (b"\x80", b"\xaa", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\xff\xfe", b"\x00", b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\\u",
           b"\\ud800", b"1e999", b"-", b"null", b"99999999999999999999999")


@dataclass(frozen=True)
class Example:
    method: str
    path: str
    body: bytes
    stream: bool = False  # sent with chunked transfer encoding (no Content-Length)


@dataclass
class Fuzz:
    client: httpx.Client
    topic: str
    examples: list[Example]
    gets: list[str]
    sent: int = 0


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.fixture(scope="module")
def fuzz(server: ServerProcess) -> Iterator[Fuzz]:
    """A topic, a group with a member, a producer id, and one valid example body per route."""
    with server.client() as client:
        topic = f"fz-{uuid.uuid4().hex[:8]}"
        grown = f"{topic}-grown"  # partitions only grow: its own topic
        for name in (topic, grown):
            assert client.post("/topics", json={"topic_name": name,
                                                "partitions_count": 2}).status_code == 201
        pid = client.post("/producers", json={}).json()["producer_id"]
        group = f"{topic}-g"
        member = client.post(f"/consumer-groups/{group}/members",
                             json={"topics": [topic], "session_timeout_ms": 60_000}).json()
        mid, epoch = member["member_id"], member["member_epoch"]
        record = {"key": {"type": "STRING", "data": "k-1"},
                  "value": {"type": "JSON", "data": {"total": 12.5, "items": ["a", 1, None]}},
                  "headers": [{"name": "h", "value": b64(b"\x00\x01")}],
                  "timestamp": "2026-01-01T00:00:00Z"}
        t = f"/topics/{topic}"
        examples = [
            Example("POST", "/topics", _json({"topic_name": f"{topic}-new", "partitions_count": 1,
                                              "configs": [{"name": "retention.ms",
                                                           "value": "86400000"}]})),
            Example("POST", "/topics", _json({"topic_name": f"{topic}-dry", "partitions_count": 2,
                                              "validate_only": True})),
            Example("PATCH", f"/topics/{grown}", _json({"partitions_count": 3})),
            Example("PUT", f"{t}/configs/retention.ms", _json({"value": "86400000"})),
            Example("POST", f"{t}/configs:alter", _json({"data": [
                {"name": "segment.bytes", "value": "1048576"},
                {"name": "cleanup.policy", "operation": "DELETE"}]})),
            Example("POST", f"{t}/records?acks=1", _json(record)),
            Example("POST", f"{t}/records?acks=1", _json(record) + b"\n" + _json(
                {"partition_id": 1, "value": {"type": "BINARY", "data": b64(b"v")}})),
            Example("POST", f"{t}/records?acks=1", _json(record) + _json(record), stream=True),
            Example("POST", f"{t}/records:batch?acks=1", _json({"entries": [
                {"id": "a", **record},
                {"id": "b", "partition_id": 0, "value": {"type": "BINARY", "data": b64(b"x")},
                 "producer_id": pid, "producer_epoch": 0, "sequence": 0}]})),
            Example("POST", f"{t}/records:delete", _json({"partitions": [
                {"partition_id": 0, "offset": 0}]})),
            Example("POST", "/producers", _json({"producer_id": pid})),
            Example("POST", f"/consumer-groups/{group}-joins/members",
                    _json({"topics": [topic], "session_timeout_ms": 60_000,
                           "assignor": "range", "auto_offset_reset": "earliest"})),
            Example("POST", f"/consumer-groups/{group}/members/{mid}/heartbeat",
                    _json({"member_epoch": epoch,
                           "owned": [{"topic_name": topic, "partition_id": 0}]})),
            Example("POST", f"/consumer-groups/{group}/members/{mid}/positions",
                    _json({"positions": [{"topic_name": topic, "partition_id": 0,
                                          "offset": 0}]})),
            Example("POST", f"/consumer-groups/{group}/offsets",
                    _json({"member_id": mid, "member_epoch": epoch, "offsets": [
                        {"topic_name": topic, "partition_id": 0, "offset": 0,
                         "metadata": "m"}]})),
            Example("POST", f"/consumer-groups/{group}-idle/offsets:reset",
                    _json({"to": "datetime", "datetime": "2026-01-01T00:00:00Z",
                           "topics": [topic], "dry_run": True})),
            Example("POST", "/acls", _json({"principal": "alice", "resource_type": "topic",
                                            "operation": "produce", "resource_name": topic})),
            Example("POST", "/acls:delete", _json({"principal": "alice", "resource_type": "topic",
                                                   "operation": "produce"})),
            Example("POST", "/api-keys", _json({"principal": "alice"})),
        ]
        gets = [t, f"{t}/configs", f"{t}/configs/retention.ms", f"{t}/partitions",
                f"{t}/partitions/0", f"{t}/partitions/0/records?offset=0&max_records=5&format=JSON",
                f"{t}/partitions/1/offsets?spec=timestamp&timestamp=0",
                f"/consumer-groups/{group}", f"/consumer-groups/{group}/offsets",
                f"/consumer-groups/{group}/members/{mid}/records?max_records=1",
                "/jobs/runs?job=tier&limit=5", "/acls?principal=alice"]
        yield Fuzz(client, topic, examples, gets)


def _port(r: httpx.Response) -> int:
    port: int = r.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port


def _send(fz: Fuzz, method: str, path: str, body: bytes | None, stream: bool = False,
          headers: dict[str, bytes] | None = None) -> None:
    """One request, then a plain one: no 5xx, and the same connection answers both."""
    if stream and body is not None:
        chunks = [body[: len(body) // 2], body[len(body) // 2:]]
        content: Any = iter(chunks)
    else:
        content = body
    r = fz.client.request(method, path, content=content,
                          headers={"content-type": b"application/json", **(headers or {})})
    fz.sent += 1
    assert r.status_code < 500, (method, path, body, r.status_code, r.text)
    if r.headers.get("content-type", "").startswith("application/x-ndjson"):
        for line in r.text.splitlines():  # a stream's reports carry their own codes
            code = json.loads(line)["error_code"]
            # Confluent's codes: an HTTP status, or one with two digits more (42201).
            assert (code // 100 if code >= 1000 else code) < 500, (path, body, line)
    else:
        assert r.status_code < 400 or "error_code" in r.json(), r.text
    after = fz.client.get(f"/topics/{fz.topic}")
    assert after.status_code == 200
    assert _port(after) == _port(r), f"the connection closed after {method} {path} {body!r}"


@st.composite
def mutated(draw: st.DrawFn, body: bytes) -> bytes:
    out = bytearray(body)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "splice"]))
        at = draw(st.integers(0, len(out)))
        if op == "flip" and at < len(out):
            out[at] ^= draw(st.integers(1, 255))
        elif op == "insert":
            out[at:at] = bytes([draw(st.integers(0, 255))])
        elif op == "delete" and at < len(out):
            del out[at]
        elif op == "truncate":
            del out[at:]
        elif op == "splice":
            out[at:at] = draw(st.sampled_from(SPLICES))
    return bytes(out)


def test_examples_are_valid(fuzz: Fuzz) -> None:
    """The unmutated examples succeed (so the mutants start from a request that works)."""
    for ex in fuzz.examples:
        r = fuzz.client.request(ex.method, ex.path, content=iter([ex.body]) if ex.stream
                                else ex.body, headers={"content-type": "application/json"})
        ok = r.status_code < 300 or (ex.path in ("/acls", "/acls:delete", "/api-keys")
                                     and r.json()["error"] == "security_disabled")
        assert ok, (ex, r.status_code, r.text)


def test_mutated_bodies(fuzz: Fuzz) -> None:
    @SETTINGS
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        ex = data.draw(st.sampled_from(fuzz.examples))
        _send(fuzz, ex.method, ex.path, data.draw(mutated(ex.body)), ex.stream)

    fuzz.sent = 0
    run()
    assert fuzz.sent >= EXAMPLES


def test_mutated_paths_queries_and_headers(fuzz: Fuzz) -> None:
    """Path segments and query values with any bytes (percent-encoded, as HTTP requires),
    and odd header values."""
    # What HTTP lets a header value hold: visible ASCII, spaces and tabs inside, obs-text.
    header_value = st.lists(st.sampled_from([*range(0x21, 0x7F), *range(0x80, 0x100), 0x20,
                                             0x09]), max_size=40).map(
        lambda b: bytes(b).strip(b" \t"))

    @SETTINGS
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(fuzz.gets))
        base, _, query = path.partition("?")
        segments = base.split("/")
        where = data.draw(st.integers(1, len(segments) - 1))
        segments[where] = quote(data.draw(st.binary(max_size=12)), safe="")
        params = [p.split("=", 1) for p in query.split("&") if p]
        if params and data.draw(st.booleans()):
            i = data.draw(st.integers(0, len(params) - 1))
            params[i][1] = quote(data.draw(st.binary(max_size=12)), safe="")
        url = "/".join(segments) + ("?" + "&".join("=".join(p) for p in params) if params
                                    else "")
        headers = {"accept": data.draw(header_value),
                   "content-type": data.draw(header_value)}
        if data.draw(st.booleans()):
            headers["authorization"] = data.draw(header_value)
        _send(fuzz, "GET", url, None, headers=headers)
        ex = data.draw(st.sampled_from(fuzz.examples))
        _send(fuzz, ex.method, ex.path, ex.body, ex.stream,
              headers={"content-type": data.draw(header_value)})

    fuzz.sent = 0
    run()
    assert fuzz.sent >= 2 * EXAMPLES
