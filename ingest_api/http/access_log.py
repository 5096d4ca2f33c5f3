"""The request log (``lakelog serve --access-log PATH``, ``-`` for standard output).

One line per request, space-separated, written when the answer is complete:

    2026-11-23T10:15:02.431Z 127.0.0.1:50412 alice POST /v3/clusters/lakelog/topics/t/records 200 312 1.84

time (UTC, ms), client address, principal (``-`` when unknown: authentication off, or a
request refused before it was authenticated), method, path with its query as sent
(still percent-encoded, so a line never holds a space or a line break that came from
a client), status, response body bytes, duration in milliseconds. Keys and cookies are
never written: the headers are not logged at all, and credentials never travel in a
lakelog path or query.

Cost to the produce path: the middleware is installed only when the log is on; then it
formats one line and appends it to a buffered file, flushed at most ``FLUSH_S`` after
a write (one ``write`` system call for many requests). The write happens on the event
loop: when ``BUFFER_BYTES`` fill between flushes, the request that fills them pays for
one write; standard output piped to a reader that stops reading would block the
server, so log to a file under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import IO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

FLUSH_S = 0.5
"""A line reaches the file within this (and at shutdown)."""
BUFFER_BYTES = 64 * 1024
"""Lines wait in a buffer of this size at most; a full buffer is written at once."""
MAX_TARGET_CHARS = 2048
"""A longer path+query is cut (and ends with ``...``): a line stays bounded."""
_UNSAFE = {c: f"%{c:02X}" for c in (*range(0x21), 0x7F)}


class AccessLog:
    """Where the lines go: a file opened for appending, or standard output (``-``)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._out: IO[str] = sys.stdout if target == "-" else open(  # noqa: SIM115
            target, "a", buffering=BUFFER_BYTES, encoding="utf-8", errors="replace")
        self._flush_due = False

    def write(self, line: str) -> None:
        self._out.write(line)
        if not self._flush_due:
            self._flush_due = True
            try:
                asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
            except RuntimeError:  # no loop (a direct call): flush now
                self.flush()

    def flush(self) -> None:
        self._flush_due = False
        # A full disk or a closed file loses lines, never requests.
        with contextlib.suppress(OSError, ValueError):
            self._out.flush()

    def close(self) -> None:
        self.flush()
        if self._out is not sys.stdout:
            self._out.close()


def _target(scope: Scope) -> str:
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    if query := scope.get("query_string"):
        raw += b"?" + query
    text = raw.decode("latin-1").translate(_UNSAFE)
    return text if len(text) <= MAX_TARGET_CHARS else text[:MAX_TARGET_CHARS] + "..."


def _utc(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


class AccessLogMiddleware:
    """Writes a line per HTTP request to ``log`` once the answer is sent (or failed)."""

    def __init__(self, app: ASGIApp, log: AccessLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wall = time.time()
        start = time.perf_counter()
        status = 0
        sent = 0

        async def counting_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            client = scope.get("client")
            principal = (scope.get("state") or {}).get("principal") or "-"
            self.log.write(
                f"{_utc(wall)} {f'{client[0]}:{client[1]}' if client else '-'} {principal} "
                f"{scope['method']} {_target(scope)} {status or '-'} {sent} "
                f"{(time.perf_counter() - start) * 1000:.2f}\n")
