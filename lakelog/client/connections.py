"""The producer's connections (``wire.Connection``): kept alive per server while idle
and fresh, new ones to the first of a server's addresses that did not refuse one last,
TLS with httpx's defaults for ``verify``."""

from __future__ import annotations

import ssl

import httpx

from lakelog.client.wire import Address, Connection, Server, addresses


class Connections:
    """One sender's connections to every server it sends to."""

    def __init__(self, verify: bool | ssl.SSLContext) -> None:
        self._verify = verify
        self._tls: ssl.SSLContext | None = None
        """Made for the first https broker (httpx's defaults for ``verify``)."""
        self._servers: dict[str, Server] = {}
        self._addresses: dict[str, tuple[list[Address], int]] = {}
        """Each server's addresses, the one to try first first, and how many were tried."""
        self._idle: dict[str, list[Connection]] = {}

    def server(self, url: str) -> Server:
        return self._servers.get(url) or self._servers.setdefault(url, Server.of(url))

    def get(self, server: Server) -> Connection:
        """An idle connection to ``server`` that may carry another request, else a new one
        (to the first of the server's addresses that did not refuse one last)."""
        idle = self._idle.get(server.url)
        while idle:
            conn = idle.pop()
            if not conn.stale():
                return conn
            conn.close()
        if server.tls and self._tls is None:
            self._tls = httpx.create_ssl_context(verify=self._verify)
        found = self._addresses.get(server.url)
        if found is None:
            found = self._addresses[server.url] = (addresses(server.host, server.port), 0)
        return Connection(server, self._tls, found[0][0])

    def unreachable(self, url: str) -> None:
        """A connection to ``url`` failed: its next address next time (and, once each was
        tried, a new lookup)."""
        found = self._addresses.pop(url, None)
        if found is not None and found[1] + 1 < len(found[0]):
            self._addresses[url] = (found[0][1:] + found[0][:1], found[1] + 1)

    def release(self, conn: Connection) -> None:
        """A connection whose answer came whole: kept for the next request if it may
        carry one."""
        if conn.reusable:
            self._idle.setdefault(conn.server.url, []).append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
