"""``python -m tests.cluster.nemesis``: nemesis runs over many seeds, a table, JSON.

    sudo .venv/bin/python -m tests.cluster.nemesis --runs 20 --seconds 60
    LAKELOG_NEMESIS_SEED=1234 .venv/bin/python -m tests.cluster.nemesis   # replay one seed

Seeds: ``--seed`` (or ``LAKELOG_NEMESIS_SEED``) and the ``--runs - 1`` after it; by
default a random first seed, printed. Each run's brokers, ZooKeeper and logs stay under
``--dir`` when it fails (removed when it passes). Exit status 1 if any run counted
anything.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster.nemesis.checker import Verdict
from tests.cluster.nemesis.run import run_nemesis, write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.nemesis",
                                     description=__doc__.split("\n")[0])
    env_seed = os.environ.get("LAKELOG_NEMESIS_SEED")
    parser.add_argument("--seed", type=int,
                        default=int(env_seed) if env_seed else random.randrange(1 << 20))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("LAKELOG_NEMESIS_SECONDS", "60")))
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "nemesis")
    parser.add_argument("--json", type=Path, default=Path("nemesis.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        stream=sys.stderr)
    verdicts: list[Verdict] = []
    for seed in range(args.seed, args.seed + args.runs):
        directory = args.dir / f"seed-{seed}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        started = time.monotonic()
        print(f"seed {seed}: {args.seconds:g}s of faults (in {directory})", flush=True)
        try:
            verdict = run_nemesis(seed, args.seconds, directory)
        except Exception as exc:
            verdict = Verdict(seed, args.seconds)
            verdict.examples["error"] = [f"{type(exc).__name__}: {exc}"]
            verdict.lost = -1  # not a count: the run did not finish
        verdicts.append(verdict)
        print(f"  {verdict.summary()} [{time.monotonic() - started:.0f}s]", flush=True)
        if not verdict.ok:
            for what, examples in verdict.examples.items():
                for text in examples:
                    print(f"    {what}: {text}")
            for line in verdict.faults:
                print(f"    fault {line}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
        write_json(verdicts, args.json)
    total = {name: sum(getattr(v, name) for v in verdicts) for name in Verdict.COUNTED}
    print(f"\n{len(verdicts)} runs, {sum(v.acknowledged for v in verdicts)} acknowledged; "
          + ", ".join(f"{k} {n}" for k, n in total.items())
          + f"; failed runs: {[v.seed for v in verdicts if not v.ok]}")
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
