"""The real-log corpus (../shared/corpus), when it is beside the checkout: accuracy must not regress."""

from __future__ import annotations

from pathlib import Path

import pytest

from correlator.offline.corpus_score import score_corpus, summary

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus"


@pytest.mark.corpus
@pytest.mark.skipif(not (CORPUS / "labels.tsv").exists(), reason="../shared/corpus is not beside this checkout")
def test_corpus_accuracy_meets_targets() -> None:
    rows = score_corpus(CORPUS)
    class_acc, init_acc, n, n_init = summary(rows)
    misses = [f"{r.file}: want {r.expected_class}/{r.initiator_label} got {r.got_class}/{r.got_initiator}"
              for r in rows if not r.class_ok or (r.initiator_scored and not r.initiator_ok)]
    assert class_acc >= 0.95, "\n".join(misses)
    assert init_acc >= 0.90, "\n".join(misses)
    assert n >= 40 and n_init >= 15
