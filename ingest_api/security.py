"""Who may do what: API keys (stored hashed) and ACLs per principal, kept in one file.

``<data_dir>/security/security.json`` (mode 0600, replaced atomically) holds

- ``keys``: ``{key_id, principal, salt, digest, created_ms}``; ``digest`` is
  SHA-256 of salt + secret. Secrets are 256 random bits, so a fast hash is as good
  as a slow one here (nobody guesses 2^256) and keeps every request cheap; the
  secret itself is shown once, when the key is made, and never stored or logged.
- ``acls``: ``{principal, resource_type, resource_name, pattern_type, operation}``,
  Kafka's model without deny rules: ``topic``/``group`` resources by exact name
  (``literal``) or ``prefixed``; operations ``produce``, ``consume``, ``describe``,
  ``alter``, ``delete`` (topics), ``consume``, ``commit``, ``describe``, ``alter``,
  ``delete`` (groups), and ``admin`` on the ``cluster``, which allows everything
  (Kafka's super users): topic creation, ACL and key changes among it.
  Any operation on a resource implies ``describe`` of it, as in Kafka.

A server reloads the file when it changes (checked at most once a second), so
``lakelog acls``/``lakelog keys`` through another server process or by hand take
effect without a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from log_tables.files import atomic_write

RESOURCE_TYPES = ("topic", "group", "cluster")
PATTERN_TYPES = ("literal", "prefixed")
OPERATIONS = {
    "topic": ("produce", "consume", "describe", "alter", "delete"),
    "group": ("consume", "commit", "describe", "alter", "delete"),
    "cluster": ("describe", "admin"),
}
CLUSTER = "lakelog"
KEY_PREFIX = "llk_"
RELOAD_CHECK_S = 1.0


class SecurityError(ValueError):
    """A bad key or ACL definition (the message says what to fix)."""


@dataclass(frozen=True, slots=True)
class Acl:
    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str

    def __post_init__(self) -> None:
        if not _valid_principal(self.principal):
            raise SecurityError("principal must be 1-200 characters of [A-Za-z0-9._@-]")
        if self.resource_type not in RESOURCE_TYPES:
            raise SecurityError(f"resource_type must be one of {', '.join(RESOURCE_TYPES)}")
        if self.pattern_type not in PATTERN_TYPES:
            raise SecurityError(f"pattern_type must be one of {', '.join(PATTERN_TYPES)}")
        allowed = OPERATIONS[self.resource_type]
        if self.operation not in allowed:
            raise SecurityError(f"operation on a {self.resource_type} must be one of "
                                f"{', '.join(allowed)}")
        if self.resource_type == "cluster" and (self.resource_name, self.pattern_type) != (
                CLUSTER, "literal"):
            raise SecurityError(f"the cluster resource is named '{CLUSTER}' (literal)")
        if not self.resource_name or len(self.resource_name) > 249:
            raise SecurityError("resource_name must be 1-249 characters")

    def covers(self, resource_type: str, name: str) -> bool:
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == "literal":
            return name == self.resource_name
        return name.startswith(self.resource_name)


def _valid_principal(name: str) -> bool:
    return 0 < len(name) <= 200 and all(c.isalnum() or c in "._@-" for c in name) and name.isascii()


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    principal: str
    salt: str
    digest: str
    created_ms: int

    def public(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "principal": self.principal,
                "created_ms": self.created_ms}


def _digest(salt: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt) + secret.encode()).hexdigest()


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


class SecurityStore:
    """The keys and ACLs of one data directory (thread-safe)."""

    def __init__(self, data_dir: Path) -> None:
        self.directory = Path(data_dir) / "security"
        self.path = self.directory / "security.json"
        self.admin_key_path = self.directory / "admin.key"
        self._lock = threading.Lock()
        self._keys: dict[str, ApiKey] = {}
        self._acls: list[Acl] = []
        self._mtime: int | None = None
        self._checked = 0.0
        self._load()

    # ---- persistence -------------------------------------------------------------------

    def _load(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._keys, self._acls, self._mtime = {}, [], None
            return
        if st.st_mtime_ns == self._mtime:
            return
        try:
            doc = json.loads(self.path.read_bytes())
            keys = {k["key_id"]: ApiKey(**k) for k in doc.get("keys", [])}
            acls = [Acl(**a) for a in doc.get("acls", [])]
        except (ValueError, TypeError, KeyError) as exc:
            raise SecurityError(f"{self.path}: unreadable ({exc}); fix or remove it") from None
        self._keys, self._acls, self._mtime = keys, acls, st.st_mtime_ns

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            self._load()

    def _save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        doc = {"keys": [asdict(k) for k in self._keys.values()],
               "acls": [asdict(a) for a in self._acls]}
        old = os.umask(0o077)
        try:
            atomic_write(self.path, json.dumps(doc, indent=1).encode())
        finally:
            os.umask(old)
        self._mtime = self.path.stat().st_mtime_ns

    # ---- keys --------------------------------------------------------------------------

    def create_key(self, principal: str) -> tuple[ApiKey, str]:
        """A new key for ``principal``: (the stored key, the secret, shown only now)."""
        if not _valid_principal(principal):
            raise SecurityError("principal must be 1-200 characters of [A-Za-z0-9._@-]")
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        key = ApiKey(KEY_PREFIX + secrets.token_hex(8), principal, salt, _digest(salt, secret),
                     int(time.time() * 1000))
        with self._lock:
            self._load()
            self._keys[key.key_id] = key
            self._save()
        return key, secret

    def delete_key(self, key_id: str) -> bool:
        with self._lock:
            self._load()
            if self._keys.pop(key_id, None) is None:
                return False
            self._save()
            return True

    def api_keys(self) -> list[ApiKey]:
        with self._lock:
            self._refresh()
            return sorted(self._keys.values(), key=lambda k: (k.principal, k.created_ms))

    def authenticate(self, key_id: str, secret: str) -> str | None:
        """The key's principal if the secret is right, else None (constant-time compare)."""
        with self._lock:
            self._refresh()
            key = self._keys.get(key_id)
        if key is None:
            _digest("00" * 16, secret)  # the same work either way
            return None
        return key.principal if hmac.compare_digest(key.digest, _digest(key.salt, secret)) else None

    # ---- ACLs --------------------------------------------------------------------------

    def add_acl(self, acl: Acl) -> bool:
        """Add ``acl``; False if it was there already."""
        with self._lock:
            self._load()
            if acl in self._acls:
                return False
            self._acls.append(acl)
            self._save()
            return True

    def remove_acl(self, acl: Acl) -> bool:
        with self._lock:
            self._load()
            if acl not in self._acls:
                return False
            self._acls.remove(acl)
            self._save()
            return True

    def acls(self, principal: str | None = None) -> list[Acl]:
        with self._lock:
            self._refresh()
            return [a for a in self._acls if principal is None or a.principal == principal]

    def allowed(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        with self._lock:
            self._refresh()
            acls = [a for a in self._acls if a.principal == principal]
        for a in acls:
            if a.resource_type == "cluster" and a.operation == "admin":
                return True
            if a.covers(resource_type, name) and (
                    a.operation == operation or operation == "describe"):
                return True
        return False

    # ---- the first admin ---------------------------------------------------------------

    def bootstrap(self) -> Path | None:
        """With no key at all, make an ``admin`` principal with a key and write the key
        (``id:secret``, mode 0600) to ``security/admin.key``; returns that path, or None
        when keys exist already."""
        with self._lock:
            self._load()
            if self._keys:
                return None
        key, secret = self.create_key("admin")
        self.add_acl(Acl("admin", "cluster", CLUSTER, "literal", "admin"))
        old = os.umask(0o077)
        try:
            atomic_write(self.admin_key_path, f"{key.key_id}:{secret}\n".encode())
        finally:
            os.umask(old)
        return self.admin_key_path
