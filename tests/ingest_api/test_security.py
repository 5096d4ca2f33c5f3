"""API keys, ACLs, TLS and the refusal to serve beyond loopback without authentication.

Real ``lakelog serve`` processes with authentication on (tests/server.py turns it off
for every other test)."""

from __future__ import annotations

import os
import re
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest_api.broker import security
from ingest_api.broker.security import Acl, SecurityError, SecurityStore, parse_credentials
from ingest_api.http.app import create_app
from ingest_api.http.auth import ADMIN, OPEN_PATHS, rule_for
from ingest_api.settings import ApiSettings
from tests.server import CLUSTER, ServerProcess

LAKELOG = Path(sys.executable).parent / "lakelog"
STRING = {"type": "STRING", "data": "hello"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data", env={"LAKELOG_AUTH": "api-key",
                                                "LAKELOG_LOG_LEVEL": "info"}).start()
    yield srv
    srv.stop()


def _client(server: ServerProcess, key: str | None, bearer: bool = False) -> httpx.Client:
    if key is None:
        return server.client()
    key_id, _, secret = key.partition(":")
    if bearer:
        return server.client(headers={"Authorization": f"Bearer {key_id}.{secret}"})
    return server.client(auth=(key_id, secret))


def _admin_key(server: ServerProcess) -> str:
    return (server.data_dir / "security" / "admin.key").read_text().strip()


def test_first_start_makes_an_admin_key_stored_hashed(server: ServerProcess) -> None:
    key_file = server.data_dir / "security" / "admin.key"
    store_file = server.data_dir / "security" / "security.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(store_file.stat().st_mode) == 0o600
    key_id, _, secret = _admin_key(server).partition(":")
    assert key_id.startswith("llk_") and len(secret) >= 40
    stored = store_file.read_text()
    assert key_id in stored and secret not in stored  # only the salted digest
    with _client(server, _admin_key(server)) as admin:
        assert admin.get("/topics").status_code == 200
    assert secret not in server.log() and str(key_file) in server.log()


