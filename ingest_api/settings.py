"""Settings of the server (``LAKELOG_*`` environment variables): HTTP, security, the data
it holds, and the consumer groups it hosts (``consumer_groups.settings``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from consumer_groups.settings import GroupSettings
from ingest_api.addresses import is_loopback
from log_tables.layout import Layout, is_local
from log_tables.storage import OBJECT_STORE_SCHEMES

MiB = 1 << 20


class ApiSettings(GroupSettings):
    """Every bound and default of the server; all are validated at start. (``lakelog serve``
    adds the job schedule: ``lakelog.settings.Settings``.)"""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

    data_dir: Path = Field(Path("lakelog-data"), description="Hot log and metadata directory.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on.")
    max_request_bytes: int = Field(64 * MiB, ge=1024, description="Largest request body accepted.")
    max_batch_entries: int = Field(1000, ge=1, le=100_000,
                                   description="Most entries in one records:batch request.")
    max_in_flight_bytes: int = Field(256 * MiB, ge=MiB,
                                     description="Request bytes being processed at once; "
                                                 "more is answered 429.")
    max_queued_records: int = Field(200_000, ge=1_000,
                                    description="Records waiting to be appended per "
                                                "partition; more is answered 429.")
    max_fetch_bytes: int = Field(64 * MiB, ge=1024, description="Largest max_bytes of a fetch.")
    default_fetch_bytes: int = Field(MiB, ge=1024, description="max_bytes of a fetch by default.")
    max_fetch_records: int = Field(10_000, ge=1, description="Largest max_records of a fetch.")
    max_fetch_wait_ms: int = Field(30_000, ge=0, description="Longest long-poll of a fetch.")
    max_long_polls: int = Field(10_000, ge=1, description="Fetches waiting for data at once.")
    roll_check_interval_ms: int = Field(1000, ge=10,
                                        description="How often quiet segments are checked "
                                                    "against segment.ms.")
    limit_concurrency: int = Field(4096, ge=1, description="Open connections+tasks before 503.")
    max_request_head_bytes: int = Field(64 * 1024, ge=1024,
                                        description="Largest request line + headers; more "
                                                    "is answered 431 and the connection closed.")
    request_head_timeout_ms: int = Field(10_000, ge=100,
                                         description="A request's line and headers must "
                                                     "arrive within this (slow clients get "
                                                     "408 and are disconnected).")
    request_body_idle_timeout_ms: int = Field(60_000, ge=100,
                                              description="Longest wait for the next bytes "
                                                          "of a request body (a streaming "
                                                          "produce included); then 408, or "
                                                          "the connection is closed.")
    log_level: str = Field("info", description="uvicorn / lakelog log level.")
    warehouse: str | None = Field(None, description="Delta warehouse: a path, or s3://, "
                                                    "gs://, az://, abfss:// (credentials from "
                                                    "the store's own variables, e.g. AWS_*); "
                                                    "unset: the data directory's warehouse/.")
    vacuum_retention_hours: int = Field(24, ge=0,
                                        description="How long files removed by a commit stay "
                                                    "for readers of older snapshots.")
    auth: Literal["api-key", "none"] = Field(
        "api-key", description="api-key: every request needs an API key (HTTP Basic or Bearer) "
                               "and ACLs apply; the first start makes an admin key in "
                               "the data directory's security/admin.key. none: no authentication, "
                               "only on a loopback address.")
    allow_insecure_non_loopback: bool = Field(
        False, description="Let auth=none listen on a non-loopback address (only behind "
                           "something else that authenticates).")
    tls_cert: Path | None = Field(None, description="TLS certificate (PEM); with tls_key, "
                                                    "the server speaks HTTPS only.")
    tls_key: Path | None = Field(None, description="TLS private key (PEM) of tls_cert.")
    tls_ca: Path | None = Field(None, description="CA bundle (PEM) that the other brokers' "
                                                  "certificates are checked against; unset: "
                                                  "the system's CAs.")

    broker_id: int | None = Field(None, ge=0, le=2**31 - 1,
                                  description="This broker's id in a cluster (with zookeeper); "
                                              "unset: a cluster of one, broker 1.")
    zookeeper: str | None = Field(None, description="ZooKeeper connect string "
                                                    "HOST:PORT[,HOST:PORT...][/chroot]; unset: "
                                                    "no cluster, no ZooKeeper.")
    zookeeper_session_timeout_ms: int = Field(
        18_000, ge=2_000, le=120_000,
        description="ZooKeeper session: a broker silent this long loses its partitions' "
                    "leadership (Kafka's zookeeper.session.timeout.ms). Keep it within the "
                    "ZooKeeper server's minSessionTimeout..maxSessionTimeout (2 to 20 "
                    "ticks by default): the broker's lease is half of it.")
    broker_rack: str | None = Field(None, max_length=255,
                                    description="Rack (or zone) of this broker: replicas of a "
                                                "partition are spread across racks.")
    advertised_host: str | None = Field(None, description="Host other brokers and clients "
                                                          "reach this broker at; unset: host "
                                                          "(or 127.0.0.1 for 0.0.0.0).")
    default_replication_factor: int = Field(1, ge=1, le=32767,
                                             description="Replicas of a topic created without "
                                                         "replication_factor.")
    min_insync_replicas: int = Field(
        1, ge=1, le=2**31 - 1,
        description="min.insync.replicas of a topic that does not set its own: acks=all is "
                    "refused (NOT_ENOUGH_REPLICAS) while the ISR is smaller.")
    unclean_leader_election_enable: bool = Field(
        False, description="unclean.leader.election.enable of a topic that does not set its "
                           "own: with no in-sync replica alive, an out-of-sync one may lead "
                           "(acknowledged records may be lost).")
    auto_leader_rebalance_enable: bool = Field(
        True, description="The controller moves leadership back to each partition's "
                          "preferred replica (the first) once it is alive and in sync "
                          "(Kafka's auto.leader.rebalance.enable).")
    leader_imbalance_check_interval_seconds: int = Field(
        300, ge=1, le=86_400,
        description="How often the controller checks the preferred leaders (Kafka's "
                    "leader.imbalance.check.interval.seconds).")
    leader_imbalance_per_broker_percentage: int = Field(
        10, ge=0, le=100,
        description="A broker's preferred partitions led elsewhere may reach this share "
                    "before the controller moves them back (Kafka's "
                    "leader.imbalance.per.broker.percentage).")
    offsets_topic_num_partitions: int = Field(
        50, ge=1, le=1000, description="Coordinator slots: a consumer group's coordinator "
                                       "leads slot hash(group) % this (Kafka's "
                                       "offsets.topic.num.partitions).")
    offsets_topic_replication_factor: int = Field(
        3, ge=1, le=32767, description="Replicas of each coordinator slot, up to the live "
                                       "brokers (the controller adds more as brokers join): "
                                       "a group's coordinator moves to another replica when "
                                       "its broker dies (Kafka's "
                                       "offsets.topic.replication.factor).")
    # -- replication (Kafka's names, with _ for .) ---------------------------------------
    replica_lag_time_max_ms: int = Field(
        30_000, ge=100, description="A follower that has not caught up with its leader for "
                                    "this long leaves the ISR (Kafka's "
                                    "replica.lag.time.max.ms).")
    replica_fetch_wait_max_ms: int = Field(
        500, ge=0, le=10_000, description="How long a follower's fetch waits at the leader "
                                          "for new records (replica.fetch.wait.max.ms).")
    acks_all_fsync: Literal["always", "when-alone"] = Field(
        "when-alone", description="always: acks=all also waits for the leader's fsync; "
                                  "when-alone: only when the leader is its partition's only "
                                  "in-sync replica (one replica included), otherwise the "
                                  "copies in the other brokers' memory are the durability, as "
                                  "in Kafka.")
    produce_timeout_ms: int = Field(
        30_000, ge=100, description="How long acks=all waits for the in-sync replicas "
                                    "before answering REQUEST_TIMED_OUT "
                                    "(Kafka's request.timeout.ms).")

    # -- what the server shows: the dashboard, the request log ------------------------
    access_log: str | None = Field(
        None, description="Write one line per HTTP request (time, client, principal, method, "
                          "path, status, bytes, duration) to this file, appended; '-': "
                          "standard output; unset: no request log. Never holds keys or "
                          "cookies.")
    ui_sample_interval_ms: int = Field(
        2000, ge=100, le=60_000,
        description="How often the dashboard (/ui) samples produce and fetch rates and "
                    "consumer-group lag into its 10-minute history (at most 1,200 samples: "
                    "less history below 500 ms).")

    @model_validator(mode="after")
    def _safe(self) -> ApiSettings:
        if self.warehouse is not None and not is_local(self.warehouse) and \
                urlparse(self.warehouse).scheme not in OBJECT_STORE_SCHEMES:
            raise ValueError(
                f"warehouse {self.warehouse!r}: use a local or mounted path, or an object store "
                f"({', '.join(s + '://' for s in OBJECT_STORE_SCHEMES)}; see 'Running beyond "
                f"one machine' in docs/cluster.md)")
        if (self.broker_id is None) != (self.zookeeper is None):
            raise ValueError("broker_id and zookeeper go together: a broker of a cluster "
                             "needs both (neither: a cluster of one)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        if self.auth == "none" and not is_loopback(self.host) and \
                not self.allow_insecure_non_loopback:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: use "
                f"auth=api-key, a loopback host, or allow_insecure_non_loopback=true when "
                f"something in front of lakelog authenticates")
        return self

    @property
    def topic_defaults(self) -> dict[str, str]:
        """The broker's defaults of topic configs that were set (environment, flags), by
        their Kafka names; a topic's own value wins over them, and they over the built-in
        ones (``TopicConfig.from_overrides(overrides, defaults)``, ``config_value``)."""
        values = {"min.insync.replicas": str(self.min_insync_replicas),
                  "unclean.leader.election.enable":
                      str(self.unclean_leader_election_enable).lower()}
        return {name: value for name, value in values.items()
                if name.replace(".", "_") in self.model_fields_set}

    @property
    def hot_dir(self) -> Path:
        return self.data_dir / "hot"

    @property
    def layout(self) -> Layout:
        return Layout.of(self.data_dir, self.warehouse)

