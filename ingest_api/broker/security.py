"""Who may do what: API keys (stored hashed) and ACLs per principal, kept in one document.

The document lives in ``<data_dir>/security/security.json`` (mode 0600, replaced
atomically) for a broker on its own, or in the znode ``/lakelog/security`` for a cluster,
so that a key or ACL made through any broker works on every broker. It holds

- ``keys``: ``{key_id, principal, salt, digest, created_ms}``; ``digest`` is
  SHA-256 of salt + secret. Secrets are 256 random bits, so a fast hash is as good
  as a slow one here (nobody guesses 2^256) and keeps every request cheap; the
  secret itself is shown once, when the key is made, and never stored or logged.
- ``acls``: ``{principal, resource_type, resource_name, pattern_type, operation}``,
  Kafka's model without deny rules (``ingest_api.broker.acls``: what an ACL allows, and the
  principals' names).

- ``serial``: bumped by every write, so a reader never goes back to an older copy.

A server reloads the file when it changes (checked at most once a second), so
``lakelog acls``/``lakelog keys`` through another server process or by hand take
effect without a restart. The znode is changed only by conditional writes (two brokers
adding keys at once both land) and each broker's copy follows it by a watch, so a
request's check never waits on ZooKeeper.

Brokers authenticate to each other with keys of their own: principal ``broker-N`` (a
name users may not take) with cluster ``admin``, its secret in
``<data_dir>/security/broker.key``. A broker forwarding a user's request names the user
in the ``Lakelog-Principal`` header, and the receiver checks that user's ACLs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ingest_api.broker.acls import (
    CLUSTER,
    Acl,
    SecurityError,
    allows,
    broker_principal,
    is_broker_principal,
    valid_principal,
)
from ingest_api.broker.credentials import PRINCIPAL_HEADER, forward_headers, parse_credentials
from log_tables.files import atomic_write

if TYPE_CHECKING:  # a broker on its own never loads kazoo
    from cluster.znode import VersionedZnode

__all__ = [  # the names of acls and credentials stay importable here, where callers found them
    "CLUSTER", "KEY_PREFIX", "PRINCIPAL_HEADER", "RELOAD_CHECK_S", "ZNODE_PATH", "Acl",
    "ApiKey", "SecurityError", "SecurityStore", "broker_principal", "forward_headers",
    "is_broker_principal", "parse_credentials", "valid_principal",
]
log = logging.getLogger(__name__)

KEY_PREFIX = "llk_"
RELOAD_CHECK_S = 1.0
ZNODE_PATH = "/lakelog/security"


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


@dataclass(slots=True)
class _Document:
    """The keys and ACLs as stored (a mutable working copy)."""

    keys: dict[str, ApiKey]
    acls: list[Acl]
    serial: int = 0

    @classmethod
    def decode(cls, raw: bytes | None, where: str) -> _Document:
        if not raw:
            return cls({}, [])
        try:
            doc = json.loads(raw)
            keys = {k["key_id"]: ApiKey(**k) for k in doc.get("keys", [])}
            acls = [Acl(**a) for a in doc.get("acls", [])]
            serial = int(doc.get("serial", 0))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SecurityError(f"{where}: unreadable ({exc}); fix or remove it") from None
        return cls(keys, acls, serial)

    def encode(self) -> bytes:
        return json.dumps({"serial": self.serial,
                           "keys": [asdict(k) for k in self.keys.values()],
                           "acls": [asdict(a) for a in self.acls]}, indent=1).encode()


def _new_key(principal: str) -> tuple[ApiKey, str]:
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return ApiKey(KEY_PREFIX + secrets.token_hex(8), principal, salt, _digest(salt, secret),
                  int(time.time() * 1000)), secret


def _write_secret(path: Path, text: str) -> None:
    """``text`` in ``path``, readable only by this user (its directory too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    old = os.umask(0o077)
    try:
        atomic_write(path, text.encode())
    finally:
        os.umask(old)


class SecurityStore:
    """The keys and ACLs of one data directory, or of the cluster when given its znode
    (thread-safe; checks read an in-memory copy)."""

    def __init__(self, data_dir: Path, znode: VersionedZnode | None = None) -> None:
        self.directory = Path(data_dir) / "security"
        self.path = self.directory / "security.json"
        self.admin_key_path = self.directory / "admin.key"
        self.broker_key_path = self.directory / "broker.key"
        self.znode = znode
        self._where = f"zookeeper:{znode.path}" if znode is not None else str(self.path)
        self._lock = threading.Lock()
        self._keys: dict[str, ApiKey] = {}
        self._acls: list[Acl] = []
        self._serial = -1
        self._mtime: int | None = None
        self._checked = 0.0
        if znode is None:
            self._load()
        else:  # the first call is synchronous: the copy is current once this returns
            znode.watch(self._on_znode)

    # ---- persistence -------------------------------------------------------------------

    def _install(self, doc: _Document, force: bool = False) -> None:
        """Make ``doc`` the copy checks read unless it is older than the one held (a
        watch may deliver what it read before this store's own newer write)."""
        with self._lock:
            if force or doc.serial >= self._serial:
                self._keys, self._acls, self._serial = doc.keys, doc.acls, doc.serial

    def _on_znode(self, data: bytes | None) -> None:
        try:
            doc = _Document.decode(data, self._where)
        except SecurityError as exc:  # keep serving the last good copy
            log.error("%s", exc)
            return
        self._install(doc, force=data is None)  # a deleted node is honoured at once

    def _load(self) -> None:
        if self.znode is not None:
            return  # the watch keeps the copy current
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._keys, self._acls, self._serial, self._mtime = {}, [], -1, None
            return
        if st.st_mtime_ns == self._mtime:
            return
        doc = _Document.decode(self.path.read_bytes(), self._where)
        self._keys, self._acls, self._serial = doc.keys, doc.acls, doc.serial
        self._mtime = st.st_mtime_ns

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            self._load()

    def _change(self, fn: Callable[[_Document], bool]) -> bool:
        """Apply ``fn`` to a copy of the document (it returns whether it changed it) and
        store the result. In ZooKeeper: a conditional write, re-applied to the newer
        document when another broker wrote first, so ``fn`` must be pure."""
        if self.znode is None:
            with self._lock:
                self._load()
                doc = _Document(dict(self._keys), list(self._acls), self._serial)
                if not fn(doc):
                    return False
                doc.serial += 1
                self._save(doc)
                return True
        changed = False

        def apply(data: bytes | None) -> bytes | None:
            nonlocal changed
            doc = _Document.decode(data, self._where)
            changed = fn(doc)
            if not changed:
                return None
            doc.serial += 1
            return doc.encode()

        stored = self.znode.update(apply)  # no lock held: the watch must never wait
        self._install(_Document.decode(stored, self._where))
        return changed

    def _save(self, doc: _Document) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        old = os.umask(0o077)
        try:
            atomic_write(self.path, doc.encode())
        finally:
            os.umask(old)
        self._keys, self._acls, self._serial = doc.keys, doc.acls, doc.serial
        self._mtime = self.path.stat().st_mtime_ns

    # ---- keys --------------------------------------------------------------------------

    def create_key(self, principal: str) -> tuple[ApiKey, str]:
        """A new key for ``principal``: (the stored key, the secret, shown only now)."""
        if not valid_principal(principal):
            raise SecurityError("principal must be 1-200 characters of [A-Za-z0-9._@-]")
        if is_broker_principal(principal):
            raise SecurityError(f"principal '{principal}' is reserved: broker-<id> names "
                                "the brokers, which make their own keys; choose another name")
        key, secret = _new_key(principal)

        def add(doc: _Document) -> bool:
            doc.keys[key.key_id] = key
            return True

        self._change(add)
        return key, secret

    def delete_key(self, key_id: str) -> bool:
        return self._change(lambda doc: doc.keys.pop(key_id, None) is not None)

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

        def add(doc: _Document) -> bool:
            if acl in doc.acls:
                return False
            doc.acls.append(acl)
            return True

        return self._change(add)

    def remove_acl(self, acl: Acl) -> bool:
        def remove(doc: _Document) -> bool:
            if acl not in doc.acls:
                return False
            doc.acls.remove(acl)
            return True

        return self._change(remove)

    def acls(self, principal: str | None = None) -> list[Acl]:
        with self._lock:
            self._refresh()
            return [a for a in self._acls if principal is None or a.principal == principal]

    def allowed(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        with self._lock:
            self._refresh()
            acls = [a for a in self._acls if a.principal == principal]
        return allows(acls, resource_type, name, operation)

    # ---- the first admin and the brokers' own keys -------------------------------------

    def _add_admin_key(self, key: ApiKey, only_if: Callable[[_Document], bool]) -> bool:
        """Store ``key`` with cluster ``admin`` for its principal, in one write, when
        ``only_if`` holds for the document (checked again on every retry)."""
        admin = Acl(key.principal, "cluster", CLUSTER, "literal", "admin")

        def add(doc: _Document) -> bool:
            if not only_if(doc):
                return False
            doc.keys[key.key_id] = key
            if admin not in doc.acls:
                doc.acls.append(admin)
            return True

        return self._change(add)

    def bootstrap(self) -> Path | None:
        """With no key at all (brokers' own keys aside), make an ``admin`` principal with a
        key and write the key (``id:secret``, mode 0600) to ``security/admin.key``; returns
        that path, or None when keys exist already. In a cluster one conditional write
        decides, so only the first broker to start makes it (in its own data directory)."""
        with self._lock:
            self._refresh()
            if any(not is_broker_principal(k.principal) for k in self._keys.values()):
                return None
        key, secret = _new_key("admin")
        if not self._add_admin_key(key, lambda doc: all(
                is_broker_principal(k.principal) for k in doc.keys.values())):
            return None
        _write_secret(self.admin_key_path, f"{key.key_id}:{secret}\n")
        return self.admin_key_path

    def broker_credentials(self, broker_id: int) -> str:
        """Broker ``broker_id``'s own key as ``key_id:secret``: the one in
        ``security/broker.key`` while the store still knows it, else a new key for
        ``broker-N`` with cluster ``admin`` (replacing that principal's older keys) written
        there, mode 0600.

        1. store the new key (and the ACL) in one write; 2. write broker.key. A crash
        between them leaves a key nobody holds, replaced at the next start."""
        principal = broker_principal(broker_id)
        try:
            held = self.broker_key_path.read_text().strip()
        except FileNotFoundError:
            held = ""
        key_id, _, secret = held.partition(":")
        if key_id and secret and self.authenticate(key_id, secret) == principal:
            return held
        key, secret = _new_key(principal)

        def replace_older(doc: _Document) -> bool:
            for old in [k for k, v in doc.keys.items() if v.principal == principal]:
                del doc.keys[old]
            return True

        self._add_admin_key(key, replace_older)
        credentials = f"{key.key_id}:{secret}"
        _write_secret(self.broker_key_path, credentials + "\n")
        return credentials
