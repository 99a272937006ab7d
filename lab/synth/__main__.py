"""python -m lab.synth --out DIR --jobs N --seed S [--ranks 512,1024,2048,4096]"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path

from lab.synth.generate import generate


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.synth", description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ranks", default="512,1024,2048,4096", help="comma-separated world sizes")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--start-date", default=None,
                    help="YYYY-MM-DD: start every job that day (default: a date of its torch version's era)")
    args = ap.parse_args()
    ranks = [int(x) for x in args.ranks.split(",") if x]
    t0 = time.monotonic()
    start = None
    if args.start_date:
        start = datetime.strptime(args.start_date, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    generate(args.out, args.jobs, args.seed, ranks, quiet=args.quiet, start=start)
    print(f"generated {args.jobs} jobs in {time.monotonic() - t0:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
