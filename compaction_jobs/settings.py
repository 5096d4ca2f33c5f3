"""Settings of the jobs the server schedules (``LAKELOG_*`` variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class JobSettings(BaseSettings):
    """How often each scheduled job runs, and on which Spark master. (How long vacuumed
    files stay, ``vacuum_retention_hours``, is a setting of the storage the server holds:
    it applies to the offsets table too.)"""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

    tier_interval_ms: int = Field(5000, ge=0,
                                  description="How often the tiering job runs in the server "
                                              "(also right after a roll); 0: never (run "
                                              "`lakelog jobs tier` from a scheduler instead).")
    retention_interval_ms: int = Field(30_000, ge=0,
                                       description="How often retention.ms / retention.bytes "
                                                   "are applied; 0: never.")
    compact_interval_ms: int = Field(15_000, ge=0,
                                     description="How often compacted topics are checked for "
                                                 "dirty partitions; 0: never.")
    upkeep_interval_ms: int = Field(600_000, ge=0,
                                    description="How often small files are merged (optimize) "
                                                "and removed files vacuumed; 0: never.")
    spark_master: str = Field("local[2]", description="Spark master of the server's jobs "
                                                    "(`lakelog jobs` defaults to local[*]).")
