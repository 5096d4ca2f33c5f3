"""The SQL endpoint: a resident Spark serving Spark Connect (behind lakelog's front,
``front``) and JDBC, in a child process of ``lakelog serve`` (``process``), with lakelog's
views in every session (``sessions``)."""

DEFAULT_SQL_PORT = 15002
"""Spark Connect's own default port."""
