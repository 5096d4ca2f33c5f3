"""Spark over the log: the session, batch reads and the streaming source."""
