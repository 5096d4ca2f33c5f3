"""Kafka's transactions over lakelog's HTTP API, against a real server: the coordinator's
protocol (init, add partitions, add offsets, commit, abort, time out), fencing of older
instances and of writes outside the transaction, read_committed fetches, and the state
surviving a SIGKILL of the server."""

from __future__ import annotations

import base64
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumer_groups.hashing import group_slot
from tests.server import ServerProcess


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _tid() -> str:
    return f"txn-{uuid.uuid4().hex[:10]}"


class Txn:
    """One transactional producer over HTTP."""

    def __init__(self, client: httpx.Client, tid: str, timeout_ms: int = 60_000) -> None:
        self.client = client
        self.tid = tid
        r = client.post(f"/transactions/{tid}:init", json={"transaction_timeout_ms": timeout_ms})
        assert r.status_code == 200, r.text
        self.pid, self.epoch = r.json()["producer_id"], r.json()["producer_epoch"]
        self.seq: dict[tuple[str, int], int] = {}

    def ids(self) -> dict[str, int]:
        return {"producer_id": self.pid, "producer_epoch": self.epoch}

    def add(self, topic: str, *partitions: int) -> httpx.Response:
        return self.client.post(f"/transactions/{self.tid}/partitions", json={
            **self.ids(), "partitions": [{"topic_name": topic, "partition_id": p}
                                         for p in partitions]})

    def send(self, topic: str, partition: int, values: list[str]) -> httpx.Response:
        first = self.seq.get((topic, partition), 0)
        entries = [{"id": str(i), "partition_id": partition, **self.ids(), "sequence": first + i,
                    "value": {"type": "BINARY", "data": base64.b64encode(v.encode()).decode()}}
                   for i, v in enumerate(values)]
        r = self.client.post(f"/topics/{topic}/records:batch",
                             params={"transactional_id": self.tid}, json={"entries": entries})
        if r.status_code == 207 and not r.json()["failures"]:
            self.seq[(topic, partition)] = first + len(values)
        return r

    def end(self, commit: bool) -> httpx.Response:
        r = self.client.post(f"/transactions/{self.tid}:{'commit' if commit else 'abort'}",
                             json=self.ids())
        if r.status_code == 200:
            self.pid, self.epoch = r.json()["producer_id"], r.json()["producer_epoch"]
            self.seq = {}
        return r


def _values(client: httpx.Client, topic: str, partition: int = 0,
            isolation: str = "read_committed") -> tuple[list[tuple[int, str]], int]:
    """Every record a reader at ``isolation`` sees, and where it ends."""
    out: list[tuple[int, str]] = []
    offset = 0
    while True:
        r = client.get(f"/topics/{topic}/partitions/{partition}/records",
                       params={"offset": offset, "isolation_level": isolation,
                               "format": "STRING", "max_bytes": 1024})
        assert r.status_code == 200, r.text
        body = r.json()
        out += [(rec["offset"], rec["value"]["data"]) for rec in body["records"]]
        if body["next_offset"] == offset:
            return out, offset
        offset = body["next_offset"]


def _error(r: httpx.Response) -> str:
    if r.status_code == 207:
        return str(r.json()["failures"][0]["error"])
    return str(r.json().get("error"))


