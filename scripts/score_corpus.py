#!/usr/bin/env python3
"""Print class and initiator accuracy of `rootrank diagnose` on a labelled corpus.

Usage: scripts/score_corpus.py [CORPUS_DIR] [--verbose]   (default: ../shared/corpus)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from correlator.offline.corpus_score import score_corpus, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="?", default=str(Path(__file__).resolve().parents[2] / "shared" / "corpus"))
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per case")
    args = parser.parse_args()
    corpus = Path(args.corpus)
    if not (corpus / "labels.tsv").exists():
        print(f"no labels.tsv in {corpus}", file=sys.stderr)
        return 2
    rows = score_corpus(corpus)
    for r in rows:
        if args.verbose or not r.class_ok or (r.initiator_scored and not r.initiator_ok):
            mark_c = "ok " if r.class_ok else "BAD"
            mark_i = ("ok " if r.initiator_ok else "BAD") if r.initiator_scored else " - "
            print(f"{mark_c} {mark_i} {r.file:62s} want {r.expected_class}/{r.initiator_label}  "
                  f"got {r.got_class}/{r.got_initiator}")
    class_acc, init_acc, n, n_init = summary(rows)
    print(f"class accuracy: {class_acc:.1%} of {n} cases; initiator accuracy: {init_acc:.1%} of {n_init} scored cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
