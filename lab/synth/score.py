"""python -m lab.synth.score DIR [--only job003,job007]

Runs rootrank's offline diagnosis on every DIR/cases/<job> (the same rules as
correlator.offline.corpus_score: the primary non-recovered incident's class must be the label's class or one
of also_ok; one &-term of the initiator label must match the same field of the primary initiator) and prints
want/got per job, then `synth: class X/N (P%) initiator Y/M (Q%)` as the last line. Writes DIR/results.tsv.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from correlator.offline.corpus_score import _describe, initiator_matches
from correlator.offline.diagnose import Diagnoser, default_jobs


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.synth.score", description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--only", default="", help="comma-separated job names")
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    diagnoser = Diagnoser(jobs=default_jobs())
    rows = list(csv.DictReader((args.dir / "labels.tsv").open(encoding="utf-8"), delimiter="\t"))
    out = []
    n_cls = n_init = n_scored = 0
    t_all = time.monotonic()
    for row in rows:
        job = row["file"]
        if only and job not in only:
            continue
        t0 = time.monotonic()
        incidents, _ = diagnoser.diagnose([str(args.dir / "cases" / job)])
        dt = time.monotonic() - t0
        failed = [i for i in incidents if not i.recovered]
        primary = failed[0] if failed else None
        got = primary.class_ if primary else "none"
        accepted = {row["class"], *filter(None, (row.get("also_ok") or "").split(","))}
        class_ok = got in accepted
        label = row["initiator"]
        scored = label != "unknown" and row["class"] != "none"
        init_ok = scored and initiator_matches(label, primary)
        n_cls += class_ok
        n_init += init_ok
        n_scored += scored
        truth_p = args.dir / "truth" / f"{job}.json"
        truth = json.loads(truth_p.read_text()) if truth_p.exists() else {}
        mark = ("ok  " if class_ok else "CLS ") + ("ok " if init_ok or not scored else "INI")
        rule = primary.initiator.rule if primary else "-"
        print(f"{mark} {job} [{truth.get('world', '?')}r {truth.get('story', '?')}/{truth.get('mode', '?')}/"
              f"{truth.get('layout', '?')}:{truth.get('variant', '?')}/torch{truth.get('torch', '?')}] "
              f"want {row['class']} {label} | got {got} {_describe(primary)} ({rule}) {dt:.1f}s", flush=True)
        out.append({"job": job, "want_class": row["class"], "also_ok": row.get("also_ok", ""), "want_init": label,
                    "got_class": got, "got_init": _describe(primary), "rule": rule,
                    "line": (primary.initiator.line or "")[:300] if primary else "",
                    "class_ok": class_ok, "init_ok": init_ok, "scored": scored, "seconds": round(dt, 1),
                    "story": truth.get("story"), "mode": truth.get("mode"), "layout": truth.get("layout"),
                    "variant": truth.get("variant"), "torch": truth.get("torch"), "world": truth.get("world")})
    if out:
        with (args.dir / "results.tsv").open("w", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(out[0]), delimiter="\t")
            w.writeheader()
            w.writerows(out)
    n = len(out)
    print(f"diagnosed {n} jobs in {time.monotonic() - t_all:.0f}s")
    print(f"synth: class {n_cls}/{n} ({100 * n_cls / max(n, 1):.0f}%) initiator {n_init}/{n_scored} "
          f"({100 * n_init / max(n_scored, 1):.0f}%)")


if __name__ == "__main__":
    main()
