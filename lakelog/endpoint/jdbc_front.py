"""lakelog's check in front of the JDBC/ODBC (Hive Thrift) server.

Spark's Thrift server cannot check lakelog's API keys (its password hooks are Java
classes), so it listens in HTTP transport mode on a loopback port of its own, at a
random path only this process knows, and this front, on the public JDBC port, passes on
each Thrift-over-HTTP request once its ``Authorization: Basic`` credentials are an API
key (``beeline -n KEY_ID -p SECRET``) whose principal has cluster ``admin``.

Only admins, because the Thrift server's one session is shared by every JDBC
connection: it holds every topic's view (registered again, where its data changed,
before a request that comes a second after the last refresh), and a statement in it is
not checked (it may write, read files, ``SET`` what every JDBC user then sees). Others
are told to use Spark Connect, whose sessions hold the topics a principal may consume
and whose statements lakelog checks. With ``auth=none`` (loopback) everyone is let in.

Bounds: at most ``MAX_CONNECTIONS`` served at once (more wait to be accepted), a body of
at most ``MAX_BODY_BYTES`` (read only once the key is good), ``IDLE_TIMEOUT_S`` of
silence from a client, ``STATEMENT_TIMEOUT_S`` for the backend's answer.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ingest_api.broker.security import SecurityStore, parse_credentials

log = logging.getLogger(__name__)
HTTP_PATH = "cliservice"
"""The path clients use (Hive's default ``httpPath``)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A Thrift call larger than this is refused (a statement, or a batch of results asked for)."""
MAX_CONNECTIONS = 32
IDLE_TIMEOUT_S = 300.0
STATEMENT_TIMEOUT_S = 3600.0
PASSED_HEADERS = ("content-type", "x-xsrf-header", "accept")
"""Headers passed on; not cookies: every request carries the key, so every request is
checked (the Thrift server's own cookie would let a client send none)."""
REFRESH_S = 1.0


def admit(store: SecurityStore | None, header: str | None) -> tuple[int, str, str | None]:
    """(HTTP status, message, principal) for a request's Authorization header: 200 lets it
    through as the principal."""
    if store is None:
        return 200, "", None
    credentials = parse_credentials(header)
    if credentials is None:
        return 401, "an API key is needed: beeline -n KEY_ID -p SECRET", None
    principal = store.authenticate(*credentials)
    if principal is None:
        return 401, f"API key {credentials[0]} is unknown or its secret is wrong", None
    if store.allowed(principal, "cluster", "lakelog", "admin"):
        return 200, "", principal
    return 403, (f"principal {principal} may not use JDBC: its one session shows every "
                 "topic and runs any statement, so it needs cluster admin; use Spark "
                 "Connect, whose sessions hold the topics a principal may consume"), principal


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.slots.acquire()  # the accept loop waits while every slot is taken
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve_jdbc_front(host: str, port: int, backend_port: int, backend_path: str,
                     store: SecurityStore | None, refresh: Callable[[], None]
                     ) -> ThreadingHTTPServer:
    """Start the front on ``host:port`` (a daemon thread); ``server.shutdown()`` stops it.
    ``refresh`` (the shared session's views, where their data changed) runs before a
    request passes when the last run is over ``REFRESH_S`` old: only while JDBC is used."""
    refreshed = [0.0]
    refresh_lock = threading.Lock()

    def fresh() -> None:
        with refresh_lock:
            if time.monotonic() - refreshed[0] > REFRESH_S:
                refresh()
                refreshed[0] = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = IDLE_TIMEOUT_S
        backend: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: object) -> None:
            log.debug("jdbc front: " + format, *args)

        def finish(self) -> None:
            if self.backend is not None:
                self.backend.close()
            super().finish()

        def _refuse(self, status: int, message: str) -> None:
            body = json.dumps({"error_code": status, "message": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="lakelog"')
            self.close_connection = True  # the body, if any, was not read
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            path, _, query = self.path.partition("?")
            if path.strip("/") != HTTP_PATH:
                self._refuse(404, f"JDBC is served at /{HTTP_PATH} (httpPath={HTTP_PATH})")
                return
            status, message, principal = admit(store, self.headers.get("Authorization"))
            if status != 200:
                self._refuse(status, message)
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length > MAX_BODY_BYTES or length < 0:
                self._refuse(413, f"a JDBC request may be at most {MAX_BODY_BYTES} bytes")
                return
            body = self.rfile.read(length)
            try:
                fresh()
            except Exception:  # the views stay as they were; the query still runs
                log.exception("refreshing the JDBC session's views failed")
            headers = {k: v for k, v in self.headers.items() if k.lower() in PASSED_HEADERS}
            # The Thrift server (auth NONE) takes the user from Basic credentials.
            headers["Authorization"] = "Basic " + base64.b64encode(
                f"{principal or 'anonymous'}:lakelog".encode()).decode()
            headers["Content-Length"] = str(len(body))
            target = f"/{backend_path}" + (f"?{query}" if query else "")
            answer = self._forward(target, body, headers)
            if answer is None:
                return
            status_code, content_type, data = answer
            self.send_response(status_code)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _forward(self, target: str, body: bytes, headers: dict[str, str]
                     ) -> tuple[int, str | None, bytes] | None:
            """The backend's (status, content type, body), or None once refused. A kept
            connection the backend closed is retried once on a new one; a request the
            backend may have started (a timeout) never is."""
            for attempt in (1, 2):
                fresh_connection = self.backend is None
                if self.backend is None:
                    self.backend = http.client.HTTPConnection(
                        "127.0.0.1", backend_port, timeout=STATEMENT_TIMEOUT_S)
                try:
                    self.backend.request("POST", target, body, headers)
                    response = self.backend.getresponse()
                    return response.status, response.getheader("Content-Type"), response.read()
                except TimeoutError:
                    self._drop_backend()
                    self._refuse(504, "the JDBC server did not answer in "
                                      f"{STATEMENT_TIMEOUT_S:.0f} s")
                    return None
                except (OSError, http.client.HTTPException) as exc:
                    self._drop_backend()
                    stale = isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError |
                                       ConnectionResetError)
                    if attempt == 2 or fresh_connection or not stale:
                        self._refuse(502, f"the JDBC server did not answer ({exc})")
                        return None
            return None

        def _drop_backend(self) -> None:
            if self.backend is not None:
                self.backend.close()
                self.backend = None

    server = _Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="jdbc-front", daemon=True).start()
    return server
