"""Bounded queues and in-flight bytes answer 429 with Retry-After instead of growing."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from ingest_api.body import InFlightBytes
from ingest_api.errors import ApiError
from tests.ingest_api.helpers import fetch_all, string
from tests.server import ServerProcess


def test_in_flight_bytes_are_bounded() -> None:
    limit = InFlightBytes(1000)
    with limit.reserve(600):
        with pytest.raises(ApiError) as err, limit.reserve(600):
            pass
        assert err.value.status == 429 and err.value.retry_after_s == 1
        with limit.reserve(400):
            assert limit.current == 1000
    assert limit.current == 0
    with limit.reserve(5000):  # one request alone may be larger than the bound
        assert limit.current == 5000


@pytest.mark.slow
def test_full_partition_queue_is_429(spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server(max_queued_records="1000", max_batch_entries="5000")
    with server.client() as client:
        client.post("/topics", json={"topic_name": "q", "partitions_count": 1})
        entries = [{"id": str(i), "partition_id": 0, "value": string("v")} for i in range(1500)]
        r = client.post("/topics/q/records:batch", json={"entries": entries})
        assert r.status_code == 207
        failures = r.json()["failures"]
        assert failures and {f["error_code"] for f in failures} == {42901}
        assert "waiting to be appended" in failures[0]["message"]
        assert len(fetch_all(client, "q", 0)) == len(r.json()["successes"])
        single = client.post("/topics/q/records", json={"value": string("ok")})
        assert single.status_code == 200  # the queue drains; the partition goes on


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_the_server_cleanly(spawn_server: Callable[..., ServerProcess],
                                         sig: signal.Signals) -> None:
    server = spawn_server()
    with server.client() as client:
        client.post("/topics", json={"topic_name": "s", "partitions_count": 2})
        client.post("/topics/s/records", params={"acks": "1"}, json={"value": string("kept")})
    server.stop(sig=sig)  # asserts every partition wrote its clean-shutdown marker
    server.start()
    with server.client() as client:
        assert [r["value"]["data"] for p in (0, 1) for r in fetch_all(client, "s", p, fmt="STRING")] == ["kept"]
