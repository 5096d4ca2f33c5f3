"""The producer's HTTP/1.1 connections: non-blocking sockets that one thread drives with
a selector (``sender.py``), each carrying one request at a time, kept alive between them.

A request costs the client ~70 us of CPU this way against ~440 us through an httpx
client (measured on one core, 2026-11-27): at 1,000 records a request, the difference is
a tenth of what a record costs the producer. h11 (httpx's own HTTP/1.1 parser) reads and
writes the messages; TLS is the ``ssl`` module's, with httpx's defaults for ``verify``.

Failures are httpx's exception types, so that the retry rules (``retry.never_sent``,
``retry.permanent``) read them as they read httpx's: ``ConnectError`` and
``ConnectTimeout`` mean the request never left; any other means it may have been
received.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import httpx

READ_BYTES = 1 << 18
Address = tuple[socket.AddressFamily, tuple[str, int]]
IDLE_S = 4.0
"""An idle connection older than this is closed rather than used (uvicorn closes its
side after 5 s)."""


@dataclass(frozen=True, slots=True)
class Server:
    """Where a URL's requests go: host, port, TLS, and the path the API's paths follow."""

    url: str
    host: str
    port: int
    tls: bool
    path: str

    @classmethod
    def of(cls, url: str) -> Server:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        return cls(url, parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80),
                   tls, parts.path.rstrip("/"))

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(slots=True)
class Answer:
    """A whole response."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def response(self, url: str) -> httpx.Response:
        """As httpx's (what the error readers take)."""
        return httpx.Response(self.status, headers=self.headers, content=self.body,
                              request=httpx.Request("POST", url))


