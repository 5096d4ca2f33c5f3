"""How a caller presents an API key, and how a broker acting for a user says so.

A key travels in the ``Authorization`` header, as ``Basic base64(KEY_ID:SECRET)`` (what
HTTP clients and JDBC send) or ``Bearer KEY_ID.SECRET`` (Spark Connect's token). A
broker forwarding a user's request authenticates with its own key and names the user in
the ``Lakelog-Principal`` header; the receiver checks that user's ACLs (and takes the
header from brokers only: ``ingest_api.http.auth``). ``ingest_api.broker.security`` holds the keys.
"""

from __future__ import annotations

import base64

PRINCIPAL_HEADER = "Lakelog-Principal"


def parse_credentials(header: str | None) -> tuple[str, str] | None:
    """(key id, secret) from ``Basic base64(id:secret)`` or ``Bearer id.secret``; None
    when the header is missing or malformed."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    try:
        if scheme.lower() == "basic":
            key_id, sep, secret = base64.b64decode(value, validate=True).decode().partition(":")
        elif scheme.lower() == "bearer":
            key_id, sep, secret = value.partition(".")
        else:
            return None
    except (ValueError, UnicodeDecodeError):
        return None
    return (key_id, secret) if sep and key_id and secret else None


def forward_headers(credentials: str, principal: str | None) -> dict[str, str]:
    """Headers of a request one broker sends another: its own key (``key_id:secret``, as
    ``broker_credentials`` gives it) and, when it acts for a user, that user's principal,
    whose ACLs the receiver then checks."""
    token = base64.b64encode(credentials.encode()).decode()
    headers = {"Authorization": f"Basic {token}"}
    if principal is not None:
        headers[PRINCIPAL_HEADER] = principal
    return headers
