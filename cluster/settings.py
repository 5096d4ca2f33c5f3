"""Settings of a broker of a cluster (``LAKELOG_*`` environment variables): its id,
ZooKeeper, where it is reached, the topic defaults the controller applies, leader
rebalancing, the coordinator slots and replication (Kafka's names, ``_`` for ``.``).

The cluster owns them; the server composes them into its own settings
(``ingest_api.settings.ApiSettings``), so each is read from the same variable and flag.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ClusterSettings(BaseSettings):
    """A broker's place in a cluster; unset ``zookeeper`` and ``broker_id``: a cluster of one."""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

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
    # -- replication ---------------------------------------------------------------------
    replica_lag_time_max_ms: int = Field(
        30_000, ge=100, description="A follower that has not caught up with its leader for "
                                    "this long leaves the ISR (Kafka's "
                                    "replica.lag.time.max.ms).")
    replica_fetch_wait_max_ms: int = Field(
        500, ge=0, le=10_000, description="How long a follower's fetch waits at the leader "
                                          "for new records (replica.fetch.wait.max.ms).")

    @model_validator(mode="after")
    def _one_cluster(self) -> Self:
        if (self.broker_id is None) != (self.zookeeper is None):
            raise ValueError("broker_id and zookeeper go together: a broker of a cluster "
                             "needs both (neither: a cluster of one)")
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
