"""The independent synthetic-job generator (lab/synth): deterministic, valid labels, a small job builds."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import yaml

from lab.synth.generate import generate, sizes_for

SHARED_TAXONOMY = Path(__file__).resolve().parents[3] / "shared" / "taxonomy.yaml"


def _slugs() -> set[str]:
    if SHARED_TAXONOMY.exists():
        return {c["slug"] for c in yaml.safe_load(SHARED_TAXONOMY.read_text())["classes"]}
    return set()


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "truth" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    generate(tmp_path / "a", 3, seed=11, ranks=[64], quiet=True)
    generate(tmp_path / "b", 3, seed=11, ranks=[64], quiet=True)
    generate(tmp_path / "c", 3, seed=12, ranks=[64], quiet=True)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")


def test_labels_are_valid(tmp_path: Path) -> None:
    generate(tmp_path, 12, seed=3, ranks=[64], quiet=True)
    rows = list(csv.DictReader((tmp_path / "labels.tsv").open(), delimiter="\t"))
    assert len(rows) == 12
    slugs = _slugs() | {"none"}
    for row in rows:
        assert set(row) == {"file", "class", "also_ok", "initiator", "strength", "multi_rank", "source_url"}
        if len(slugs) > 1:
            assert row["class"] in slugs, row
            assert all(s in slugs for s in filter(None, row["also_ok"].split(","))), row
        assert (tmp_path / "cases" / row["file"]).is_dir()
        for term in row["initiator"].split("&"):
            key, _, value = term.partition("=")
            assert key in {"rank", "host", "gpu", "pid", "unknown"} or term == "unknown", term
            if key == "rank":
                assert 0 <= int(value) < 64


def test_a_64_rank_job_generates(tmp_path: Path) -> None:
    res = generate(tmp_path, 1, seed=5, ranks=[64], quiet=True)
    files = [p for p in (tmp_path / "cases").rglob("*") if p.is_file()]
    assert files
    text = "".join(p.read_text() for p in files)
    assert text.count("\n") > 200
    assert res[0]["truth"]["world"] == 64  # type: ignore[index]


def test_default_mix_of_sizes() -> None:
    sizes = sizes_for(40, [512, 1024, 2048, 4096])
    assert len(sizes) == 40
    assert sizes.count(512) == 16 and sizes.count(4096) == 4