def test_commit_makes_records_readable_and_abort_hides_them(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    txn = Txn(client, _tid())
    assert txn.add(topic, 0).status_code == 204
    assert txn.send(topic, 0, ["a", "b"]).status_code == 207
    # Open: a committed reader sees nothing yet; an uncommitted one sees the records.
    assert _values(client, topic) == ([], 0)
    assert _values(client, topic, isolation="read_uncommitted")[0] == [(0, "a"), (1, "b")]
    before = txn.epoch
    r = txn.end(commit=True)
    assert r.status_code == 200, r.text
    assert txn.epoch == before + 1  # KIP-890: the epoch goes up with each end
    assert _values(client, topic) == ([(0, "a"), (1, "b")], 3)  # the marker is offset 2

    assert txn.add(topic, 0).status_code == 204
    assert txn.send(topic, 0, ["c"]).status_code == 207
    assert txn.end(commit=False).status_code == 200
    client.post(f"/topics/{topic}/records", json={"value": {"type": "STRING", "data": "d"}})
    assert _values(client, topic) == ([(0, "a"), (1, "b"), (5, "d")], 6)
    assert _values(client, topic, isolation="read_uncommitted")[0] == [
        (0, "a"), (1, "b"), (3, "c"), (5, "d")]
    described = client.get(f"/transactions/{txn.tid}").json()
    assert (described["state"], described["partitions"]) == ("CompleteAbort", [])


def test_a_new_instance_fences_the_old_one_and_aborts_what_it_left_open(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    tid = _tid()
    zombie = Txn(client, tid)
    assert zombie.add(topic, 0).status_code == 204
    assert zombie.send(topic, 0, ["left open"]).status_code == 207
    fresh = Txn(client, tid)
    assert fresh.pid == zombie.pid and fresh.epoch > zombie.epoch
    # What the old instance left open is aborted: its record never reaches a committed reader.
    assert _values(client, topic) == ([], 2)
    for r in (zombie.add(topic, 0), zombie.send(topic, 0, ["late"]), zombie.end(commit=True)):
        assert r.status_code in (207, 409), r.text
        assert _error(r) in ("producer_fenced", "invalid_producer_epoch"), r.text
    assert fresh.add(topic, 0).status_code == 204
    assert fresh.send(topic, 0, ["new"]).status_code == 207
    assert fresh.end(commit=True).status_code == 200
    assert _values(client, topic)[0] == [(2, "new")]


def test_writes_outside_the_transaction_are_refused(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(2)
    txn = Txn(client, _tid())
    r = txn.end(commit=True)
    assert (r.status_code, _error(r)) == (409, "invalid_txn_state"), r.text
    assert txn.add(topic, 0).status_code == 204
    r = txn.send(topic, 1, ["not added"])  # KIP-890: a partition the transaction did not add
    assert _error(r) == "invalid_txn_state", r.text
    assert txn.add("no-such-topic", 0).status_code == 404
    r = client.post(f"/transactions/{txn.tid}:commit",
                    json={"producer_id": txn.pid + 1000, "producer_epoch": txn.epoch})
    assert _error(r) == "invalid_producer_id_mapping", r.text
    r = client.post(f"/transactions/{_tid()}/partitions", json={
        "producer_id": 0, "producer_epoch": 0,
        "partitions": [{"topic_name": topic, "partition_id": 0}]})
    assert (r.status_code, _error(r)) == (404, "transactional_id_not_found"), r.text
    r = client.post(f"/transactions/{_tid()}:init", json={"transaction_timeout_ms": 10**9})
    assert (r.status_code, _error(r)) == (400, "invalid_transaction_timeout"), r.text


def test_a_lost_commit_answer_is_answered_again_by_a_retry(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    txn = Txn(client, _tid())
    txn.add(topic, 0)
    txn.send(topic, 0, ["once"])
    old = txn.ids()
    first = txn.end(commit=True)
    again = client.post(f"/transactions/{txn.tid}:commit", json=old)
    assert again.status_code == 200 and again.json() == first.json()
    assert _values(client, topic)[0] == [(0, "once")]


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(
        client: httpx.Client, make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    txn = Txn(client, _tid(), timeout_ms=300)
    txn.add(topic, 0)
    txn.send(topic, 0, ["too slow"])
    wait_for(lambda: client.get(f"/transactions/{txn.tid}").json()["state"] == "CompleteAbort",
             "the coordinator aborting the transaction")
    assert _values(client, topic) == ([], 2)
    r = txn.send(topic, 0, ["later"])
    assert _error(r) == "invalid_producer_epoch", r.text
    r = txn.add(topic, 0)
    assert _error(r) == "transaction_abortable", r.text
    # The producer aborts, as Kafka's does after an abortable error, and goes on.
    assert txn.end(commit=False).status_code == 200
    assert txn.add(topic, 0).status_code == 204
    assert txn.send(topic, 0, ["on time"]).status_code == 207
    assert txn.end(commit=True).status_code == 200
    assert _values(client, topic)[0] == [(2, "on time")]  # 1: the abort's marker


def test_offsets_commit_with_the_transaction(client: httpx.Client, server: ServerProcess,
                                             make_topic: Callable[..., str]) -> None:
    topic = make_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    txn = Txn(client, _tid())

    def offsets(offset: int) -> dict[str, Any]:
        return {**txn.ids(), "group_id": group,
                "offsets": [{"topic_name": topic, "partition_id": 0, "offset": offset}]}

    def committed() -> int | None:
        r = client.get(f"/consumer-groups/{group}/offsets")
        data = r.json().get("offsets", []) if r.status_code == 200 else []
        return next((d["offset"] for d in data if d["topic_name"] == topic), None)

    txn.add(topic, 0)
    txn.send(topic, 0, ["x"])
    assert client.post(f"/transactions/{txn.tid}/offsets", json=offsets(7)).status_code == 204
    assert committed() is None  # pending until the commit
    r = client.get(f"/consumer-groups/{group}/offsets", params={"require_stable": "true"})
    assert (r.status_code, _error(r)) == (409, "unstable_offset_commit"), r.text
    assert txn.end(commit=True).status_code == 200
    assert committed() == 7
    assert client.post(f"/transactions/{txn.tid}/offsets", json=offsets(9)).status_code == 204
    # Pending offsets hold back a member's start and require_stable, not lag or /metrics.
    assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 200
    assert client.get(f"/consumer-groups/{group}").status_code == 200
    assert txn.end(commit=False).status_code == 200
    assert committed() == 7
    r = client.post(f"/transactions/{txn.tid}/offsets",
                    json={**offsets(9), "member_id": "nobody", "member_epoch": 0})
    assert r.status_code == 404 and _error(r) in ("unknown_member_id", "group_id_not_found")


def test_an_open_transaction_survives_a_sigkill_of_the_server(
        spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(auth="none")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "t", "partitions_count": 2})
        txn = Txn(client, _tid())
        txn.add("t", 0, 1)
        txn.send("t", 0, ["p0"])
        txn.send("t", 1, ["p1"])
        r = client.post(f"/transactions/{txn.tid}/offsets", json={
            **txn.ids(), "group_id": "g",
            "offsets": [{"topic_name": "t", "partition_id": 0, "offset": 100}]})
        assert r.status_code == 204, r.text
    server.kill()
    server.start()
    with server.client() as client:
        txn.client = client
        described = client.get(f"/transactions/{txn.tid}").json()
        assert described["state"] == "Ongoing"
        assert described["partitions"] == [{"topic_name": "t", "partition_id": 0},
                                           {"topic_name": "t", "partition_id": 1}]
        assert _values(client, "t", 0) == ([], 0)
        # The offsets it holds came back with it: still pending, and kept when more come.
        r = client.get("/consumer-groups/g/offsets", params={"require_stable": "true"})
        assert (r.status_code, _error(r)) == (409, "unstable_offset_commit"), r.text
        r = client.post(f"/transactions/{txn.tid}/offsets", json={
            **txn.ids(), "group_id": "g",
            "offsets": [{"topic_name": "t", "partition_id": 1, "offset": 200}]})
        assert r.status_code == 204, r.text
        assert txn.end(commit=True).status_code == 200
        assert _values(client, "t", 0)[0] == [(0, "p0")]
        assert _values(client, "t", 1)[0] == [(0, "p1")]
        offsets = client.get("/consumer-groups/g/offsets").json()["offsets"]
        assert [(o["partition_id"], o["offset"]) for o in offsets] == [(0, 100), (1, 200)]
        # lakelog's own topic takes no user's writes (only its coordinators write it).
        r = client.post("/topics/__transaction_state/records",
                        json={"value": {"type": "STRING", "data": "garbage"}})
        assert (r.status_code, _error(r)) == (400, "invalid_topic"), r.text
        r = client.post("/topics/__transaction_state/records:delete",
                        json={"partitions": [{"partition_id": 0, "offset": -1}]})
        assert (r.status_code, _error(r)) == (400, "invalid_topic"), r.text


@pytest.mark.parametrize(("step", "commit"), [("txn-prepared", True), ("txn-marker", False),
                                              ("txn-markers", True)])
def test_a_coordinator_killed_at_each_step_of_an_end_is_finished_by_the_next(
        spawn_server: Callable[..., ServerProcess], step: str, commit: bool) -> None:
    """SIGKILLed after the outcome is durable, after one partition's marker, or after every
    marker but before Complete: the restarted coordinator finishes the same outcome, each
    partition gets one marker, the offsets commit with a commit, and the client's retry of
    the end is answered as the first try would have been."""
    server = spawn_server(auth="none")
    server.stop()
    server.command = [sys.executable, "-m", "tests.cluster.broker_proc", step]
    server.start()
    group = "g"
    with server.client() as client:
        client.post("/topics", json={"topic_name": "t", "partitions_count": 2})
        txn = Txn(client, _tid())
        assert txn.add("t", 0, 1).status_code == 204
        txn.send("t", 0, ["a"])
        txn.send("t", 1, ["b"])
        r = client.post(f"/transactions/{txn.tid}/offsets", json={
            **txn.ids(), "group_id": group,
            "offsets": [{"topic_name": "t", "partition_id": 0, "offset": 1}]})
        assert r.status_code == 204, r.text
        old = txn.ids()
        with pytest.raises(httpx.TransportError):  # the server dies before it answers
            client.post(f"/transactions/{txn.tid}:{'commit' if commit else 'abort'}", json=old)
    assert server.proc is not None and server.proc.wait(30) == -9
    server.command = [str(Path(sys.executable).parent / "lakelog")]
    server.start()
    with server.client() as client:
        state = client.get(f"/transactions/{txn.tid}").json()
        assert state["state"] == ("CompleteCommit" if commit else "CompleteAbort")
        again = client.post(f"/transactions/{txn.tid}:{'commit' if commit else 'abort'}",
                            json=old)
        assert again.status_code == 200, again.text
        assert again.json()["producer_epoch"] == old["producer_epoch"] + 1
        for p, value in ((0, "a"), (1, "b")):
            seen = _values(client, "t", p)
            assert seen == (([(0, value)] if commit else []), 2), (p, seen)
            everything = _values(client, "t", p, "read_uncommitted")
            assert everything == ([(0, value)], 2)  # one marker: offset 1, the end at 2
        offsets = client.get(f"/consumer-groups/{group}/offsets").json()["offsets"]
        assert [o["offset"] for o in offsets] == ([1] if commit else [])


def test_a_coordinator_killed_mid_compaction_keeps_every_state_and_the_expiry(
        spawn_server: Callable[..., ServerProcess]) -> None:
    """SIGKILLed once a compaction of ``__transaction_state`` has appended its states and
    tombstone, before it moves the log start: the restarted coordinator loads both copies
    to the same states: the idle id stays expired, its slot neighbour's open transaction
    is there to commit."""
    server = spawn_server(auth="none", transactional_id_expiration_ms="3000",
                          transaction_abort_interval_ms="100")
    server.stop()
    server.command = [sys.executable, "-m", "tests.cluster.broker_proc", "txn-state-rewritten"]
    server.start()
    idle = _tid()
    busy = next(t for t in (f"busy-{i}" for i in range(10_000))
                if group_slot(t, 16) == group_slot(idle, 16))
    with server.client() as client:
        client.post("/topics", json={"topic_name": "t", "partitions_count": 1})
        done = Txn(client, idle)
        assert done.add("t", 0).status_code == 204
        done.send("t", 0, ["kept"])
        assert done.end(commit=True).status_code == 200
        open_one = Txn(client, busy)  # its timeout (60 s) outlives the expiry
        assert open_one.add("t", 0).status_code == 204
        open_one.send("t", 0, ["later"])
    assert server.proc is not None and server.proc.wait(60) == -9  # idle expired: rewritten
    server.command = [str(Path(sys.executable).parent / "lakelog")]
    server.env.pop("LAKELOG_TRANSACTIONAL_ID_EXPIRATION_MS")
    server.start()
    with server.client() as client:
        assert client.get(f"/transactions/{idle}").status_code == 404
        assert client.get(f"/transactions/{busy}").json()["state"] == "Ongoing"
        open_one.client = client
        assert open_one.end(commit=True).status_code == 200
        assert _values(client, "t", 0)[0] == [(0, "kept"), (2, "later")]


def test_a_transactional_id_whose_epochs_run_out_moves_to_a_new_producer_id(
        spawn_server: Callable[..., ServerProcess]) -> None:
    """Every end takes a new epoch: near the last one (32767) the coordinator still writes
    the markers with the old id, then gives the id a new producer id at epoch 0."""
    import json

    server = spawn_server(auth="none")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "t", "partitions_count": 1})
        tid = _tid()
        first = Txn(client, tid)
    server.stop()
    path = server.data_dir / "producers.json"
    state = json.loads(path.read_text())
    state["epochs"][str(first.pid)] = 32_764  # as after ~16,000 transactions
    path.write_text(json.dumps(state))
    server.start()
    with server.client() as client:
        txn = Txn(client, tid)  # fences the first: epoch 32,765
        assert (txn.pid, txn.epoch) == (first.pid, 32_765)
        txn.add("t", 0)
        txn.send("t", 0, ["last of the old id"])
        assert txn.end(commit=True).status_code == 200  # ended at 32,766; then a new id
        assert txn.pid != first.pid and txn.epoch == 0
        described = client.get(f"/transactions/{tid}").json()
        assert (described["producer_id"], described["producer_epoch"]) == (txn.pid, 0)
        assert _values(client, "t") == ([(0, "last of the old id")], 2)
        txn.add("t", 0)
        txn.send("t", 0, ["first of the new id"])
        assert txn.end(commit=True).status_code == 200
        assert _values(client, "t")[0] == [(0, "last of the old id"), (2, "first of the new id")]
