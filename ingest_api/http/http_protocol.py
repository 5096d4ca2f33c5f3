"""uvicorn's httptools protocol with the two bounds it lacks.

- The request head (request line and headers) may be at most ``max_head_bytes``:
  httptools would otherwise buffer a header of any size. Beyond it: 431 and the
  connection closes (memory per connection stays within the bound plus one read).
- The head must arrive within ``head_timeout_s`` of the connection opening or of
  its first byte (slowloris: a client dribbling headers holds a connection and a
  ``limit_concurrency`` slot forever). Beyond it: 408 and the connection closes.
  Idle keep-alive connections are closed by uvicorn's own keep-alive timeout.
- A request that HTTP cannot parse (a raw byte outside ASCII in the request line, a
  malformed header or chunk) is answered 400 with lakelog's JSON error body, naming
  what the parser found, and the connection closes: past a framing error nobody can
  tell where the next request starts (RFC 9112 section 2.2).
- Over ``limit_concurrency`` uvicorn answers 503 by itself: here with the JSON error body
  and a ``Retry-After``, like every other error of the API.
- Once the head is in, the body may not stall: no body bytes for
  ``body_idle_timeout_s`` while the server is waiting for them (reading is not
  paused, the application has taken what arrived, no ``100 Continue`` is pending)
  ends the request, with 408 if no response has started, else by closing the
  connection (a streaming produce that has already sent reports). The timer restarts with every chunk, as nginx's
  ``client_body_timeout`` does: a client that drips a byte at a time keeps its
  connection, and ``limit_concurrency`` bounds how many such connections there are.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import msgspec
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from log_tables.errors import (
    MalformedHttpError,
    RequestHeaderTooLargeError,
    RequestTimeoutError,
    ServiceUnavailableError,
)

REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
NAMES = {400: MalformedHttpError.code, 408: RequestTimeoutError.code,
         431: RequestHeaderTooLargeError.code}
"""The table's names of the refusals made before the app (``ingest_api.http.errors``
maps them to the same statuses)."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_head_bytes = 64 * 1024
    head_timeout_s = 10.0
    body_idle_timeout_s = 60.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._disarm_body_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()
        self._body_seen = self.loop.time()
        self._arm_body_timer(self.body_idle_timeout_s)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        # No timer per chunk: the timer, when it fires, looks at when bytes last came.
        self._body_seen = self.loop.time()

    def on_message_complete(self) -> None:
        self._disarm_body_timer()
        super().on_message_complete()

    def _arm_body_timer(self, delay_s: float) -> None:
        if self._body_timer is None:
            self._body_timer = self.loop.call_later(delay_s, self._body_timed_out)

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        idle_s = self.loop.time() - self._body_seen
        if idle_s < self.body_idle_timeout_s:
            self._arm_body_timer(self.body_idle_timeout_s - idle_s)
            return
        if self.flow.read_paused or cycle.body or cycle.waiting_for_100_continue:
            # The application has not taken what arrived (or not yet asked for the body
            # of an ``Expect: 100-continue`` request): the slow side is us.
            self._arm_body_timer(self.body_idle_timeout_s)
            return
        message = f"no request body bytes for {self.body_idle_timeout_s:g} s"
        self.logger.info("closing %s: %s", self.scope.get("path", "?"), message)
        # The application sees a disconnect and anything it sends later is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        if cycle.response_started:
            self.transport.close()
        else:
            self._refuse(408, message)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_head_bytes:
            self._refuse(431, f"request line and headers over {self.max_head_bytes} bytes")

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, f"request line and headers not received within "
                              f"{self.head_timeout_s:g} s")

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if app is service_unavailable:
            app = _service_unavailable
        super()._start_asgi_task(cycle, app)

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this from the handler of the parser's error, which says what is wrong.
        exc = sys.exc_info()[1]
        detail = str(exc) if exc is not None and str(exc) else msg
        hint = ("; percent-encode bytes outside ASCII (RFC 3986)" if "url" in detail.lower()
                else "")
        self._refuse(400, f"malformed HTTP request: {detail}{hint}")

    def _refuse(self, status: int, message: str) -> None:
        if self.transport.is_closing():
            return
        body = msgspec.json.encode({"error_code": status, "error": NAMES[status],
                                    "message": message, "retriable": status == 408})
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, REASONS[status], len(body)) + body)
        self.transport.close()
        self._in_head = False


_BUSY = msgspec.json.encode({
    "error_code": 503, "error": ServiceUnavailableError.code,
    "message": "the server is at its limit of open connections and requests "
               "(LAKELOG_LIMIT_CONCURRENCY); retry shortly", "retriable": True})


async def _service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    """uvicorn's 503 over ``limit_concurrency``, as a JSON error body."""
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(_BUSY)).encode()),
        (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": _BUSY, "more_body": False})


def bounded_protocol(max_head_bytes: int, head_timeout_s: float,
                     body_idle_timeout_s: float) -> type[Any]:
    """The protocol class with these bounds (uvicorn takes a class for ``http``)."""
    return type("LakelogHttpProtocol", (BoundedHttpToolsProtocol,),
                {"max_head_bytes": max_head_bytes, "head_timeout_s": head_timeout_s,
                 "body_idle_timeout_s": body_idle_timeout_s})
