"""A script that starts a LocalServer on DATA_DIR, makes a topic, prints the server's
pid, then sleeps until killed (the test kills it, not the server).

``python -m tests.lakelog.local_server_proc DATA_DIR``
"""

from __future__ import annotations

import sys
import time

import httpx

from lakelog.local import LocalServer


def main() -> None:
    server = LocalServer(sys.argv[1], tier_interval_ms=0, retention_interval_ms=0,
                         compact_interval_ms=0, upkeep_interval_ms=0).start()
    assert server.proc is not None
    r = httpx.post(f"{server.url}/v3/clusters/lakelog/topics",
                   json={"topic_name": "t", "partitions_count": 1})
    r.raise_for_status()
    print(server.proc.pid, flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
