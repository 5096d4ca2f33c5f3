"""Settings of the group coordinator and the offsets table (``LAKELOG_*`` variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class GroupSettings(BaseSettings):
    """Bounds and timings of consumer groups; the server that hosts the coordinator
    composes them into its own settings."""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

    offsets_commit_wait_ms: float = Field(5.0, ge=0, le=1000,
                                          description="How long an offset commit waits for "
                                                      "others to share its Delta append.")
    offsets_retention_minutes: int = Field(7 * 24 * 60, ge=1,
                                           description="Committed offsets of a group without "
                                                       "members expire after this.")
    max_consumer_groups: int = Field(10_000, ge=1, description="Active consumer groups at most.")
    max_group_members: int = Field(1_000, ge=1, description="Members of one group at most.")
