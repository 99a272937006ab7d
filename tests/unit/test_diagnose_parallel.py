"""Large plain files are mapped and their chunks scanned in place, by several forked processes:
the incidents must be the ones the sequential reader finds, whatever the chunk edges cut."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from correlator.offline import diagnose
from correlator.offline.diagnose import Diagnoser, DiagnoseStats, _regions
from correlator.tooling.simulate import log_paths, simulate


@pytest.fixture(scope="module")
def diagnoser() -> Diagnoser:
    return Diagnoser()


def _essentials(incidents: list[object]) -> list[tuple[object, ...]]:
    return [
        (i.incident_id, i.class_, i.initiator.rank, i.initiator.host, tuple((c.class_, tuple(c.ranks)) for c in i.collateral))  # type: ignore[attr-defined]
        for i in incidents
    ]


def test_regions_end_after_a_newline_and_cover_the_buffer() -> None:
    buf = b"".join(f"line {i}\n".encode() for i in range(1000)) + b"no newline at the end"
    regions = _regions(buf, 64)
    assert regions[0][0] == 0 and regions[-1][1] == len(buf)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(regions))
    assert all(buf[hi - 1 : hi] == b"\n" for _, hi in regions[:-1])
    assert all(hi - lo <= 64 + len("no newline at the end") for lo, hi in regions)


@pytest.mark.parametrize("cls", ["cuda_oom", "nccl_timeout", "checkpoint_corruption"])
def test_mapped_and_parallel_scans_find_the_sequential_incidents(
    cls: str, diagnoser: Diagnoser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = simulate(cls, world_size=16, hosts=2, seed=3, noise_lines=200, skew_max_s=3.0, out=tmp_path)
    paths = log_paths(tmp_path, truth)
    monkeypatch.setattr(diagnose, "CHUNK_BYTES", 1024)  # every host file spans many chunks
    sizes = [Path(p).stat().st_size for p in paths]
    assert min(sizes) > 4 * 1024, sizes

    sources = diagnose.iter_sources

    def unmapped(raw: list[str], stats: DiagnoseStats):  # type: ignore[no-untyped-def]
        for source in sources(raw, stats):
            source.path = None  # the chunked reader that stdin and .gz files use
            yield source

    monkeypatch.setattr(diagnose, "iter_sources", unmapped)
    sequential, _ = diagnoser.diagnose(paths, truth.job_id)
    monkeypatch.setattr(diagnose, "iter_sources", sources)

    diagnoser.jobs = 1
    mapped_stats = DiagnoseStats()
    mapped, _ = diagnoser.diagnose(paths, truth.job_id, stats=mapped_stats)
    diagnoser.jobs = 2
    progress: list[int] = []
    parallel_stats = DiagnoseStats()
    parallel, _ = diagnoser.diagnose(paths, truth.job_id, stats=parallel_stats, progress=progress.append)
    diagnoser.jobs = 1

    assert sequential and sequential[0].class_ == cls
    assert _essentials(mapped) == _essentials(sequential)
    assert _essentials(parallel) == _essentials(sequential)
    assert parallel_stats.bytes == mapped_stats.bytes == sum(sizes) == sum(progress)
    assert parallel_stats.lines_hit == mapped_stats.lines_hit > 0
