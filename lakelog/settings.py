"""lakelog's settings: one typed object, from defaults, ``LAKELOG_*`` variables and flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything an operator can set; see the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

    data_dir: Path = Field(Path("lakelog-data"), description="Where the hot log and metadata live.")

    @property
    def hot_dir(self) -> Path:
        return self.data_dir / "hot"
