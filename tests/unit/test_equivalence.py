"""One engine, one answer: the stream's code gives the incidents `rootrank diagnose` gives, for every shape
of job, whatever the order and the batching of its lines.

Each job (tests/fixtures/equivalence.py: every simulated class in turn in each shape and framing, a few
harder simulated stories, and hand-written torchrun-shaped jobs) is diagnosed offline, and run through
the stream's code in process: the values `rootrank ship` or a forwarder makes, shuffled across their
keys, matched in batches by the match role's MatchProcessor, sent as the signals topic's JSON to the
correlate agent's JobCorrelator, its window closed at random points on the way (late lines revise what
was sent) and once at the end. The incidents still open must equal diagnose's: ids, class, initiator,
collateral, recovered. Two runs per job: small shipped batches (2 KiB) matched one to three values at
a time, and the default batches matched 5,000 at a time, in another order.

tests/integration/test_equivalence.py runs a set of such jobs through the real stack (`rootrank up`,
`rootrank ship`, a forwarder's producer, the worker, the search store) and the `rootrank diagnose`
command.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from correlator.tooling.simulate import Options, classes
from tests.fixtures.equivalence import (
    FORWARDERS,
    HANDWRITTEN,
    SHAPES,
    EqJob,
    Paths,
    simulated_job,
    stream_values,
)

KINDS = (*SHAPES, *FORWARDERS)
# Stories that stress order and framing harder: restarts, red herrings, a cause flushed late, tensor-parallel
# groups, lines that reach their file late.
HARDER = [
    ("cuda_oom", 5, "hosts", Options(restart="nccl_error", herrings=True)),
    ("gpu_hardware_error", 6, "logdir", Options(cause_late=True, tp_size=4)),
    ("straggler_hang", 7, "single", Options(herrings=True)),
    ("nccl_timeout", 8, "fluentbit", Options(tp_size=4)),
    ("host_oom_kill", 9, "hosts", Options(restart="cuda_oom")),
    # every rank raises the same error before any line with a time: files ordered by their keys alone
    ("launch_config_error", 0, "hosts", Options()),
    ("launch_config_error", 0, "logdir", Options()),
]


@pytest.fixture(scope="module")
def paths() -> Paths:
    return Paths()


def _cases() -> list[tuple[str, int, str, Options | None]]:
    """Every class of the taxonomy in three of the seven kinds (each kind about as often), with seeds."""
    cases: list[tuple[str, int, str, Options | None]] = [
        (cls, (index + turn) % 3, KINDS[(index + 2 * turn) % len(KINDS)], None)
        for index, cls in enumerate(classes()) for turn in range(3)]
    return cases + [(cls, seed, kind, options) for cls, seed, kind, options in HARDER]


def _check(paths: Paths, job: EqJob, seed: int) -> None:
    offline = paths.offline(job)
    assert offline, f"diagnose found nothing in {job.name}"
    rng = random.Random(seed)
    for ship_kib, batch in ((2, rng.randint(1, 3)), (256, 5000)):
        values = stream_values(job, batch_max_bytes=ship_kib * 1024)
        streamed = paths.stream(job, values, seed=rng.randrange(1 << 30), batch=batch)
        assert streamed == offline, ((f"{job.name}: shipped in {ship_kib} KiB batches, matched {batch} values at a "
                                     f"time, {len(values)} values"), streamed, offline)


@pytest.mark.parametrize(("cls", "seed", "kind", "options"), _cases(),
                         ids=[f"{c}-{s}-{k}{'-harder' if o else ''}" for c, s, k, o in _cases()])
def test_the_stream_gives_what_diagnose_gives(paths: Paths, tmp_path: Path, cls: str, seed: int, kind: str,
                                              options: Options | None) -> None:
    job = simulated_job(tmp_path, cls, seed, kind, options=options)
    _check(paths, job, seed)


@pytest.mark.parametrize("make", HANDWRITTEN, ids=[m.__name__ for m in HANDWRITTEN])
def test_the_stream_gives_what_diagnose_gives_on_torchrun_shaped_logs(paths: Paths, tmp_path: Path, make: object) -> None:
    job = make(tmp_path, f"hand-{make.__name__}")  # type: ignore[operator]
    _check(paths, job, 11)
