"""The producer's HTTP/1.1 connections (``lakelog/client/wire.py``) against a server on
127.0.0.1 that answers as a test script says: chunked answers, ``Connection: close``,
an idle connection the server closed, a refused connection and an answer cut short,
each read as the retry rules need (``never_sent``: the request surely never left)."""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from lakelog.client.retry import never_sent
from lakelog.client.wire import Answer, Connection, Server

WAIT_S = 10.0
Script = Callable[[socket.socket], None]


def _read_request(conn: socket.socket) -> bytes:
    """One request's bytes (head and a Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Server]]:
    """Starts a one-connection server running a script; gives its ``Server``."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(script: Script) -> Server:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def run() -> None:
            conn, _ = listener.accept()
            with conn:
                script(conn)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return Server.of(f"http://127.0.0.1:{listener.getsockname()[1]}")

    yield start
    for listener in listeners:
        listener.close()
    for thread in threads:
        thread.join(WAIT_S)


def _drive(conn: Connection) -> Answer:
    """Run the connection until its answer is whole (raises what it raises)."""
    with selectors.DefaultSelector() as selector:
        selector.register(conn, conn.want())
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for _, mask in selector.select(0.1):
                answer = conn.on_event(mask)
                if answer is not None:
                    return answer
                selector.modify(conn, conn.want())
    raise AssertionError("no answer within the deadline")


def _post(conn: Connection, body: bytes = b'{"entries":[]}') -> None:
    conn.start("POST", "/v3/x", [("content-type", "application/json")], body)


def test_a_chunked_answer_then_one_that_closes_are_read_whole(
        serve: Callable[[Script], Server]) -> None:
    requests: list[bytes] = []

    def script(conn: socket.socket) -> None:
        requests.append(_read_request(conn))
        conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n")
        requests.append(_read_request(conn))
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n"
                     b"connection: close\r\n\r\n{}")

    conn = Connection(serve(script), None)
    body = b'{"entries":[' + b"x" * 300_000 + b"]}"  # more than a socket takes at once
    _post(conn, body)
    answer = _drive(conn)
    assert (answer.status, answer.body) == (200, b'{"a": 1}')
    assert conn.reusable
    assert requests[0].endswith(body) and b"content-length: %d" % len(body) in requests[0]
    _post(conn)  # the same connection again
    answer = _drive(conn)
    assert (answer.status, answer.body) == (503, b"{}")
    assert not conn.reusable  # the server said it closes
    assert answer.response("http://x").status_code == 503
    conn.close()


