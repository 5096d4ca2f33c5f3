"""HTTP to one server: credentials, TLS and the client every role of the client uses."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx

from lakelog.client.bootstrap import FailoverTransport, bootstrap_urls
from lakelog.profile import find_api_key

CLUSTER = "/v3/clusters/lakelog"


def default_api_key(url: str | Sequence[str]) -> str | None:
    """``LAKELOG_API_KEY``, else the profile's key (for its url), else (for a server on this
    machine only, so that a local admin key is never sent elsewhere) the admin key file of
    the local data directory. For several brokers, the key all of them would get (none
    when they differ: a key is never sent to a broker it was not found for)."""
    keys = {find_api_key(u).key for u in bootstrap_urls(url)}
    return keys.pop() if len(keys) == 1 else None


def tls_verify(verify: str | bool | ssl.SSLContext) -> bool | ssl.SSLContext:
    """httpx's ``verify`` from a CA bundle path, a context or a bool."""
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify


def http_auth(api_key: str | None) -> httpx.BasicAuth | None:
    """HTTP Basic credentials from ``<key id>:<secret>`` (None: send none)."""
    if api_key is None:
        return None
    key_id, sep, secret = api_key.partition(":")
    if not sep:
        raise ValueError("an API key is '<key id>:<secret>'")
    return httpx.BasicAuth(key_id, secret)


def authorization(api_key: str | None) -> str | None:
    """The ``Authorization`` header's value of ``http_auth`` (None: send none)."""
    if api_key is None:
        return None
    http_auth(api_key)  # the same check of the key's form
    return "Basic " + base64.b64encode(api_key.encode()).decode("ascii")


def api_client(url: str | Sequence[str], path: str, api_key: str | None,
               verify: str | bool | ssl.SSLContext, timeout_s: float) -> httpx.Client:
    """An httpx client for the API below ``url + CLUSTER + path``: the key (else the default
    one for ``url``), TLS verification and a timeout per request. ``url`` may name several
    brokers (``lakelog.client.bootstrap``): each request goes to one that is alive."""
    urls = bootstrap_urls(url)
    tls = tls_verify(verify)
    return httpx.Client(base_url=urls[0] + CLUSTER + path, timeout=timeout_s,
                        auth=http_auth(api_key or default_api_key(urls)), verify=tls,
                        transport=FailoverTransport(urls, verify=tls))


def transport_of(client: httpx.Client) -> FailoverTransport | None:
    """The client's failover transport (None for a client made otherwise)."""
    transport = client._transport  # httpx keeps no public handle on it
    return transport if isinstance(transport, FailoverTransport) else None


def find_coordinator(url: str | Sequence[str], group: str, api_key: str | None,
                     verify: str | bool | ssl.SSLContext, timeout_s: float) -> str:
    """The URL of the broker that coordinates ``group``, asked of any broker of ``url``
    (the broker that answered for a cluster of one, or the first of ``url`` when no
    answer comes: any broker forwards a group's requests)."""
    urls = bootstrap_urls(url)
    try:
        with api_client(urls, "", api_key, verify, timeout_s) as http:
            r = http.get(f"/consumer-groups/{group}/coordinator")
            answered = str(r.request.url.copy_with(path="/", query=None)).rstrip("/")
    except httpx.TransportError:
        return urls[0]
    if r.status_code != 200:
        return urls[0]
    body = r.json()
    if not body.get("host") or not body.get("port"):  # "this server" (a cluster of one)
        return answered
    return f"{urlsplit(urls[0]).scheme or 'http'}://{body['host']}:{body['port']}"
