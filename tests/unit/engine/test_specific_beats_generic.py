"""The specific failure beats the generic one: chained tracebacks and launcher summaries, end to end from text."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from correlator.diagnosis.rules import GENERIC_CLASSES, RuleSet, load_ruleset
from correlator.offline.diagnose import Diagnoser

CHAINED_CAUSE = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/safetensors/torch.py", line 311, in load_file
[rank0]:     with safe_open(filename, framework="pt", device=device) as f:
[rank0]: safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge
[rank0]:
[rank0]: The above exception was the direct cause of the following exception:
[rank0]:
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/train.py", line 88, in <module>
[rank0]:     model = load_weights(args.checkpoint)
[rank0]:   File "/workspace/train.py", line 41, in load_weights
[rank0]:     raise RuntimeError(f"could not load checkpoint {path}") from exc
[rank0]: RuntimeError: could not load checkpoint /ckpt/step_1000/model.safetensors
"""

DURING_HANDLING = """\
2026-03-14 09:26:53,118 - INFO - loading /ckpt/step_4000/model.pt
Traceback (most recent call last):
  File "/workspace/train.py", line 120, in resume
    state = torch.load(path, map_location="cpu")
  File "/opt/conda/lib/python3.11/site-packages/torch/serialization.py", line 1025, in load
    with _open_zipfile_reader(opened_file) as opened_zipfile:
  File "/opt/conda/lib/python3.11/site-packages/torch/serialization.py", line 446, in __init__
    super().__init__(torch._C.PyTorchFileReader(name_or_buffer))
RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/workspace/train.py", line 131, in <module>
    resume(args.resume)
  File "/workspace/train.py", line 124, in resume
    raise ValueError("resume failed, checkpoint unusable")
ValueError: resume failed, checkpoint unusable
"""

ONE_PROCESS_KILLED = """\
[2026-03-14 09:37:12,140] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4100 closing signal SIGTERM
[2026-03-14 09:37:12,141] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4102 closing signal SIGTERM
[2026-03-14 09:37:12,141] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4103 closing signal SIGTERM
[2026-03-14 09:37:13,302] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 (pid: 4101) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/run.py", line 812, in run
    elastic_launch(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-03-14_09:37:12
  host      : gpu-node-03
  rank      : 9 (local_rank: 1)
  exitcode  : -9 (pid: 4101)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4101
============================================================
"""  # noqa: E501 - log lines as torchelastic writes them, whole


def _generic_boosted(ruleset: RuleSet) -> RuleSet:
    """The library with its generic catch-alls as confident as its most specific rules: the specific class
    must still win, by being specific, not by a confidence that happens to be lower."""
    rules = tuple(
        dataclasses.replace(lr, rule=lr.rule.model_copy(update={"confidence": 0.95}))
        if lr.rule.class_ in GENERIC_CLASSES else lr
        for lr in ruleset.rules
    )
    return RuleSet(rules=rules, classes=ruleset.classes, version=f"{ruleset.version}-generic-boosted")


@pytest.fixture(scope="module", params=["library", "generic-boosted"])
def diagnoser(request: pytest.FixtureRequest) -> Diagnoser:
    ruleset = load_ruleset()
    return Diagnoser(ruleset if request.param == "library" else _generic_boosted(ruleset))


@pytest.mark.parametrize(
    "text, classes",
    [
        (CHAINED_CAUSE, {"safetensors_load_error"}),
        (DURING_HANDLING, {"torch_load_failed", "checkpoint_corruption"}),
    ],
    ids=["direct-cause", "during-handling"],
)
def test_in_a_chained_traceback_the_first_raised_specific_failure_wins(
    tmp_path: Path, diagnoser: Diagnoser, text: str, classes: set[str]
) -> None:
    log = tmp_path / "train.log"
    log.write_text(text)
    incidents, _ = diagnoser.diagnose([str(log)])
    assert incidents[0].class_ in classes
    assert all(i.class_ != "python_exception" for i in incidents[:1])


def test_the_launchers_report_of_one_killed_process_beats_its_teardown_of_the_others(
    tmp_path: Path, diagnoser: Diagnoser
) -> None:
    log = tmp_path / "agent.log"
    log.write_text(ONE_PROCESS_KILLED)
    incidents, _ = diagnoser.diagnose([str(log)])
    primary = incidents[0]
    assert primary.class_ in ("host_oom_kill", "process_crash_signal")
    assert primary.initiator.pid == 4101
    # the summary's lines (host, rank, exit code and pid on lines of their own) tell who the process was
    assert (primary.initiator.rank, primary.initiator.host) == (9, "gpu-node-03")
    teardown = [c for c in primary.collateral if c.class_ == "launcher_teardown"]
    assert teardown and teardown[0].count >= 3