class Connection:
    """One socket to one server; ``want`` says which selector events it waits for and
    ``on_event`` moves it on (an ``Answer`` when the response is whole)."""

    def __init__(self, server: Server, tls: ssl.SSLContext | None,
                 target: Address | None = None) -> None:
        self.server = server
        family, address = target or addresses(server.host, server.port)[0]
        self.sock: socket.socket | ssl.SSLSocket = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls = tls if server.tls else None
        self._state = "connecting"
        self._out = memoryview(b"")
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=1 << 16)
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self.sent = False
        """Bytes of the current request have left: its outcome is unknown if it breaks."""
        self.idle_since = time.monotonic()
        try:
            err = self.sock.connect_ex(address)
        except OSError as exc:
            self.sock.close()
            raise httpx.ConnectError(f"{server.netloc}: {exc}") from exc
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            self.sock.close()
            raise httpx.ConnectError(f"{server.netloc}: {os.strerror(err)}")

    def fileno(self) -> int:
        return self.sock.fileno()

    def want(self) -> int:
        """The selector events this connection waits for (a handshake's before the
        request's bytes: a socket waiting to read must not be watched for writing, which
        it always is)."""
        if self._state in ("connecting", "handshake-write"):
            return 2  # selectors.EVENT_WRITE
        if self._state == "handshake":
            return 1  # EVENT_READ
        return 2 if self._out else 1

    def stale(self) -> bool:
        """An idle connection that may not carry another request: old, or closed by the
        server (readable while idle means end of stream or a stray byte). ``poll``, not
        ``select``, which refuses descriptors from 1024 on."""
        if self._state != "ready" or time.monotonic() - self.idle_since > IDLE_S:
            return True
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def start(self, method: str, target: str, headers: list[tuple[str, str]],
              body: bytes) -> None:
        """Queue a request; it goes as the socket takes it."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        self._status, self._headers, self._body = 0, [], []
        self.sent = False
        head = self._h11.send(h11.Request(method=method, target=target, headers=[
            ("host", self.server.netloc), ("content-length", str(len(body))), *headers]))
        self._h11.send_with_data_passthrough(h11.Data(data=body))  # counts; no copy
        end = self._h11.send(h11.EndOfMessage())
        assert head is not None and end is not None
        self._out = memoryview(b"".join((head, body, end)))
        if self._state == "ready":
            self._write()

    def on_event(self, mask: int) -> Answer | None:
        """Move on after the selector said the socket is ready; the answer when whole.
        Raises httpx's ``TransportError`` kinds when the connection fails."""
        if self._state == "connecting":
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise httpx.ConnectError(f"{self.server.netloc}: {os.strerror(err)}")
            try:  # an event meant for a socket closed before and its number reused
                self.sock.getpeername()
            except OSError as exc:
                if exc.errno == errno.ENOTCONN:
                    return None
                raise httpx.ConnectError(f"{self.server.netloc}: {exc}") from exc
            if self._tls is None:
                self._state = "ready"
            else:
                self.sock = self._tls.wrap_socket(self.sock, server_hostname=self.server.host,
                                                  do_handshake_on_connect=False)
                self._state = "handshake"
        if self._state.startswith("handshake"):
            self._handshake()
            if self._state != "ready":
                return None
        if self._out:
            try:
                self._write()
            except httpx.WriteError:
                # The server may have answered before it read it all (a refusal) and
                # closed: its answer says what happened, if it came whole.
                with contextlib.suppress(httpx.TransportError):
                    answer = self._read()
                    if answer is not None:
                        return answer
                raise
            if self._out:
                return None
        if mask & 1 or isinstance(self.sock, ssl.SSLSocket):
            return self._read()
        return None

    def timed_out(self) -> httpx.TransportError:
        """The failure an attempt past its deadline ends with: the request never left
        (``ConnectTimeout``) only if none of its bytes did, whatever the state now."""
        if not self.sent:
            return httpx.ConnectTimeout(f"{self.server.netloc}: the request could not be "
                                        "sent within its timeout")
        return httpx.ReadTimeout(f"{self.server.netloc}: no answer within the request's "
                                 "timeout")

    def close(self) -> None:
        self._state = "closed"
        with contextlib.suppress(OSError):
            self.sock.close()

    def _handshake(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._state = "handshake"
        except ssl.SSLWantWriteError:
            self._state = "handshake-write"
        except (ssl.SSLError, OSError) as exc:
            raise httpx.ConnectError(f"{self.server.netloc}: {exc}") from exc
        else:
            self._state = "ready"

    def _write(self) -> None:
        try:
            while self._out:
                n = self.sock.send(self._out)
                self.sent = True
                self._out = self._out[n:]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError as exc:
            raise httpx.WriteError(f"{self.server.netloc}: {exc}") from exc

    def _read(self) -> Answer | None:
        while True:
            try:
                data = self.sock.recv(READ_BYTES)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None
            except OSError as exc:
                raise httpx.ReadError(f"{self.server.netloc}: {exc}") from exc
            try:
                self._h11.receive_data(data)
                answer = self._events()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(f"{self.server.netloc}: {exc}") from exc
            if answer is not None or not data:
                if answer is None:
                    raise httpx.RemoteProtocolError(
                        f"{self.server.netloc}: the server closed the connection before "
                        "its answer was whole")
                return answer

    def _events(self) -> Answer | None:
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Response):
                self._status, self._headers = event.status_code, list(event.headers)
            elif isinstance(event, h11.Data):
                self._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if self._h11.our_state is not h11.DONE or \
                        self._h11.their_state is not h11.DONE:
                    self._state = "closing"  # Connection: close, or a request not all sent
                self.idle_since = time.monotonic()
                return Answer(self._status, self._headers, b"".join(self._body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    @property
    def reusable(self) -> bool:
        return self._state == "ready" and self._h11.our_state is h11.DONE and \
            self._h11.their_state is h11.DONE


def addresses(host: str, port: int) -> list[Address]:
    """Where ``host`` may be reached, IPv4 first (a blocking lookup, as httpx's; none for
    an address written as one)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpx.ConnectError(f"{host}:{port}: {exc}") from exc
    out: list[Address] = []
    for family, _, _, _, address in sorted(found, key=lambda a: a[0] != socket.AF_INET):
        target = (family, (str(address[0]), int(address[1])))
        if target not in out:
            out.append(target)
    return out
