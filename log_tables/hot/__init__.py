"""The hot tier: segment files per partition, their indexes, the partition log, group commit."""
