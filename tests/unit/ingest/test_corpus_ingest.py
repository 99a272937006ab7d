"""Ingest over the development corpus (../shared/corpus), when it exists: nothing in the real
logs makes parsing fail, and lines that carry an identity prefix yield that identity."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ingest.decoders import DecodeError, decode_value, to_event
from ingest.multiline import IdentityCarrier, split_glued

CORPUS = Path(__file__).resolve().parents[4] / "shared" / "corpus" / "cases"
FILES = sorted(CORPUS.glob("*.log")) if CORPUS.is_dir() else []

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.skipif(not FILES, reason="../shared/corpus is not present"),
]

# Independent, deliberately simple recognisers of the unambiguous prefix styles.
EXPECTED_IDENTITY = [
    (re.compile(r"^\[rank(\d+)\]:"), "rank"),
    (re.compile(r"^\S+:\d+:\d+ \[(\d+)\] "), "gpu"),
    (re.compile(r"^\([A-Za-z_]\w* pid=(\d+)"), "pid"),
    (re.compile(r"^\[[\w.-]+:(\d+) *:\d+:\d+\]"), "pid"),
]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_corpus_line_parses_and_prefixed_lines_give_their_identity(path: Path) -> None:
    carrier = IdentityCarrier(year=2024)
    for raw in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        for line in split_glued(raw):
            ident = carrier.feed(line)
            for pattern, field in EXPECTED_IDENTITY:
                m = pattern.match(line)
                if m is not None:
                    assert str(getattr(ident, field)) == m[1], line


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_whole_corpus_file_as_one_message_decodes(path: Path) -> None:
    try:
        records = decode_value(path.read_bytes())
    except DecodeError as exc:  # pragma: no cover - the corpus is text
        pytest.fail(f"{path.name}: {exc.reason}")
    assert records
    for record in records:
        to_event(record, default_job=path.stem)
