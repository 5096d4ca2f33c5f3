"""Kafka's ``bootstrap.servers``: a client given several brokers uses any that is alive.

A client takes one URL, a list of them, or one string of them separated by commas
(``"http://b1:8080,http://b2:8080"``; a ``host:port`` without a scheme is ``http://``).
Its httpx client sends every request through a ``FailoverTransport``: requests go to the
broker that answered last; a broker that cannot be connected to is skipped at once for
the next (the request never left, so it is sent again there); a request that broke after
it was sent fails as before (the caller's retries decide whether to send it again) and
the next one goes to the next broker. Any broker answers any request (a cluster's
brokers forward), so which one is asked only changes where the answer comes from.

The brokers a client learns from the metadata (``GET /brokers``) join its list
(``learn``), as a Kafka client's do, so a client whose bootstrap brokers all died goes on
with the others.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

import httpx


def bootstrap_urls(servers: str | Sequence[str]) -> list[str]:
    """The brokers of ``servers`` as URLs without a trailing slash, in order, once each."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"a broker is a URL string, not {type(item).__name__}")
        url = item.strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"{item.strip()!r} is not a broker's URL (http://host:port)")
        if url not in out:
            out.append(url)
    if not out:
        raise ValueError("no broker given: a URL, a list of them, or one string of them "
                         "separated by commas")
    return out


def first_url(servers: str | Sequence[str]) -> str:
    return bootstrap_urls(servers)[0]


def describe_servers(servers: str | Sequence[str]) -> str:
    """The brokers as an error message names them."""
    urls = bootstrap_urls(servers)
    return urls[0] if len(urls) == 1 else "any of " + ", ".join(urls)


class FailoverTransport(httpx.HTTPTransport):
    """Sends each request to the current broker of a list (the scheme, host and port of
    the request's URL are replaced); moves on to the next broker as the module
    docstring says."""

    def __init__(self, urls: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._urls = [httpx.URL(u) for u in bootstrap_urls(urls)]
        self._current = 0
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return [str(u).rstrip("/") for u in self._urls]

    @property
    def current(self) -> str:
        with self._lock:
            return str(self._urls[self._current]).rstrip("/")

    def learn(self, urls: Iterable[str]) -> None:
        """Brokers the metadata named: asked after the ones known already."""
        with self._lock:
            known = {(u.scheme, u.host, u.port) for u in self._urls}
            for url in urls:
                u = httpx.URL(url)
                if (u.scheme, u.host, u.port) not in known:
                    self._urls.append(u)
                    known.add((u.scheme, u.host, u.port))

    def prefer(self, url: str) -> None:
        """Ask ``url`` first from now on (the broker a request belongs to, say)."""
        u = httpx.URL(url)
        with self._lock:
            for i, known in enumerate(self._urls):
                if (known.scheme, known.host, known.port) == (u.scheme, u.host, u.port):
                    self._current = i
                    return
            self._urls.append(u)
            self._current = len(self._urls) - 1

    def failed(self, url: str) -> None:
        """``url`` could not be reached: the next broker is asked first (if ``url`` was
        the first)."""
        u = httpx.URL(url)
        with self._lock:
            for i, known in enumerate(self._urls):
                if (known.scheme, known.host, known.port) == (u.scheme, u.host, u.port) \
                        and i == self._current:
                    self._current = (i + 1) % len(self._urls)
                    return

    def _moved_on(self, index: int) -> None:
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % len(self._urls)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            start, count = self._current, len(self._urls)
        for step in range(count):
            index = (start + step) % count
            with self._lock:
                target = self._urls[index]
            request.url = request.url.copy_with(scheme=target.scheme, host=target.host,
                                                port=target.port)
            request.headers["host"] = target.netloc.decode("ascii")
            try:
                return super().handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                self._moved_on(index)
                if step == count - 1:
                    raise
            except httpx.TransportError:
                self._moved_on(index)
                raise
        raise AssertionError("unreachable")  # pragma: no cover
