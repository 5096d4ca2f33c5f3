"""A child process that appends forever and prints each acknowledged last offset.

Usage: python -m tests.log_tables.writer_proc DIR SEGMENT_BYTES PER_BATCH MAX_RECORDS
A line "<last_offset>" is printed (and flushed) only after append() returned.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from log_tables.config import TopicConfig
from log_tables.hot.partition_log import PartitionLog
from tests.log_tables.helpers import batch_for


def main() -> None:
    directory, segment_bytes, per_batch, max_records = sys.argv[1:5]
    plog = PartitionLog.open(Path(directory), TopicConfig(segment_bytes=int(segment_bytes),
                                                         index_interval_bytes=512))
    rng = random.Random()
    print(f"start {plog.high_watermark}", flush=True)
    while plog.high_watermark < int(max_records):
        n = rng.randint(1, int(per_batch))
        info = plog.append(batch_for(plog.high_watermark, n, size=rng.randint(1, 400)))
        print(info.last_offset, flush=True)
    plog.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
