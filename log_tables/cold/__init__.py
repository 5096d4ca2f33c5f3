"""The cold tier: one Delta table per topic, its commits, tiering, and reads across both tiers."""
