"""A consumer process for the end-to-end group test: ``python -m tests.lakelog.consumer_proc
URL GROUP TOPIC OUT``. Every record it polls is appended to OUT (member id, partition,
offset, value) before the next poll, so auto-commit (on each poll) never commits a
record that is not in OUT. Runs until killed, or until OUT + ".stop" exists."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lakelog.client import Consumer


def main(url: str, group: str, topic: str, out: str) -> None:
    stop = Path(out + ".stop")
    with Consumer(url, group, [topic], auto_offset_reset="earliest", session_timeout_ms=3000,
                  auto_commit_interval_ms=0, format="STRING", timeout_s=10) as consumer, \
            open(out, "a", buffering=1) as f:
        while not stop.exists():
            try:
                records = consumer.poll(timeout_s=0.5)
            except Exception as exc:  # the server is down: keep trying, as a client would
                print(f"poll failed: {exc}", file=sys.stderr)
                continue
            for r in records:
                f.write(f"{consumer.polled_member_id} {r.partition} {r.offset} {r.value}\n")
            f.flush()
            os.fsync(f.fileno())


if __name__ == "__main__":
    main(*sys.argv[1:5])
