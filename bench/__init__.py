"""Benchmarks (``python -m bench.<name>``). They start servers on loopback without
authentication: they measure the data path, not the API key check."""

import os

os.environ.setdefault("LAKELOG_AUTH", "none")
