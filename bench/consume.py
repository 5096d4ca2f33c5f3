"""``lakelog consume`` at the speed of its fetch (``python -m bench.consume``).

One server, a topic of 4 partitions holding ``--records`` records (100-byte values,
keyed), read to its end three ways in the same run:

- the baseline: a minimal httpx loop fetching the records as JSON
  (``GET .../partitions/{p}/records?format=STRING``, 10,000 a request, partition after
  partition) and doing nothing with them;
- ``Consumer.poll_batch`` in a group (Arrow batches, nothing done with them);
- ``lakelog consume TOPIC --group G --from-beginning --max N > file``: the CLI's whole
  run, start-up and group join included, writing to a file.

Goals (issue 35): the CLI to a file >= 0.6 of the httpx loop and >= 0.3 of
``poll_batch``. Prints a table; writes ``bench/results/consume.json``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.produce import quiet_server, wait_up
from bench.report import print_table, write_json
from lakelog.client import Consumer, Producer

BIN = Path(sys.executable).parent
PORT = 18761
URL = f"http://127.0.0.1:{PORT}"
BASE = f"{URL}/v3/clusters/lakelog"
TOPIC = "printed"
PARTITIONS = 4


def produce(records: int) -> None:
    value = "v" * 100
    with Producer(URL, linger_ms=20) as producer:
        tally = producer.send_many(TOPIC, [(f"key-{i}", value) for i in range(records)])
        producer.flush()
    assert tally.failed == 0, tally


def httpx_json_loop(records: int) -> float:
    """Records/s of the minimal loop: JSON fetches, partition after partition."""
    started = time.perf_counter()
    got = 0
    with httpx.Client(base_url=BASE, timeout=60) as client:
        for p in range(PARTITIONS):
            offset = 0
            while True:
                body = client.get(f"/topics/{TOPIC}/partitions/{p}/records", params={
                    "offset": offset, "max_records": 10_000, "format": "STRING"}).json()
                if not body["records"]:
                    break
                got += len(body["records"])
                offset = body["next_offset"]
    assert got == records, got
    return records / (time.perf_counter() - started)


def poll_batch(records: int) -> float:
    started = time.perf_counter()
    got = 0
    with Consumer(URL, "bench-poll-batch", [TOPIC], auto_offset_reset="earliest") as consumer:
        while got < records:
            got += consumer.poll_batch(timeout_s=1.0, max_records=10_000).num_rows
    return records / (time.perf_counter() - started)


def cli_to_file(records: int, work: Path) -> float:
    out = work / "consumed.txt"
    started = time.perf_counter()
    with out.open("wb") as f:
        subprocess.run([str(BIN / "lakelog"), "consume", TOPIC, "--group", "bench-cli",
                        "--from-beginning", "--max-messages", str(records), "--url", URL],
                       stdout=f, stderr=subprocess.DEVNULL, check=True)
    took = time.perf_counter() - started
    with out.open("rb") as f:
        lines = sum(1 for _ in f)
    assert lines == records, lines
    return records / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="each case's best of this many")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakelog-bench-consume-"))
    server = quiet_server(work, PORT, auth=None)
    rates: dict[str, list[float]] = {"httpx": [], "batch": [], "cli": []}
    try:
        wait_up(f"{URL}/healthz")
        httpx.post(f"{BASE}/topics", json={"topic_name": TOPIC, "partitions_count": PARTITIONS}
                   ).raise_for_status()
        produce(args.records)
        for r in range(args.rounds):  # interleaved, so a slow moment hurts each case alike
            print(f"round {r + 1}: httpx JSON loop, poll_batch, lakelog consume",
                  file=sys.stderr)
            rates["httpx"].append(httpx_json_loop(args.records))
            rates["batch"].append(poll_batch(args.records))
            rates["cli"].append(cli_to_file(args.records, work))
            # The next round's group reads from the beginning again.
            for group in ("bench-poll-batch", "bench-cli"):
                httpx.delete(f"{BASE}/consumer-groups/{group}").raise_for_status()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    best = {k: max(v) for k, v in rates.items()}
    rows: list[dict[str, Any]] = [
        {"case": "lakelog consume --group to a file, records/s", "lakelog": best["cli"],
         "baseline": best["httpx"], "ratio": best["cli"] / best["httpx"], "goal": 0.6,
         "baseline_is": "httpx loop fetching JSON"},
        {"case": "lakelog consume --group to a file, records/s", "lakelog": best["cli"],
         "baseline": best["batch"], "ratio": best["cli"] / best["batch"], "goal": 0.3,
         "baseline_is": "Consumer.poll_batch"},
        {"case": "Consumer.poll_batch, records/s", "lakelog": best["batch"],
         "baseline": best["httpx"], "ratio": best["batch"] / best["httpx"], "goal": "",
         "baseline_is": "httpx loop fetching JSON"},
    ]
    print_table(rows, ["case", "lakelog", "baseline", "baseline_is", "ratio", "goal"])
    path = write_json("consume", rows, {"records": args.records, "rounds": rates})
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
