"""Security shared by a cluster: keys and ACLs in one znode, brokers' own keys, and the
``Lakelog-Principal`` header of forwarded requests.

Each broker is a ``SecurityStore`` with its own data directory and its own ZooKeeper
session, against a real ZooKeeper (one per module, a fresh chroot per test)."""

from __future__ import annotations

import asyncio
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from kazoo.client import KazooClient

from cluster import znode as znode_module
from cluster.znode import VersionedZnode, ZnodeContendedError
from ingest_api.broker.security import (
    ZNODE_PATH,
    Acl,
    SecurityError,
    SecurityStore,
    forward_headers,
)
from ingest_api.http import errors
from ingest_api.http.auth import AuthMiddleware, may, require
from lakelog.zookeeper import ZooKeeperServer
from tests.server import CLUSTER, ServerProcess

WAIT_S = 10.0
STRING = {"type": "STRING", "data": "hello"}


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s}s: {what}")
        time.sleep(0.02)


pytestmark = pytest.mark.slow  # a real ZooKeeper (the session's, tests/cluster/conftest.py)


@pytest.fixture
def zk_session(zookeeper: ZooKeeperServer, chroot: str) -> Iterator[Callable[[], KazooClient]]:
    """Factory of ZooKeeper sessions (one per broker) chrooted to this test's own path."""
    clients: list[KazooClient] = []

    def connect() -> KazooClient:
        client = KazooClient(hosts=zookeeper.connect + chroot)
        client.start(timeout=30)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def broker_store(tmp_path: Path,
                 zk_session: Callable[[], KazooClient]) -> Callable[[int], SecurityStore]:
    """``broker_store(n)``: broker n's store (data dir ``b<n>``) on a session of its own."""

    def make(n: int) -> SecurityStore:
        return SecurityStore(tmp_path / f"b{n}", VersionedZnode(zk_session(), ZNODE_PATH))

    return make


# ---- the znode ------------------------------------------------------------------------


