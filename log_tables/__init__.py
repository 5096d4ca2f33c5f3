"""log_tables."""
