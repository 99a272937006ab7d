"""How corpus labels are scored (labels.tsv semantics from ../shared/corpus/README.md)."""

from __future__ import annotations

import pytest

from correlator.diagnosis.models import Incident, Initiator
from correlator.offline.corpus_score import initiator_matches


def incident(**who: object) -> Incident:
    return Incident(
        incident_id="x", job_id="j", class_="cuda_oom", title="t", severity="high", confidence=0.9,
        confidence_reason="r", initiator=Initiator(rule="r", line="l", **who),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    "label, who, ok",
    [
        ("rank=0", {"rank": 0}, True),
        ("rank=0", {"rank": 1}, False),
        ("local_rank=5&pid=2630", {"pid": 2630}, True),
        ("local_rank=5&pid=2630", {"local_rank": 4, "pid": 1}, False),
        ("host=cn-234&gpu=0000:03:00.0", {"gpu": "0000:03:00.0"}, True),
        ("not:rank=9", {"rank": 3}, True),
        ("not:rank=9", {}, True),
        ("not:rank=9", {"rank": 9}, False),
        ("all", {}, True),
    ],
)
def test_initiator_label_semantics(label: str, who: dict[str, object], ok: bool) -> None:
    assert initiator_matches(label, incident(**who)) is ok


def test_no_incident_never_matches_an_initiator() -> None:
    assert not initiator_matches("rank=0", None)