def test_an_idle_connection_the_server_closed_is_stale(
        serve: Callable[[Script], Server]) -> None:
    closed = threading.Event()

    def script(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        conn.shutdown(socket.SHUT_RDWR)  # as a server whose keep-alive ran out
        closed.set()

    conn = Connection(serve(script), None)
    _post(conn)
    assert _drive(conn).status == 200
    assert conn.reusable
    assert closed.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while not conn.stale() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn.stale(), "a connection the server closed would be written to"
    conn.close()


def test_a_refused_connection_never_left_and_a_cut_answer_may_have(
        serve: Callable[[Script], Server]) -> None:
    port = socket.create_server(("127.0.0.1", 0))
    address = port.getsockname()
    port.close()  # nothing listens there now
    made: list[Connection] = []
    with pytest.raises(httpx.TransportError) as refused:  # at once, or once it is tried
        made.append(Connection(Server.of(f"http://127.0.0.1:{address[1]}"), None))
        _post(made[0])
        _drive(made[0])
    assert never_sent(refused.value)
    for conn in made:
        conn.close()

    def script(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"succ")

    conn = Connection(serve(script), None)
    _post(conn)
    with pytest.raises(httpx.RemoteProtocolError, match="closed connection") as cut:
        _drive(conn)
    assert conn.sent and not never_sent(cut.value)  # it may have been appended
    conn.close()


def test_an_attempt_past_its_deadline_says_whether_it_connected() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # never accepts
        conn = Connection(Server.of(f"http://127.0.0.1:{listener.getsockname()[1]}"), None)
        try:
            assert isinstance(conn.timed_out(), httpx.ConnectTimeout)  # never left
        finally:
            conn.close()
    assert Server.of("https://example.com/base/").path == "/base"
    assert Server.of("https://example.com").port == 443
    assert Server.of("http://[::1]:8080").netloc == "[::1]:8080"


def test_an_attempt_that_timed_out_after_its_bytes_left_may_have_been_received(
        serve: Callable[[Script], Server]) -> None:
    """Found in review: the sender closed a timed-out connection before asking what the
    timeout meant, and a closed connection said "never sent", so an idempotent=False
    producer sent the records again and an idempotent one did not take a new epoch."""
    got, release = threading.Event(), threading.Event()

    def script(conn: socket.socket) -> None:
        _read_request(conn)  # and never answers
        got.set()
        release.wait(WAIT_S)

    conn = Connection(serve(script), None)
    _post(conn)
    with selectors.DefaultSelector() as selector:
        selector.register(conn, conn.want())
        deadline = time.monotonic() + WAIT_S
        while not got.is_set() and time.monotonic() < deadline:
            for _, mask in selector.select(0.05):
                assert conn.on_event(mask) is None
                selector.modify(conn, conn.want())
    assert got.is_set()
    conn.close()  # as the sender does at the deadline, before it reads the failure
    release.set()
    failure = conn.timed_out()
    assert isinstance(failure, httpx.ReadTimeout) and not never_sent(failure)


def test_a_tls_handshake_waiting_for_the_server_does_not_spin() -> None:
    """Found in review: while the handshake waited to read, the request's bytes made the
    connection ask to be woken when writable, which a socket always is: a core spun for
    the handshake's whole wait."""
    import ssl

    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, never speaks TLS
        server = Server.of(f"https://127.0.0.1:{listener.getsockname()[1]}")
        conn = Connection(server, ssl.create_default_context())
        _post(conn)
        events = 0
        with selectors.DefaultSelector() as selector:
            selector.register(conn, conn.want())
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                for _, mask in selector.select(0.05):
                    events += 1
                    assert conn.on_event(mask) is None
                    selector.modify(conn, conn.want())
        conn.close()
    assert events <= 3, f"{events} wake-ups in 0.5 s of a handshake waiting to read"


def test_a_connection_numbered_past_1024_can_be_checked_for_staleness(
        serve: Callable[[Script], Server]) -> None:
    """Found in review: the staleness check used select(), which refuses descriptors from
    1024 on, and every reuse of such a connection failed its request."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))

    def script(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        conn.recv(1)  # until the client closes

    conn = Connection(serve(script), None)
    _post(conn)
    assert _drive(conn).status == 200
    high = os.dup2(conn.sock.fileno(), 2000)
    conn.sock.close()
    conn.sock = socket.socket(fileno=high)
    try:
        assert not conn.stale()
    finally:
        conn.close()


def test_after_one_address_refuses_the_next_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server name with two addresses, the first refusing (nothing listens on
    127.0.0.2 at the port; the server listens on 127.0.0.1 only): after the refusal the
    next connection goes to the other address. The two-address name is the one thing
    mocked (this machine's resolver gives one address per name)."""
    from lakelog.client import connections

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        monkeypatch.setattr(connections, "addresses", lambda host, p: [
            (socket.AF_INET, ("127.0.0.2", p)), (socket.AF_INET, ("127.0.0.1", p))])
        pool = connections.Connections(True)
        server = pool.server(f"http://two-addresses:{port}")
        with pytest.raises(httpx.ConnectError):
            first = pool.get(server)
            try:
                _post(first)
                _drive(first)
            finally:
                first.close()
        pool.unreachable(server.url)
        second = pool.get(server)
        try:
            _post(second)
            with selectors.DefaultSelector() as selector:
                selector.register(second, second.want())
                assert selector.select(WAIT_S), "no connection to the second address"
                assert second.on_event(2) is None  # connected; the request is going
            conn, address = listener.accept()
            conn.close()
            assert address[0] == "127.0.0.1"
        finally:
            second.close()
