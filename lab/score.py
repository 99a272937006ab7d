"""Score `rootrank diagnose` on the lab's output with the corpus scoring (`correlator.offline.corpus_score`).

Only scenarios whose fault fired are scored; an errored scenario is an ERROR line and stays out of N
(it is never a pass). The last line printed is `lab: class X/N (P%) initiator Y/M (Q%)`.
"""

from __future__ import annotations

import csv
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from lab.runner import load_result, processes_of
from lab.scenario import LABEL_COLUMNS, Scenario, label_row


def _pct(x: int, n: int) -> str:
    return f"{100.0 * x / n:.0f}%" if n else "-"


def summary_line(class_ok: int, n: int, init_ok: int, m: int) -> str:
    return f"lab: class {class_ok}/{n} ({_pct(class_ok, n)}) initiator {init_ok}/{m} ({_pct(init_ok, m)})"


def score(scenarios: list[Scenario], out: Path, stream: TextIO) -> dict[str, Any]:
    from correlator.offline.corpus_score import score_corpus  # the engine: imported only to score

    runnable: list[dict[str, str]] = []
    errored: list[str] = []
    missing: list[str] = []
    for s in scenarios:
        meta = load_result(out, s.name)
        if meta is None or not (out / "cases" / s.name).exists():
            missing.append(s.name)
            print(f"ERROR {s.name}: not run (python -m lab run --only {s.name})", file=stream)
        elif meta["status"] != "ok":
            errored.append(s.name)
            print(f"ERROR {s.name}: {meta['error']}", file=stream)
        else:
            runnable.append(label_row(s, processes_of(meta)))
    rows = []
    if runnable:
        with tempfile.TemporaryDirectory(prefix="lab-score-") as tmp:
            corpus = Path(tmp)
            (corpus / "cases").symlink_to((out / "cases").resolve())
            with open(corpus / "labels.tsv", "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=list(LABEL_COLUMNS), delimiter="\t", lineterminator="\n")
                w.writeheader()
                w.writerows(runnable)
            rows = score_corpus(corpus)
    for r in rows:
        mark_c = "ok " if r.class_ok else "BAD"
        mark_i = ("ok " if r.initiator_ok else "BAD") if r.initiator_scored else " - "
        print(f"{mark_c} {mark_i} {r.file:40s} want {r.expected_class}/{r.initiator_label}  "
              f"got {r.got_class}/{r.got_initiator}", file=stream)
    class_ok = sum(r.class_ok for r in rows)
    scored = [r for r in rows if r.initiator_scored]
    init_ok = sum(r.initiator_ok for r in scored)
    result = {"rows": [asdict(r) for r in rows], "errored": errored, "missing": missing,
              "class_ok": class_ok, "n": len(rows), "initiator_ok": init_ok, "m": len(scored)}
    (out / "score.json").write_text(json.dumps(result, indent=1))
    bad = len(errored) + len(missing)
    print(f"lab: {len(rows)} scenario(s) scored, {len(errored)} errored, {len(missing)} not run"
          + (" (errored and not-run scenarios are left out of N, never counted as passes)" if bad else ""),
          file=stream)
    print(summary_line(class_ok, len(rows), init_ok, len(scored)), file=stream)
    return result
