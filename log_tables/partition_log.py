"""Moved to ``lakelog.log`` (deprecated path, kept working)."""

from log_tables.moved import moved

__getattr__ = moved(__name__, {"PartitionLog": "lakelog.log"})
