"""ingest_api."""
