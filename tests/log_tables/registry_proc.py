"""A child process that creates topics t0, t1, ... forever and prints each one created."""

from __future__ import annotations

import sys
from pathlib import Path

from log_tables.registry import TopicRegistry


def main() -> None:
    registry = TopicRegistry(Path(sys.argv[1]))
    i = len(registry.list())
    while True:
        registry.create(f"t{i}", 1 + i % 5, {"retention.ms": str(1000 + i)})
        print(i, flush=True)
        i += 1


if __name__ == "__main__":
    main()