def test_znode_updates_are_conditional_and_watched(
        zk_session: Callable[[], KazooClient], monkeypatch: pytest.MonkeyPatch) -> None:
    a = VersionedZnode(zk_session(), "/x/counter")
    b = VersionedZnode(zk_session(), "/x/counter")
    assert a.read() == (None, -1)
    assert a.update(lambda data: None) == b"" and a.read() == (None, -1)
    seen: list[bytes | None] = []
    b.watch(seen.append)
    assert seen == [None]  # called at once
    assert a.update(lambda data: b"0") == b"0"
    assert b.read() == (b"0", 0)

    # Two sessions incrementing at once: every increment lands (a plain set would lose some).
    start = threading.Barrier(2)

    def bump(node: VersionedZnode) -> None:
        start.wait()
        for _ in range(25):
            node.update(lambda data: str(int(data or b"0") + 1).encode())

    threads = [threading.Thread(target=bump, args=(n,)) for n in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert b.read() == (b"50", 50)
    wait_for(lambda: seen[-1] == b"50", "the watch sees the last write")

    # A writer that always loses gives up with a retriable error instead of spinning.
    monkeypatch.setattr(znode_module, "MAX_UPDATE_ATTEMPTS", 3)
    rival = zk_session()

    def always_overtaken(data: bytes | None) -> bytes:
        rival.set("/x/counter", b"rival")
        return b"mine"

    with pytest.raises(ZnodeContendedError) as lost:
        a.update(always_overtaken)
    assert lost.value.retriable and a.read()[0] == b"rival"


# ---- keys and ACLs across brokers -----------------------------------------------------


def test_keys_and_acls_made_on_one_broker_work_on_another(
        tmp_path: Path, broker_store: Callable[[int], SecurityStore]) -> None:
    one, two = broker_store(1), broker_store(2)
    key, secret = one.create_key("alice")
    assert one.authenticate(key.key_id, secret) == "alice"  # its own write, at once
    wait_for(lambda: two.authenticate(key.key_id, secret) == "alice", "alice's key on broker 2")
    assert two.authenticate(key.key_id, secret + "x") is None

    orders = Acl("alice", "topic", "orders", "literal", "produce")
    assert two.add_acl(orders) and not two.add_acl(orders)
    wait_for(lambda: one.allowed("alice", "topic", "orders", "produce"), "the ACL on broker 1")
    assert not one.allowed("alice", "topic", "payments", "produce")
    assert one.acls("alice") == [orders]

    # Nothing is kept in the data directories: the znode is the one copy.
    assert not (tmp_path / "b1" / "security" / "security.json").exists()
    # A broker starting later is current as soon as its store exists.
    three = broker_store(3)
    assert three.authenticate(key.key_id, secret) == "alice" and three.acls() == [orders]

    assert two.delete_key(key.key_id) and not two.delete_key(key.key_id)
    wait_for(lambda: one.authenticate(key.key_id, secret) is None, "the revoked key on broker 1")
    wait_for(lambda: three.authenticate(key.key_id, secret) is None, "... and on broker 3")
    assert one.remove_acl(orders)
    wait_for(lambda: not two.allowed("alice", "topic", "orders", "produce"),
             "the removed ACL on broker 2")


def test_keys_created_at_once_on_two_brokers_all_survive(
        broker_store: Callable[[int], SecurityStore]) -> None:
    stores = [broker_store(1), broker_store(2)]
    made: list[list[tuple[str, str, str]]] = [[], []]
    start = threading.Barrier(2)

    def create(i: int) -> None:
        start.wait()
        for j in range(15):
            key, secret = stores[i].create_key(f"user-{i}-{j}")
            made[i].append((key.key_id, secret, key.principal))

    threads = [threading.Thread(target=create, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = made[0] + made[1]
    assert len(every) == 30
    for store in stores:
        wait_for(lambda store=store: len(store.api_keys()) == 30,  # type: ignore[misc]
                 "all 30 keys in each broker's copy")
        for key_id, secret, principal in every:
            assert store.authenticate(key_id, secret) == principal


def test_a_late_watch_copy_never_replaces_a_newer_one(
        broker_store: Callable[[int], SecurityStore]) -> None:
    """The watch may deliver what it read before this broker's own later write; the
    ``serial`` keeps the newer copy."""
    store = broker_store(1)
    store.create_key("alice")
    assert store.znode is not None
    older, _ = store.znode.read()
    key, secret = store.create_key("bob")
    store._on_znode(older)  # what a slow watch would hand over
    assert store.authenticate(key.key_id, secret) == "bob"


# ---- brokers' own keys and the first admin --------------------------------------------


def test_broker_credentials_are_made_once_kept_and_reserved(
        tmp_path: Path, broker_store: Callable[[int], SecurityStore]) -> None:
    one, two = broker_store(1), broker_store(2)
    credentials = one.broker_credentials(1)
    key_id, _, secret = credentials.partition(":")
    key_file = tmp_path / "b1" / "security" / "broker.key"
    assert key_file.read_text().strip() == credentials
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert credentials not in (one.znode.read()[0] or b"").decode()  # type: ignore[union-attr]
    wait_for(lambda: two.authenticate(key_id, secret) == "broker-1", "broker 1's key on broker 2")
    assert two.allowed("broker-1", "cluster", "lakelog", "admin")

    # Restarted: the same key. Broker 2 gets its own.
    assert broker_store(1).broker_credentials(1) == credentials
    assert two.broker_credentials(2).split(":")[0] != key_id

    # Users may not take a broker's name.
    for reserved in ("broker-1", "broker-3", "broker-007"):
        with pytest.raises(SecurityError, match="reserved"):
            two.create_key(reserved)
    for ordinary in ("broker", "broker-1a", "brokers-1", "my-broker-1"):
        two.create_key(ordinary)

    # Revoked by an admin: the next start makes a new key and drops the old one.
    assert two.delete_key(key_id)
    restarted = broker_store(1)
    wait_for(lambda: restarted.authenticate(key_id, secret) is None, "the revoked broker key")
    fresh = restarted.broker_credentials(1)
    assert fresh != credentials and key_file.read_text().strip() == fresh
    assert [k.principal for k in restarted.api_keys()].count("broker-1") == 1


def test_only_the_first_broker_makes_the_admin_key(
        tmp_path: Path, broker_store: Callable[[int], SecurityStore]) -> None:
    stores = [broker_store(n) for n in (1, 2, 3)]
    for n, store in enumerate(stores, 1):
        store.broker_credentials(n)  # brokers' keys do not count as "keys exist"
    results: list[Path | None] = [None] * 3
    start = threading.Barrier(3)

    def boot(i: int) -> None:
        start.wait()
        results[i] = stores[i].bootstrap()

    threads = [threading.Thread(target=boot, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    made = [p for p in results if p is not None]
    assert len(made) == 1, results
    winner = results.index(made[0]) + 1
    assert made[0] == tmp_path / f"b{winner}" / "security" / "admin.key"
    for n in (1, 2, 3):
        assert (tmp_path / f"b{n}" / "security" / "admin.key").exists() == (n == winner)
    key_id, _, secret = made[0].read_text().strip().partition(":")
    for store in stores:
        wait_for(lambda store=store: store.authenticate(key_id, secret) == "admin",  # type: ignore[misc]
                 "the admin key on every broker")
        assert [k.principal for k in store.api_keys()].count("admin") == 1
        assert store.allowed("admin", "cluster", "lakelog", "admin")
        assert store.bootstrap() is None


# ---- forwarded requests ---------------------------------------------------------------


def _app(store: SecurityStore | None) -> FastAPI:
    """The auth middleware in front of two routes that answer who they saw."""
    app = FastAPI()
    errors.install(app)
    app.state.security = store
    app.add_middleware(AuthMiddleware, store=store)

    @app.post(CLUSTER + "/topics/{name}/records")
    async def produce(request: Request) -> JSONResponse:
        return JSONResponse({"principal": request.state.principal,
                             "forwarded_by": request.state.forwarded_by})

    @app.post(CLUSTER + "/consumer-groups/{name}/offsets")
    async def commit(request: Request) -> JSONResponse:
        require(request, "group", "billing", "commit")  # a check a router makes itself
        return JSONResponse({"principal": request.state.principal,
                             "may_describe_orders": may(request, "topic", "orders", "describe")})

    return app


def _post(app: FastAPI, path: str, headers: dict[str, str]) -> httpx.Response:
    """One request through ``app`` in this process."""

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://broker-2") as client:
            return await client.post(path, headers=headers)

    return asyncio.run(send())


def test_a_broker_acts_for_the_user_it_names_and_users_cannot(
        broker_store: Callable[[int], SecurityStore]) -> None:
    one, two = broker_store(1), broker_store(2)
    alice_key, alice_secret = two.create_key("alice")
    two.add_acl(Acl("alice", "topic", "orders", "literal", "produce"))
    broker_one = one.broker_credentials(1)  # broker 1 forwards to broker 2
    wait_for(lambda: two.authenticate(*broker_one.split(":")) == "broker-1", "broker 1's key")
    alice = {"Authorization": f"Bearer {alice_key.key_id}.{alice_secret}"}

    app = _app(two)
    # A user naming someone else is refused, whoever it names.
    for named in ("admin", "alice", "broker-1"):
        r = _post(app, CLUSTER + "/topics/orders/records",
                  headers={**alice, "Lakelog-Principal": named})
        assert r.status_code == 403, named
        assert r.json()["error"] == "impersonation_refused"
        assert r.json()["error_code"] == 40302 and "Lakelog-Principal" in r.json()["message"]
    assert _post(app, CLUSTER + "/topics/orders/records", headers=alice).json() == {
        "principal": "alice", "forwarded_by": None}

    # Broker 1 for alice: alice's ACLs, not the broker's admin.
    for_alice = forward_headers(broker_one, "alice")
    assert _post(app, CLUSTER + "/topics/orders/records", headers=for_alice).json() == {
        "principal": "alice", "forwarded_by": "broker-1"}
    denied = _post(app, CLUSTER + "/topics/payments/records", headers=for_alice)
    assert denied.status_code == 403 and denied.json()["error"] == "authorization_failed"
    assert "'alice'" in denied.json()["message"]
    # ... in the routers' own checks (require/may) too.
    r = _post(app, CLUSTER + "/consumer-groups/billing/offsets", headers=for_alice)
    assert r.status_code == 403 and "'alice'" in r.text
    two.add_acl(Acl("alice", "group", "billing", "literal", "commit"))
    assert _post(app, CLUSTER + "/consumer-groups/billing/offsets", headers=for_alice).json() == {
        "principal": "alice", "may_describe_orders": True}

    # Broker 1 for itself: cluster admin.
    assert _post(app, CLUSTER + "/topics/payments/records",
                 headers=forward_headers(broker_one, None)).json() == {
        "principal": "broker-1", "forwarded_by": None}
    bad = _post(app, CLUSTER + "/topics/orders/records",
                headers=forward_headers(broker_one, "not a name"))
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_principal"
    # A broker key with a wrong secret is just a wrong key.
    key_id = broker_one.split(":")[0]
    assert _post(app, CLUSTER + "/topics/orders/records", headers=forward_headers(
        f"{key_id}:wrong", "alice")).status_code == 401

    # Authentication off: the header means nothing.
    assert _post(_app(None), CLUSTER + "/topics/orders/records",
                 headers={"Lakelog-Principal": "alice"}).json() == {
        "principal": None, "forwarded_by": None}


def test_a_real_server_checks_the_named_principal(tmp_path: Path) -> None:
    """``lakelog serve`` with authentication on (a broker on its own, the file store):
    a broker key made beside it is honoured once the server reloads the file."""
    server = ServerProcess(tmp_path / "data", env={"LAKELOG_AUTH": "api-key"}).start()
    try:
        admin_key = (server.data_dir / "security" / "admin.key").read_text().strip()
        with server.client(auth=tuple(admin_key.split(":"))) as admin:
            for name in ("orders", "payments"):
                assert admin.post("/topics", json={"topic_name": name, "partitions_count": 1}
                                  ).status_code == 201
            refused = admin.post("/api-keys", json={"principal": "broker-1"})
            assert refused.status_code == 400 and refused.json()["error"] == "invalid_principal"
            alice = admin.post("/api-keys", json={"principal": "alice"}).json()
            assert admin.post("/acls", json={
                "principal": "alice", "operation": "produce", "resource_type": "topic",
                "resource_name": "orders"}).status_code == 201
        broker = SecurityStore(server.data_dir).broker_credentials(1)
        url = server.url + CLUSTER

        def broker_accepted() -> bool:
            return httpx.get(url + "/topics", headers=forward_headers(broker, None)
                             ).status_code == 200

        wait_for(broker_accepted, "the server reloading its key file")
        for_alice = forward_headers(broker, "alice")
        assert httpx.post(url + "/topics/orders/records", json={"value": STRING},
                          headers=for_alice).status_code == 200
        denied = httpx.post(url + "/topics/payments/records", json={"value": STRING},
                            headers=for_alice)
        assert denied.status_code == 403 and "'alice'" in denied.json()["message"]
        assert [t["topic_name"] for t in httpx.get(url + "/topics", headers=for_alice)
                .json()["data"]] == ["orders"]  # lists filtered for alice, not the broker
        as_alice = httpx.post(url + "/topics/orders/records", json={"value": STRING},
                              auth=(alice["key_id"], alice["secret"]),
                              headers={"Lakelog-Principal": "admin"})
        assert as_alice.status_code == 403 and as_alice.json()["error"] == "impersonation_refused"
    finally:
        server.stop()
