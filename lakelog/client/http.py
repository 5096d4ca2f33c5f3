"""HTTP to one server: credentials, TLS and the client every role of the client uses."""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

import httpx

from lakelog.profile import find_api_key

CLUSTER = "/v3/clusters/lakelog"


def default_api_key(url: str) -> str | None:
    """``LAKELOG_API_KEY``, else the profile's key (for its url), else (for a server on this
    machine only, so that a local admin key is never sent elsewhere) the admin key file of
    the local data directory."""
    return find_api_key(url).key


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


def api_client(url: str, path: str, api_key: str | None, verify: str | bool | ssl.SSLContext,
               timeout_s: float) -> httpx.Client:
    """An httpx client for the API below ``url + CLUSTER + path``: the key (else the default
    one for ``url``), TLS verification and a timeout per request."""
    return httpx.Client(base_url=url.rstrip("/") + CLUSTER + path, timeout=timeout_s,
                        auth=http_auth(api_key or default_api_key(url)),
                        verify=tls_verify(verify))


def find_coordinator(url: str, group: str, api_key: str | None,
                     verify: str | bool | ssl.SSLContext, timeout_s: float) -> str:
    """The URL of the broker that coordinates ``group`` (``url`` itself for a cluster of
    one, or when the answer does not come: any broker forwards a group's requests)."""
    base = url.rstrip("/")
    try:
        with api_client(base, "", api_key, verify, timeout_s) as http:
            r = http.get(f"/consumer-groups/{group}/coordinator")
    except httpx.TransportError:
        return base
    if r.status_code != 200:
        return base
    body = r.json()
    if not body.get("host") or not body.get("port"):  # "this server" (a cluster of one)
        return base
    return f"{urlsplit(base).scheme or 'http'}://{body['host']}:{body['port']}"
