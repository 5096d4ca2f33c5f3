"""Settings of the server (``LAKELOG_*`` environment variables): HTTP, security, the data
it holds, produce and fetch bounds; it composes the consumer groups it hosts
(``consumer_groups.settings``) and the cluster it may be a broker of
(``cluster.settings``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from cluster.settings import ClusterSettings
from consumer_groups.settings import GroupSettings
from ingest_api.addresses import is_loopback
from log_tables.layout import Layout, is_local
from log_tables.storage import OBJECT_STORE_SCHEMES

MiB = 1 << 20


class ApiSettings(GroupSettings, ClusterSettings):
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
    transaction_state_log_num_partitions: int = Field(
        16, ge=1, le=1000, description="Transaction coordinator slots: a transactional id's "
                                       "coordinator leads partition hash(id) % this of "
                                       "__transaction_state (Kafka's "
                                       "transaction.state.log.num.partitions).")
    transaction_max_timeout_ms: int = Field(
        900_000, ge=1000, description="The longest transaction_timeout_ms a producer may "
                                      "ask for (Kafka's transaction.max.timeout.ms).")
    transactional_id_expiration_ms: int = Field(
        604_800_000, ge=1000, description="A transactional id with no transaction under way "
                                          "and no change for this long is forgotten (its "
                                          "producer must initialise again; Kafka's "
                                          "transactional.id.expiration.ms).")
    transaction_abort_interval_ms: int = Field(
        1000, ge=10, description="How often coordinators look for transactions past their "
                                 "timeout, to abort them (Kafka's transaction.abort.timed."
                                 "out.transaction.cleanup.interval.ms).")

    # -- Kafka's protocol (ingest_api.kafka) -------------------------------------------
    kafka_port: int = Field(
        0, ge=0, le=65535, description="Port of the Kafka protocol listener (on host), beside "
                                       "the HTTP API; 0: none. For now a broker alone with "
                                       "auth=none only (docs/kafka-protocol.md).")
    kafka_advertised_host: str | None = Field(
        None, description="The host Kafka clients are told to connect to (Metadata); unset: "
                          "host, or 127.0.0.1 when host is a wildcard address.")

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
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        if self.auth == "none" and not is_loopback(self.host) and \
                not self.allow_insecure_non_loopback:
            raise ValueError(
                f"refusing to listen on {self.host} without authentication: use "
                f"auth=api-key, a loopback host, or allow_insecure_non_loopback=true when "
                f"something in front of lakelog authenticates")
        if self.kafka_port and self.auth != "none":
            raise ValueError("the Kafka listener (kafka_port) has no SASL yet: it runs only "
                             "with auth=none (on loopback) for now; set kafka_port=0 or "
                             "auth=none")
        if self.kafka_port and not is_loopback(self.host):
            raise ValueError(f"the Kafka listener (kafka_port) has no SASL or TLS yet: it "
                             f"listens only on a loopback host, not {self.host}; set "
                             "kafka_port=0 or a loopback host")
        if self.kafka_port and self.zookeeper is not None:
            raise ValueError("the Kafka listener (kafka_port) serves a broker alone for now, "
                             "not a broker of a cluster (zookeeper is set): set kafka_port=0")
        return self

    @property
    def hot_dir(self) -> Path:
        return self.data_dir / "hot"

    @property
    def layout(self) -> Layout:
        return Layout.of(self.data_dir, self.warehouse)

