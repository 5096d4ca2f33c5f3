"""The admin client against a real server: the calls ``lakelog topics|groups|acls|keys`` make."""

from __future__ import annotations

import httpx
import pytest

from lakelog.client import AdminClient, LakelogClientError, LakelogTimeoutError, Producer
from tests.server import ServerProcess


def test_admin_client_manages_topics_records_and_groups(server: ServerProcess) -> None:
    with AdminClient(server.url) as admin:
        admin.create_topic("orders", 2, [("retention.ms", "3600000")])
        assert [(t["topic_name"], t["partitions_count"]) for t in admin.list_topics()] == \
            [("orders", 2)]
        admin.create_partitions("orders", 3)
        admin.alter_configs("orders", {"cleanup.policy": "compact"}, ["retention.ms"])
        changed = {c["name"]: c["value"] for c in admin.describe_configs("orders")
                   if not c.get("is_default", False)}
        assert changed == {"cleanup.policy": "compact"}
        assert admin.describe_topic("orders")["partitions_count"] == 3
        with Producer(server.url) as producer:  # compacted now: records need keys
            sent = [producer.send("orders", f"v{i}", key=f"k{i}", partition=0) for i in range(5)]
            assert [f.result(timeout=60).offset for f in sent] == [0, 1, 2, 3, 4]
        assert admin.list_offsets("orders", 0, "latest") == 5
        [low] = admin.delete_records("orders", {0: 2})
        assert (low["partition_id"], low["low_watermark"]) == (0, 2)
        assert admin.list_offsets("orders", 0, "earliest") == 2
        assert {p["partition_id"]: p["log_start_offset"]
                for p in admin.list_partitions("orders")} == {0: 2, 1: 0, 2: 0}
        assert {p["partition_id"]: p["end_offset"]
                for p in admin.roll_segments("orders")}[0] == 5

        admin.alter_group_offsets("billing", [
            {"topic_name": "orders", "partition_id": 0, "offset": 3}])
        assert [g["consumer_group_id"] for g in admin.list_groups()] == ["billing"]
        assert [(o["partition_id"], o["offset"]) for o in admin.list_group_offsets("billing")] \
            == [(0, 3)]
        reset = admin.reset_group_offsets("billing", {"to": "earliest", "dry_run": False})
        assert {(o["partition_id"], o["offset"]) for o in reset["offsets"]} == \
            {(0, 2), (1, 0), (2, 0)}  # every partition of the topic, at its log start
        lag = {o["partition_id"]: o["lag"] for o in admin.describe_group("billing")["offsets"]}
        assert lag[0] == 3
        admin.delete_group("billing")
        assert admin.list_groups() == []

        with pytest.raises(LakelogClientError) as err:
            admin.describe_topic("nope")
        assert err.value.status == 404
        admin.delete_topic("orders")
        assert admin.list_topics() == []


def test_admin_client_gives_up_on_an_unreachable_server_within_its_deadline(
        server: ServerProcess) -> None:
    server.stop()
    with AdminClient(server.url, default_api_timeout_ms=300, retry_backoff_ms=10,
                     retry_backoff_max_ms=50) as admin, pytest.raises(LakelogTimeoutError) as err:
        admin.list_topics()
    assert "GET /topics" in str(err.value) and "default_api_timeout_ms=300" in str(err.value)
    assert isinstance(err.value.__cause__, httpx.TransportError)
