"""compaction_jobs."""
