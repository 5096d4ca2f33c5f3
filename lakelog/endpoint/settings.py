"""Settings of the SQL endpoint ``lakelog serve`` runs (``LAKELOG_*`` variables)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from lakelog.endpoint import DEFAULT_SQL_PORT


class EndpointSettings(BaseSettings):
    """Where the SQL endpoint listens, and its Spark."""

    model_config = SettingsConfigDict(env_prefix="LAKELOG_", extra="forbid")

    sql_port: int = Field(DEFAULT_SQL_PORT, ge=0, le=65535,
                          description="Spark Connect port of the SQL endpoint (its own process, "
                                      "with a resident Spark); 0: no endpoint.")
    sql_host: str = Field("127.0.0.1", description="Address of the Spark Connect port; beyond "
                                                   "loopback only with auth=api-key and TLS.")
    jdbc_port: int = Field(0, ge=0, le=65535,
                           description="Port of the JDBC/ODBC (Hive Thrift, HTTP transport) "
                                       "server on loopback, e.g. 10000; 0: none. Its one session "
                                       "shows every topic and runs any statement: with "
                                       "auth=api-key only cluster admins get in (user KEY_ID, "
                                       "password SECRET).")
    sql_master: str = Field("local[2]", description="Spark master of the SQL endpoint.")
    sql_driver_memory: str = Field("1g", description="JVM heap of the SQL endpoint's Spark.")
    sql_max_sessions: int = Field(64, ge=1, le=10_000,
                                  description="Spark Connect sessions a principal may have "
                                              "open at once (8 times as many in all); beyond "
                                              "it its least recently used is closed (its "
                                              "client may come back to a new, empty one).")
