"""One traceback tells one failure, by its most precise line (`core._specific_over_generic`), one branch per test:
a generic exception class yields to a specific failure of the same process, a rule yields to the classes it
names in `yields_to`, and a hint (a peer's report naming the culprit, tag `hint`) yields to the named rank's own
failure.

In each job the line that must yield comes first and is as confident as (or more than) the line it yields
to, and neither explains the other (a traceback's lines have no time of their own offline: a line cannot
explain one above it in its file), so only the yielding puts the precise line first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from correlator.diagnosis.engine import Engine
from correlator.diagnosis.rules import load_ruleset
from correlator.diagnosis.signals import SignalExtractor
from correlator.offline.diagnose import Diagnoser
from tests.unit.engine.conftest import JobBuilder, run
from tests.unit.engine.test_specific_beats_generic import _generic_boosted

SITE = "/usr/local/lib/python3.11/site-packages"

# torchrun --tee 3: a rank's lines behind its launcher's `[defaultN]:` and c10d's `[rankN]:` prefixes; python
# logging gives the first line its time, the traceback below it has none of its own.
DATALOADER_RERAISE = f"""\
[default3]:[rank3]:2026-03-14 09:31:02,117 - INFO - train - step 1200/20000 | loss 2.1840 | lr 2.95e-04 | 1.18 s/it
[default3]:[rank3]: Traceback (most recent call last):
[default3]:[rank3]:   File "/workspace/train.py", line 388, in train
[default3]:[rank3]:     for step, batch in enumerate(train_loader):
[default3]:[rank3]:                        ^^^^^^^^^^^^^^^^^^^^^^^
[default3]:[rank3]:   File "{SITE}/torch/utils/data/dataloader.py", line 708, in __next__
[default3]:[rank3]:     data = self._next_data()
[default3]:[rank3]:            ^^^^^^^^^^^^^^^^^
[default3]:[rank3]:   File "{SITE}/torch/utils/data/dataloader.py", line 1480, in _next_data
[default3]:[rank3]:     return self._process_data(data)
[default3]:[rank3]:            ^^^^^^^^^^^^^^^^^^^^^^^^
[default3]:[rank3]:   File "{SITE}/torch/utils/data/dataloader.py", line 1505, in _process_data
[default3]:[rank3]:     data.reraise()
[default3]:[rank3]:   File "{SITE}/torch/_utils.py", line 733, in reraise
[default3]:[rank3]:     raise RuntimeError(msg) from None
[default3]:[rank3]: RuntimeError: Caught ReadTimeoutError in DataLoader worker process 2.
[default3]:[rank3]: Original Traceback (most recent call last):
[default3]:[rank3]:   File "{SITE}/torch/utils/data/_utils/worker.py", line 349, in _worker_loop
[default3]:[rank3]:     data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
[default3]:[rank3]:            ^^^^^^^^^^^^^^^^^^^^
[default3]:[rank3]:   File "{SITE}/torch/utils/data/_utils/fetch.py", line 33, in fetch
[default3]:[rank3]:     data.append(next(self.dataset_iter))
[default3]:[rank3]:                 ^^^^^^^^^^^^^^^^^^^^^^^
[default3]:[rank3]:   File "/workspace/data.py", line 144, in __iter__
[default3]:[rank3]:     buf = self._read_shard(url)
[default3]:[rank3]:   File "/workspace/data.py", line 121, in _read_shard
[default3]:[rank3]:     return obj['Body'].read()
[default3]:[rank3]:   File "{SITE}/botocore/response.py", line 99, in read
[default3]:[rank3]:     chunk = self._raw_stream.read(amt)
[default3]:[rank3]: botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://corpus-eu.s3.eu-west-1.amazonaws.com/tok/train-00417.bin"
"""

# torch >= 2.6: torch.load's restricted unpickler meets a byte that is no opcode; the wrapper's message comes
# first, the unpickler's own error on a line of its own below it.
WEIGHTS_ONLY_DAMAGED = f"""\
[default0]:[rank2]:2026-03-14 09:28:51,204 - INFO - ckpt - restoring /ckpt/run-17/step_4000/shard-00002-of-00004.pt
[default1]:[rank3]:2026-03-14 09:28:51,206 - INFO - ckpt - restoring /ckpt/run-17/step_4000/shard-00003-of-00004.pt
[default0]:[rank2]: Traceback (most recent call last):
[default0]:[rank2]:   File "/workspace/train.py", line 281, in restore
[default0]:[rank2]:     shard = torch.load(path, weights_only=True)
[default0]:[rank2]:             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[default0]:[rank2]:   File "{SITE}/torch/serialization.py", line 1548, in load
[default0]:[rank2]:     raise pickle.UnpicklingError(_get_wo_message(str(e))) from None
[default0]:[rank2]: _pickle.UnpicklingError: Weights only load failed. In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, but it can result in arbitrary code execution. Do it only if you got the file from a trusted source.
[default0]:[rank2]: Please file an issue with the following so that we can make `weights_only=True` compatible with your use case: WeightsUnpickler error:
[default0]:
[default0]:[rank2]: Unsupported operand 149
[default0]:
[default0]:[rank2]: Check the documentation of torch.load to learn more about types accepted by default with weights_only https://pytorch.org/docs/stable/generated/torch.load.html.
W0314 09:28:53.139000 1414 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 1420 closing signal SIGTERM
E0314 09:28:53.335000 1414 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0 (pid: 1419) of binary: /usr/bin/python3
"""  # noqa: E501 - log lines as torch writes them, whole


@pytest.fixture(scope="module", params=["library", "generic-boosted"])
def diagnoser(request: pytest.FixtureRequest) -> Diagnoser:
    ruleset = load_ruleset()
    return Diagnoser(ruleset if request.param == "library" else _generic_boosted(ruleset))


def _diagnose(diagnoser: Diagnoser, tmp_path: Path, files: dict[str, str]) -> list:  # type: ignore[type-arg]
    paths = []
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(str(path))
    incidents, _ = diagnoser.diagnose(paths, "yield")
    return incidents


def test_the_generic_wrapper_printed_above_a_dataloader_workers_error_yields_to_it(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    """torch re-raises a DataLoader worker's exception in the main process as `RuntimeError: Caught
    ReadTimeoutError in DataLoader worker process 2.` and prints the worker's own traceback below it: the
    generic wrapper comes first, the S3 read timeout last. With the generic rules as confident as the
    specific ones (the library's catch-alls boosted to 0.95), the wrapper is the earlier line of the top tier;
    the specific failure of the same process in the same traceback still names the class.
    (Off: `_specific_over_generic` without its GENERIC_CLASSES branch -> python_exception, with the boosted
    rules.)"""
    primary = _diagnose(diagnoser, tmp_path, {"node01.log": DATALOADER_RERAISE})[0]
    assert (primary.class_, primary.initiator.rank) == ("streaming_data_error", 3)


def test_a_rule_yields_to_the_class_it_names_in_yields_to(tmp_path: Path, diagnoser: Diagnoser) -> None:
    """`weights-only-load-refused` (0.95: "Weights only load failed") yields to checkpoint_corruption; the
    restricted unpickler's "Unsupported operand 149" two lines below it (`weights-only-unpickler-damaged-stream`,
    0.9) says the bytes are damaged, not of a type the allow-list lacks: the class is the damaged checkpoint,
    on rank 2. Neither line explains the other (the wrapper's rule does not list checkpoint_corruption, and
    the damaged-stream line is below the wrapper in the file). (Off: `_specific_over_generic` ignoring the
    rule's `yields_to` -> weights_only_unpickling_error, the earlier line of the same tier.)"""
    primary = _diagnose(diagnoser, tmp_path, {"node02.log": WEIGHTS_ONLY_DAMAGED})[0]
    assert (primary.class_, primary.initiator.rank) == ("checkpoint_corruption", 2)


BARRIER = ("[rank0]:[E314 09:29:23.326015692 ProcessGroupGloo.cpp:67] [Rank 0]: Rank {n} failed to pass monitoredBarrier "
           "in 30000 ms")
BARRIER_RAISED = "[rank0]: RuntimeError: [Rank 0]: Rank {n} failed to pass monitoredBarrier in 30000 ms"
REACHED = ("[rank{r}]:[E314 09:29:23.340183266 ProcessGroupGloo.cpp:67] Rank {r} successfully reached monitoredBarrier, "
           "but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.")
SEGV_REPORT = ("E0314 09:29:25.020000 1234 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -11) "
               "local_rank: {local} (pid: {pid}) of binary: /usr/bin/python3")


def test_the_hint_naming_a_rank_yields_to_that_ranks_own_failure(engine: Engine, extractor: SignalExtractor) -> None:
    """One node, 8 ranks, TORCH_DISTRIBUTED_DEBUG=DETAIL (NCCL for training, gloo's monitoredBarrier before
    each collective): rank 6 dies of a segfault without a line of its own; rank 0's monitoredBarrier names it
    (`Rank 6 failed to pass monitoredBarrier`, a hint: who, not what) and the other ranks raise. The agent's
    monitor loop reports rank 6's exit on SIGSEGV (its pid, which NCCL's init line tied to rank 6) 1.7 s after
    the hint: that report says what happened, so the hint yields to it. (Off: `_specific_over_generic`
    without its hint branch -> straggler_hang, the hint being the earlier line of the same tier.)"""
    job = JobBuilder(world=8, hosts=1, skew_s=0.0, seed=61)
    job.init_lines()
    job.emit(0, 130.0, BARRIER.format(n=6))
    job.emit(0, 130.001, BARRIER_RAISED.format(n=6))
    for r in (1, 2, 3, 4, 5, 7):
        job.emit(r, 130.02 + 0.01 * r, REACHED.format(r=r))
    job.emit(None, 131.7, SEGV_REPORT.format(local=6, pid=40006), host=job.hosts[0])
    primary = run(engine, extractor, list(job.shuffled()))[0]
    assert (primary.class_, primary.initiator.rank) == ("process_crash_signal", 6)
