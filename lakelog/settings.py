"""lakelog's settings: the packages' own settings composed into one typed object."""

from __future__ import annotations

from ingest_api.settings import ApiSettings


class Settings(ApiSettings):
    """Everything an operator can set (defaults < ``LAKELOG_*`` variables < CLI flags)."""

    def describe(self) -> dict[str, str]:
        """The settings as printed at start (no secrets exist yet; they would be masked here)."""
        return {name: str(value) for name, value in self.model_dump().items()}
