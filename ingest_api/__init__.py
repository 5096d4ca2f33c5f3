"""The broker and its fronts: ``ingest_api.broker`` is the core (no HTTP in it),
``ingest_api.http`` serves it as Confluent REST v3, and ``ingest_api.settings`` holds
what a broker is started with."""