def test_no_wrong_or_malformed_credentials_are_401(server: ServerProcess) -> None:
    key_id, _, secret = _admin_key(server).partition(":")
    assert httpx.get(server.url + "/healthz").status_code == 200  # liveness stays open
    for headers in ({}, {"Authorization": "Basic bm90LWJhc2U2NA=="},
                    {"Authorization": "Digest abc"}, {"Authorization": f"Bearer {key_id}.x"}):
        r = httpx.get(server.url + CLUSTER + "/topics", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"] == "authentication_failed" and r.json()["error_code"] == 40101
        assert "Basic" in r.headers["www-authenticate"]
    r = httpx.get(server.url + CLUSTER + "/topics", auth=(key_id, secret + "x"))
    assert r.status_code == 401 and secret not in r.text
    assert httpx.get(server.url + "/metrics").status_code == 401


def test_acls_allow_exactly_what_they_say(server: ServerProcess) -> None:
    with _client(server, _admin_key(server)) as admin:
        for name in ("orders", "orders-eu", "payments"):
            assert admin.post("/topics", json={"topic_name": name, "partitions_count": 1}
                              ).status_code == 201
        alice = admin.post("/api-keys", json={"principal": "alice"}).json()
        alice_key = f"{alice['key_id']}:{alice['secret']}"
        for acl in ({"operation": "produce", "resource_type": "topic", "resource_name": "orders",
                     "pattern_type": "prefixed"},
                    {"operation": "consume", "resource_type": "topic", "resource_name": "orders"},
                    {"operation": "consume", "resource_type": "group",
                     "resource_name": "billing"},
                    {"operation": "commit", "resource_type": "group",
                     "resource_name": "billing"}):
            assert admin.post("/acls", json={"principal": "alice", **acl}).status_code == 201
        assert admin.post("/acls", json={"principal": "alice", "operation": "admin",
                                         "resource_type": "topic", "resource_name": "x"}
                          ).status_code == 400  # admin is a cluster operation

    with _client(server, alice_key) as c, _client(server, alice_key, bearer=True) as b:
        assert c.post("/topics/orders/records", json={"value": STRING}).status_code == 200
        assert b.post("/topics/orders-eu/records", json={"value": STRING}).status_code == 200
        assert c.get("/topics/orders/partitions/0/records?offset=0").status_code == 200
        # Prefixed produce does not give consume of orders-eu (consume is literal on orders).
        denied = c.get("/topics/orders-eu/partitions/0/records?offset=0")
        assert denied.status_code == 403
        assert denied.json()["error"] == "authorization_failed"
        # A topic that exists and one that does not are denied alike.
        exists = c.get("/topics/payments")
        missing = c.get("/topics/no-such-topic")
        assert exists.status_code == missing.status_code == 403
        assert exists.json()["message"].replace("payments", "T") == \
            missing.json()["message"].replace("no-such-topic", "T")
        assert c.post("/topics/payments/records", json={"value": STRING}).status_code == 403
        assert c.post("/topics", json={"topic_name": "mine", "partitions_count": 1}
                      ).status_code == 403
        assert c.delete("/topics/orders").status_code == 403
        assert c.get("/acls").status_code == 403 and c.post(
            "/api-keys", json={"principal": "alice"}).status_code == 403
        # Lists show only what alice may describe (produce/consume imply describe).
        assert sorted(t["topic_name"] for t in c.get("/topics").json()["data"]) == [
            "orders", "orders-eu"]
        # Groups: the group's ACL and each subscribed topic's consume ACL.
        joined = c.post("/consumer-groups/billing/members", json={"topics": ["orders"]})
        assert joined.status_code == 200, joined.text
        member = joined.json()
        assert c.post("/consumer-groups/billing/offsets", json={
            "member_id": member["member_id"], "member_epoch": member["member_epoch"],
            "offsets": [{"topic_name": "orders", "partition_id": 0, "offset": 1}]}
        ).status_code == 200
        assert c.post("/consumer-groups/billing/members",
                      json={"topics": ["payments"]}).status_code == 403
        assert c.post("/consumer-groups/other/members",
                      json={"topics": ["orders"]}).status_code == 403
        assert c.post("/consumer-groups/billing/offsets:reset",
                      json={"to": "earliest"}).status_code == 403
        assert [g["consumer_group_id"] for g in c.get("/consumer-groups").json()["data"]] == [
            "billing"]

    with _client(server, _admin_key(server)) as admin:
        assert admin.delete(f"/api-keys/{alice['key_id']}").status_code == 204
        metrics = admin.get(server.url + "/metrics").text
    with _client(server, alice_key) as c:
        assert c.get("/topics").status_code == 401  # revoked at once
    assert alice["secret"] not in server.log() and alice["secret"] not in metrics


def test_every_route_has_its_own_rule(tmp_path: Path) -> None:
    """Deny by default is a backstop: each endpoint should name what it needs."""
    app = create_app(ApiSettings(data_dir=tmp_path, auth="none"))
    paths = app.openapi()["paths"]
    assert len(paths) > 25
    for template, operations in paths.items():
        path = re.sub(r"\{[^}]+\}", "x1", template.replace("{cluster_id}", "lakelog"))
        for method in operations:
            if path in OPEN_PATHS:
                continue
            rule, name = rule_for(method.upper(), path)
            assert rule is not ADMIN, (method, template)
            if rule.resource_type in ("topic", "group"):
                assert name == "x1", (method, template)


def test_store_semantics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SecurityStore(tmp_path)
    key, secret = store.create_key("bob")
    assert store.authenticate(key.key_id, secret) == "bob"
    assert store.authenticate(key.key_id, secret[:-1]) is None
    assert store.authenticate("llk_nope", secret) is None
    store.add_acl(Acl("bob", "topic", "logs.", "prefixed", "consume"))
    assert store.allowed("bob", "topic", "logs.app", "consume")
    assert store.allowed("bob", "topic", "logs.app", "describe")  # implied
    assert not store.allowed("bob", "topic", "logs.app", "produce")
    assert not store.allowed("bob", "topic", "logs", "consume")
    assert not store.allowed("bob", "group", "logs.app", "consume")
    assert not store.allowed("carol", "topic", "logs.app", "consume")
    store.add_acl(Acl("bob", "group", "etl-", "prefixed", "commit"))
    assert store.allowed("bob", "group", "etl-daily", "commit")
    assert not store.allowed("bob", "group", "etl-daily", "alter")
    assert not store.allowed("bob", "group", "other", "commit")
    store.add_acl(Acl("carol", "cluster", "lakelog", "literal", "admin"))
    assert store.allowed("carol", "group", "anything", "delete")
    with pytest.raises(SecurityError, match="operation on a group"):
        Acl("bob", "group", "g", "literal", "produce")
    with pytest.raises(SecurityError, match="principal"):
        Acl("bob smith", "topic", "t", "literal", "produce")
    with pytest.raises(SecurityError, match="principal"):
        store.create_key("")
    # Another process (another store on the same file) sees changes within a second.
    monkeypatch.setattr(security, "RELOAD_CHECK_S", 0.0)
    other = SecurityStore(tmp_path)
    assert other.authenticate(key.key_id, secret) == "bob"
    store.delete_key(key.key_id)
    assert other.authenticate(key.key_id, secret) is None
    assert parse_credentials("Bearer llk_1.s3cret") == ("llk_1", "s3cret")
    assert parse_credentials("Basic bGxrXzE6czNjcmV0") == ("llk_1", "s3cret")
    for bad in (None, "", "Basic", "Basic !!!", "Bearer nodot", "Token a.b"):
        assert parse_credentials(bad) is None


def test_refuses_non_loopback_without_auth(tmp_path: Path) -> None:
    env = {**os.environ, "LAKELOG_TIER_INTERVAL_MS": "0"}
    out = subprocess.run([LAKELOG, "serve", "--data-dir", str(tmp_path), "--host", "0.0.0.0",
                          "--auth", "none"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1
    assert "refusing to listen on 0.0.0.0 without authentication" in out.stderr
    out = subprocess.run([LAKELOG, "serve", "--data-dir", str(tmp_path), "--tls-cert", "x.pem"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1 and "tls_cert and tls_key go together" in out.stderr
    # Not a security setting, but refused the same way at start: a warehouse on a store
    # lakelog cannot write (object stores: tests/s3/test_warehouse.py).
    out = subprocess.run([LAKELOG, "serve", "--data-dir", str(tmp_path), "--warehouse",
                          "hdfs://namenode/lakelog"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 1 and \
        "use a local or mounted path, or an object store (s3://, s3a://, gs://" in out.stderr


def test_tls_serves_https_only(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    server = ServerProcess(tmp_path / "data", env={"LAKELOG_TLS_CERT": str(cert_path),
                                                   "LAKELOG_TLS_KEY": str(key_path)})
    server.scheme = "https"
    server.verify = ssl.create_default_context(cafile=str(ca_path))
    server.start()
    try:
        https = f"https://127.0.0.1:{server.port}"
        assert httpx.get(https + "/healthz", verify=server.verify).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).raise_for_status()
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA
            httpx.get(https + "/healthz")
    finally:
        server.stop()
