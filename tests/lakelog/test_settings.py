"""Settings by owner: each package's class, composed by ``lakelog.settings.Settings``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compaction_jobs.settings import JobSettings
from consumer_groups.settings import GroupSettings
from ingest_api.settings import ApiSettings
from lakelog.endpoint.settings import EndpointSettings
from lakelog.settings import Settings


def test_each_setting_has_one_owner_and_the_composition_has_them_all() -> None:
    server = set(ApiSettings.model_fields) - set(GroupSettings.model_fields)
    groups, jobs = set(GroupSettings.model_fields), set(JobSettings.model_fields)
    endpoint = set(EndpointSettings.model_fields)
    assert not server & jobs and not groups & jobs and not endpoint & (server | groups | jobs)
    assert "tier_interval_ms" in jobs and "max_group_members" in groups and "port" in server
    assert "sql_port" in endpoint
    assert set(Settings.model_fields) == server | groups | jobs | endpoint
    assert sorted(Settings.names()) == sorted(Settings.model_fields)
    assert list(Settings().describe()) == Settings.names()


def test_every_owner_reads_the_same_lakelog_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKELOG_TIER_INTERVAL_MS", "7")
    monkeypatch.setenv("LAKELOG_MAX_GROUP_MEMBERS", "9")
    monkeypatch.setenv("LAKELOG_PORT", "8181")
    assert JobSettings().tier_interval_ms == Settings().tier_interval_ms == 7
    assert GroupSettings().max_group_members == ApiSettings().max_group_members == 9
    assert Settings().max_group_members == 9 and Settings().port == 8181
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        Settings(tls_cert="c.pem")  # the server's checks hold in the composition
    with pytest.raises(ValueError, match="the SQL endpoint then needs auth=api-key and TLS"):
        Settings(sql_host="0.0.0.0", sql_port=15002)


def test_the_client_loads_no_server_settings() -> None:
    """The client asks ``ingest_api.addresses`` whether a host is this machine; it used to
    import ``ingest_api.settings`` for it, and with it deltalake and pydantic-settings."""
    code = ("import sys, lakelog.client; print(sorted(m for m in ('ingest_api.settings', "
            "'lakelog.settings', 'deltalake', 'pydantic_settings') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_replication_settings_are_kafkas_and_feed_the_topic_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = ApiSettings()
    assert (s.min_insync_replicas, s.unclean_leader_election_enable) == (1, False)
    assert (s.auto_leader_rebalance_enable, s.leader_imbalance_check_interval_seconds,
            s.leader_imbalance_per_broker_percentage) == (True, 300, 10)
    assert s.topic_defaults == {}  # the built-in defaults: nothing set
    assert ApiSettings(min_insync_replicas=1).topic_defaults == {"min.insync.replicas": "1"}
    monkeypatch.setenv("LAKELOG_MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("LAKELOG_UNCLEAN_LEADER_ELECTION_ENABLE", "true")
    assert ApiSettings().topic_defaults == {"min.insync.replicas": "2",
                                            "unclean.leader.election.enable": "true"}
    with pytest.raises(ValueError, match="min_insync_replicas"):
        ApiSettings(min_insync_replicas=0)
    with pytest.raises(ValueError, match="leader_imbalance_per_broker_percentage"):
        ApiSettings(leader_imbalance_per_broker_percentage=101)


def test_the_cluster_owns_its_settings_and_the_server_reads_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.settings import ClusterSettings
    cluster = set(ClusterSettings.model_fields)
    assert {"zookeeper", "broker_id", "zookeeper_session_timeout_ms", "replica_lag_time_max_ms",
            "offsets_topic_num_partitions", "auto_leader_rebalance_enable"} <= cluster
    assert cluster <= set(ApiSettings.model_fields)
    assert not cluster & (set(GroupSettings.model_fields) | set(JobSettings.model_fields))
    monkeypatch.setenv("LAKELOG_REPLICA_LAG_TIME_MAX_MS", "1234")
    assert ClusterSettings().replica_lag_time_max_ms == Settings().replica_lag_time_max_ms == 1234
    assert ClusterSettings(min_insync_replicas=2).topic_defaults == {"min.insync.replicas": "2"}
    with pytest.raises(ValueError, match="broker_id and zookeeper go together"):
        ClusterSettings(broker_id=1)
    with pytest.raises(ValueError, match="broker_id and zookeeper go together"):
        ApiSettings(zookeeper="127.0.0.1:2181")
