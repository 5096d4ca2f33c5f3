"""consumer_groups."""
