"""lakelog's check in front of the JDBC/ODBC (Hive Thrift) server.

Spark's Thrift server cannot check lakelog's API keys (its password hooks are Java
classes), so it listens in HTTP transport mode on a loopback port of its own, and this
front, on the public JDBC port, passes on each Thrift-over-HTTP request once its
``Authorization: Basic`` credentials are an API key (``beeline -n KEY_ID -p SECRET``).
The Thrift server's session is shared by every JDBC connection and holds every topic's
view (registered again, where its data changed, before a request that comes a second
after the last refresh), so only a principal that may consume every topic (cluster admin, or ACLs that
cover them all) is let in; others are told to use Spark Connect, whose sessions hold
the topics a principal may consume. With ``auth=none`` (loopback) everyone is let in.
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

from ingest_api.security import SecurityStore, parse_credentials

log = logging.getLogger(__name__)
HTTP_PATH = "cliservice"
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A Thrift call larger than this is refused (a statement, or a batch of results asked for)."""
PASSED_HEADERS = ("content-type", "cookie", "x-xsrf-header", "accept")
REFRESH_S = 1.0


def admit(store: SecurityStore | None, header: str | None, topics: Callable[[], list[str]]
          ) -> tuple[int, str, str | None]:
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
    denied = [t for t in topics() if not store.allowed(principal, "topic", t, "consume")]
    if denied:
        return 403, (f"principal {principal} may not consume topic {denied[0]}"
                     f"{f' (and {len(denied) - 1} more)' if len(denied) > 1 else ''}; JDBC "
                     "shows every topic, so it needs them all: use Spark Connect, whose "
                     "sessions hold the topics a principal may consume"), principal
    return 200, "", principal


def serve_jdbc_front(host: str, port: int, backend_port: int, store: SecurityStore | None,
                     topics: Callable[[], list[str]], refresh: Callable[[], None]
                     ) -> ThreadingHTTPServer:
    """Start the front on ``host:port`` (a daemon thread); ``server.shutdown()`` stops it.
    ``refresh`` (the shared session's views, where their data changed) runs before a
    request passes when the last run is over ``REFRESH_S`` old: only while JDBC is used."""
    local = threading.local()
    refreshed = [0.0]
    refresh_lock = threading.Lock()

    def fresh() -> None:
        with refresh_lock:
            if time.monotonic() - refreshed[0] > REFRESH_S:
                refresh()
                refreshed[0] = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            log.debug("jdbc front: " + format, *args)

        def _refuse(self, status: int, message: str) -> None:
            body = json.dumps({"error_code": status, "message": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="lakelog"')
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES or length < 0:
                self._refuse(413, f"a JDBC request may be at most {MAX_BODY_BYTES} bytes")
                return
            body = self.rfile.read(length)
            status, message, principal = admit(store, self.headers.get("Authorization"),
                                               topics)
            if status != 200:
                self._refuse(status, message)
                return
            try:
                fresh()
            except Exception:  # the views stay as they were; the query still runs
                log.exception("refreshing the JDBC session's views failed")
            user = principal or "anonymous"
            headers = {k: v for k, v in self.headers.items() if k.lower() in PASSED_HEADERS}
            # The Thrift server (auth NONE) takes the user from Basic credentials.
            headers["Authorization"] = "Basic " + base64.b64encode(
                f"{user}:lakelog".encode()).decode()
            headers["Content-Length"] = str(len(body))
            conn: http.client.HTTPConnection | None = getattr(local, "conn", None)
            for attempt in (1, 2):  # a kept-alive connection the backend closed: once more
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=600)
                    local.conn = conn
                try:
                    conn.request("POST", self.path, body, headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    break
                except (OSError, http.client.HTTPException):
                    conn.close()
                    conn = local.conn = None
                    if attempt == 2:
                        self._refuse(502, "the JDBC server did not answer")
                        return
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() in ("content-type", "set-cookie"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="jdbc-front", daemon=True).start()
    return server
