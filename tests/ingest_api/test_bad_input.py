"""Bad bytes anywhere in a request are a clear 4xx, never a 500, and the connection stays.

(The hypothesis fuzzing of every route is in ``test_fuzz.py``; these are the cases
found, named.)
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ingest_api.http import errors
from lakelog.local import free_port
from tests.ingest_api.helpers import string
from tests.server import ServerProcess

pytestmark = pytest.mark.slow
BAD_KEY = b'{"\xaa": 1}'


def _port(r: httpx.Response) -> int:
    port: int = r.extensions["network_stream"].get_extra_info("client_addr")[1]
    return port


def test_invalid_utf8_in_json_is_400_naming_the_byte_on_every_route(
        server: ServerProcess) -> None:
    with server.client() as client:
        client.post("/topics", json={"topic_name": "utf8", "partitions_count": 1})
        member = client.post("/consumer-groups/utf8-g/members", json={"topics": ["utf8"]}).json()
        m = f"/consumer-groups/utf8-g/members/{member['member_id']}"
        paths = [("POST", "/topics"), ("PATCH", "/topics/utf8"),
                 ("PUT", "/topics/utf8/configs/retention.ms"), ("POST", "/topics/utf8/configs:alter"),
                 ("POST", "/topics/utf8/records"), ("POST", "/topics/utf8/records:batch"),
                 ("POST", "/topics/utf8/records:delete"), ("POST", "/producers"),
                 ("POST", "/consumer-groups/utf8-g/members"), ("POST", f"{m}/heartbeat"),
                 ("POST", f"{m}/positions"), ("POST", "/consumer-groups/utf8-g/offsets"),
                 ("POST", "/consumer-groups/other/offsets:reset"), ("POST", "/acls"),
                 ("POST", "/api-keys")]
        first = client.get("/topics/utf8")
        for method, path in paths:
            r = client.request(method, path, content=BAD_KEY,
                               headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            body = r.json()
            assert body["error"] == "malformed_json" and body["error_code"] == 400, (path, body)
            assert "byte 2 (0xaa) is not UTF-8" in body["message"], (path, body)
            # The same connection answers the next request.
            after = client.get("/topics/utf8")
            assert after.status_code == 200 and _port(after) == _port(first), path
        # Inside a value, deeper in the body: the offset is the byte's own.
        body_bytes = b'{"value": {"type": "STRING", "data": "ok \xc3("}}'
        r = client.post("/topics/utf8/records", content=body_bytes,
                        headers={"content-type": "application/json"})
        at = body_bytes.index(b"\xc3")
        assert r.status_code == 400 and f"byte {at} (0xc3)" in r.json()["message"]
        # In a key of one entry of a batch whose other entry is invalid (decoded entry by
        # entry then): that entry fails alone, 400 naming the byte in it, not a 500 for the
        # request (the fuzz test met it).
        entry = b'{"id": "b", "\xf0artition_id": 0, "value": {"type": "BINARY", "data": "eA=="}}'
        batch = b'{"entries": [{"id": "a", "key": {"type": "RTRING", "data": "k"}}, ' + \
            entry + b"]}"
        r = client.post("/topics/utf8/records:batch", content=batch,
                        headers={"content-type": "application/json"})
        assert r.status_code == 207, r.text
        failures = {f["id"]: f for f in r.json()["failures"]}
        at = entry.index(b"\xf0")
        assert failures["b"]["error_code"] == 400, failures
        assert f"byte {at} (0xf0) is not UTF-8" in failures["b"]["message"], failures
        assert failures["a"]["error_code"] == 422, failures


def test_a_stream_answers_the_records_before_bad_utf8_and_names_its_offset(
        server: ServerProcess) -> None:
    with server.client() as client:
        client.post("/topics", json={"topic_name": "utf8s", "partitions_count": 1})
        good = json.dumps({"value": string("fine")}).encode()
        bad = b'{"value": {"type": "STRING", "data": "\xed\xa0\x80"}}'
        chunks = [good + b"\n" + good[:10], good[10:] + b"\n" + bad[:30], bad[30:] + good]
        r = client.post("/topics/utf8s/records", content=iter(chunks),
                        headers={"content-type": "application/json"})
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert [line["error_code"] for line in lines] == [200, 200, 400]
        offset = len(good) * 2 + 2 + bad.index(b"\xed")
        assert f"byte {offset} (0xed) is not UTF-8" in lines[2]["message"]
        assert client.get("/topics/utf8s").status_code == 200


def test_odd_bytes_in_paths_and_queries_are_4xx_and_keep_the_connection(
        server: ServerProcess) -> None:
    with server.client() as client:
        first = client.get("/topics")
        for path, status in [("/topics/%FF%FE", 404), ("/topics/a%00b/partitions", 404),
                             ("/topics/%C3%28/configs/retention.ms", 404),
                             ("/topics/x/partitions/%FF", 400),
                             ("/topics/x/partitions/0/records?offset=%FF", 422),
                             ("/topics/x/partitions/0/records?offset=0&format=%ED%A0%80", 422),
                             ("/consumer-groups/%F4%90%80%80", 404),
                             ("/jobs/runs?topic=%FF&job=%00", 200)]:
            r = client.get(path)
            assert r.status_code == status, (path, r.text)
            assert _port(r) == _port(first), path


def test_bytes_http_cannot_parse_get_a_json_400(server: ServerProcess) -> None:
    """A raw byte outside ASCII in the request line is not HTTP: 400 with the JSON error
    body, and the connection closes (after a framing error nobody knows where the next
    request starts)."""
    for line in (b"GET /v3/clusters/lakelog/topics/\xff HTTP/1.1",
                 b"GET /v3/clusters/lakelog/topics/x/partitions/0/records?offset=\xaa HTTP/1.1"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(line + b"\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
        error = json.loads(body)
        assert error["error"] == "malformed_http" and "percent-encode" in error["message"]


@pytest.fixture
def failing_app_url() -> Iterator[str]:
    """A real uvicorn serving a route that raises: the fault a 500 needs, injected because
    no input to lakelog's own routes produces one."""

    async def boom(request: Request) -> PlainTextResponse:
        raise RuntimeError("injected")

    async def fine(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    # Wired as create_app wires it: lakelog's handlers, the middleware inside Starlette's.
    app = FastAPI(routes=[Route("/boom", boom), Route("/fine", fine)])
    errors.install(app)
    app.add_middleware(errors.KeepConnectionOnError)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_an_unexpected_error_is_500_json_and_keeps_the_connection(failing_app_url: str) -> None:
    with httpx.Client(base_url=failing_app_url) as client:
        r = client.get("/boom")
        assert r.status_code == 500
        assert r.json() == {"error_code": 50000, "error": "internal_error",
                            "message": "internal error: RuntimeError", "retriable": False}
        after = client.get("/fine")
        assert after.text == "ok" and _port(after) == _port(r)


def test_over_the_concurrency_limit_is_a_json_503(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(limit_concurrency="2")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30):  # one held open
        r = httpx.get(f"{server.url}/v3/clusters/lakelog/topics", timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    body = r.json()
    assert body["error_code"] == 503 and "LAKELOG_LIMIT_CONCURRENCY" in body["message"]


def test_an_unknown_record_type_is_422_listing_the_valid_ones(server: ServerProcess) -> None:
    """One record, a batch entry and a stream's record; a type in lower case, one
    nobody has (XML; AVRO is taken since the schema registry) and a key with no type."""
    valid = 'with T one of BINARY, STRING, JSON, AVRO, JSONSCHEMA, PROTOBUF'
    with server.client() as client:
        client.post("/topics", json={"topic_name": "types", "partitions_count": 1})
        for key, value in (({"type": "string", "data": "k"}, None),
                           (None, {"type": "XML", "data": "v"}), ({"data": "k"}, None)):
            record = {"key": key, "value": value}
            where = "$.key" if key is not None else "$.value.type"
            r = client.post("/topics/types/records", json=record)
            assert r.status_code == 422 and valid in r.json()["message"], r.text
            assert where in r.json()["message"]
            r = client.post("/topics/types/records:batch",
                            json={"entries": [{"id": "a", **record}]})
            assert r.status_code == 207, r.text
            [failure] = r.json()["failures"]
            assert failure["error_code"] == 422 and valid in failure["message"], failure
            stream = iter([json.dumps({"value": {"type": "STRING", "data": "ok"}}).encode(),
                           json.dumps(record).encode()])  # chunked: a stream
            r = client.post("/topics/types/records", content=stream,
                            headers={"content-type": "application/json"})
            assert valid in r.text, r.text
