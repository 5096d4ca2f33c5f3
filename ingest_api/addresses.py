"""Which hosts are this machine: the server's ``auth=none`` check and the client's rule that
a local admin key is only sent to a local server both ask it. A module of its own, with no
imports of ours, so that the client can use it without loading the server."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 / ::1 addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
