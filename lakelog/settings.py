"""lakelog's settings: the packages' own settings composed into one typed object.

Each package owns its settings class, all read from ``LAKELOG_*`` variables:
``ingest_api.settings.ApiSettings`` (HTTP, security, the data directory, warehouse and
vacuum retention; it composes ``cluster.settings.ClusterSettings``, the cluster the
server may be a broker of, and ``consumer_groups.settings.GroupSettings``, the groups it
hosts) and ``compaction_jobs.settings.JobSettings`` (the jobs' schedule and Spark
master). ``lakelog serve`` reads them all; the reference in docs/operations.md is generated from
``Settings`` (``lakelog.reference``).
"""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from cluster.settings import ClusterSettings
from compaction_jobs.settings import JobSettings
from consumer_groups.settings import GroupSettings
from ingest_api.addresses import is_loopback
from ingest_api.settings import ApiSettings
from lakelog.endpoint.settings import EndpointSettings


class Settings(ApiSettings, JobSettings, EndpointSettings):
    """Everything an operator can set (defaults < ``LAKELOG_*`` variables < CLI flags)."""

    @classmethod
    def names(cls) -> list[str]:
        """Every setting by owner: the server's, the cluster's, the groups', the jobs', the
        SQL endpoint's."""
        composed = {*GroupSettings.model_fields, *ClusterSettings.model_fields}
        server = [n for n in ApiSettings.model_fields if n not in composed]
        return server + list(ClusterSettings.model_fields) + list(GroupSettings.model_fields) + \
            list(JobSettings.model_fields) + list(EndpointSettings.model_fields)

    @model_validator(mode="after")
    def _sql_beyond_loopback(self) -> Self:
        if self.sql_port and not is_loopback(self.sql_host) and not (
                self.auth == "api-key" and self.tls_cert):
            raise ValueError(f"sql_host={self.sql_host} is not loopback: the SQL endpoint "
                             "then needs auth=api-key and TLS (tls_cert, tls_key)")
        return self

    def describe(self) -> dict[str, str]:
        """The settings as printed at start (no secrets exist yet; they would be masked here)."""
        return {name: str(getattr(self, name)) for name in self.names()}

    def changed(self) -> dict[str, str]:
        """Those of ``describe()`` not at their default (set by a flag or a variable)."""
        fields = type(self).model_fields
        return {name: value for name, value in self.describe().items()
                if value != str(fields[name].get_default(call_default_factory=True))}
