"""The broker core: a plain Python object that owns the logs, the coordinators, the
cluster link and replication, and the produce, fetch, group and topic services.

Nothing here speaks HTTP: its services take and return lakelog's own types (Arrow
record batches, dataclasses), and other brokers are reached through protocols a front
implements. ``ingest_api.http`` is one front of it."""
