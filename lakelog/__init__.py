"""lakelog."""
