"""Score `diagnose` against a labelled corpus (../shared/corpus/labels.tsv format, see its README)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from correlator.diagnosis.models import Incident
from correlator.offline.diagnose import Diagnoser


@dataclass(frozen=True)
class RowScore:
    file: str
    expected_class: str
    got_class: str
    class_ok: bool
    initiator_label: str
    initiator_scored: bool
    initiator_ok: bool
    got_initiator: str


def _describe(incident: Incident | None) -> str:
    if incident is None:
        return "-"
    i = incident.initiator
    parts = [f"{k}={v}" for k, v in (("rank", i.rank), ("local_rank", i.local_rank), ("host", i.host),
                                     ("gpu", i.gpu), ("pid", i.pid)) if v is not None]
    return "&".join(parts) or "unknown"


def initiator_matches(label: str, incident: Incident | None) -> bool:
    if incident is None:
        return False
    if label == "all":
        return True
    i = incident.initiator
    if label.startswith("not:"):
        key, _, value = label[4:].partition("=")
        got = getattr(i, key, None)
        return got is None or str(got) != value
    for term in label.split("&"):
        key, _, value = term.partition("=")
        got = getattr(i, key, None)
        if got is not None and str(got).lower() == value.lower():
            return True
    return False


def score_corpus(corpus: Path, diagnoser: Diagnoser | None = None) -> list[RowScore]:
    diagnoser = diagnoser or Diagnoser()
    rows: list[RowScore] = []
    with (corpus / "labels.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            incidents, _ = diagnoser.diagnose([str(corpus / "cases" / row["file"])])
            failed = [i for i in incidents if not i.recovered]  # a survived failure is not the job's incident
            primary = failed[0] if failed else None
            got = primary.class_ if primary else "none"
            accepted = {row["class"], *filter(None, (row.get("also_ok") or "").split(","))}
            label = row["initiator"]
            scored = label != "unknown" and row["class"] != "none"
            rows.append(
                RowScore(
                    file=row["file"],
                    expected_class=row["class"],
                    got_class=got,
                    class_ok=got in accepted,
                    initiator_label=label,
                    initiator_scored=scored,
                    initiator_ok=scored and initiator_matches(label, primary),
                    got_initiator=_describe(primary),
                )
            )
    return rows


def summary(rows: list[RowScore]) -> tuple[float, float, int, int]:
    class_acc = sum(r.class_ok for r in rows) / len(rows) if rows else 0.0
    scored = [r for r in rows if r.initiator_scored]
    init_acc = sum(r.initiator_ok for r in scored) / len(scored) if scored else 0.0
    return class_acc, init_acc, len(rows), len(scored)
