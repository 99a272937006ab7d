"""The fault lab's scenarios and labels, checked without running a job (no torch needed: issue #26).

`make lab` runs the jobs; this checks what can be checked from the definitions alone: they load, they
cover every fault of the issue's list in the counts it asks for, their classes are taxonomy slugs, the
labels derive from where the fault was injected, and the runner writes the log shapes the tools write.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from lab.runner import Console, _srun_width, write_case
from lab.scenario import (
    COVERAGE,
    LABEL_COLUMNS,
    Scenario,
    ScenarioError,
    derive_initiator,
    label_row,
    load_all,
    load_file,
    select,
)

REPO = Path(__file__).resolve().parents[2]
TAXONOMY = REPO.parent / "shared" / "taxonomy.yaml"

SCENARIOS = load_all()


def _slugs() -> set[str]:
    path = TAXONOMY if TAXONOMY.exists() else REPO / "rules" / "classes.yaml"
    return {c["slug"] for c in yaml.safe_load(path.read_text())["classes"]}


def _scenario(**kw: object) -> Scenario:
    base: dict[str, object] = {
        "name": "t", "covers": ["bad_record"], "about": "a scenario built by the test", "hosts": 2, "procs": 2,
        "launcher": "torchrun", "fault": {"kind": "bad_record", "rank": 3, "step": 4, "variant": "json"},
        "fired": ["JSONDecodeError"], "label": {"class": "python_exception", "why": "rank 3 raised first"},
    }
    base.update(kw)
    return Scenario.model_validate(base)


# --- the issue's counts -----------------------------------------------------------------------------

def test_at_least_40_scenarios_with_unique_names() -> None:
    assert len(SCENARIOS) >= 40
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)


def test_every_fault_of_the_issue_is_covered() -> None:
    covered = {c for s in SCENARIOS for c in s.covers}
    assert set(COVERAGE) - covered == set()


def test_scale_skew_and_restart_counts() -> None:
    large = [s for s in SCENARIOS if 8 <= s.world <= 16 and 2 <= s.hosts <= 4]
    skewed = [s for s in SCENARIOS if s.skewed]
    restarts = [s for s in SCENARIOS if s.max_restarts > 0]
    assert len(large) >= 8, [s.name for s in large]
    assert len(skewed) >= 6, [s.name for s in skewed]
    assert len(restarts) >= 3, [s.name for s in restarts]
    assert all(2 <= s.world <= 16 for s in SCENARIOS)


def test_skew_puts_an_initiator_host_ahead_and_a_victim_host_ahead() -> None:
    initiator_ahead = victim_ahead = False
    for s in SCENARIOS:
        f = s.last_fault
        home = f.host or (s.static_host_of(f.rank) if f.rank is not None else None)
        for host, secs in s.clocks.items():
            if secs >= 3 and host == home:
                initiator_ahead = True
            if secs >= 3 and home is not None and host != home:
                victim_ahead = True
    assert initiator_ahead and victim_ahead


def test_every_launcher_and_log_shape_is_used() -> None:
    assert {s.launcher for s in SCENARIOS} == {"torchrun", "torchrun-logdir", "spawn", "accelerate", "hf-trainer",
                                               "lightning"}
    assert {s.collect for s in SCENARIOS} == {"per-host", "srun", "pdsh", "console"}
    assert {s.rdzv for s in SCENARIOS} == {"static", "c10d"}
    assert len({s.logs for s in SCENARIOS}) >= 5


# --- labels -----------------------------------------------------------------------------------------

def test_label_classes_are_taxonomy_slugs() -> None:
    slugs = _slugs() | {"none"}
    for s in SCENARIOS:
        assert s.label.class_ in slugs, s.name
        assert set(s.label.also_ok) <= slugs - {"none"}, s.name
        assert s.label.class_ not in s.label.also_ok, s.name


def test_traps_are_none_and_end_well_the_rest_fail() -> None:
    for s in SCENARIOS:
        if "trap_transient_recovered" in s.covers or "trap_warning_heavy_clean" in s.covers:
            assert s.label.class_ == "none" and s.expect == "ok", s.name
        elif "grad_norm_spike" in s.covers:
            assert s.label.class_ == "sdc_grad_norm_spike" and s.expect == "ok", s.name
            assert derive_initiator(s) == f"rank={s.last_fault.rank}", s.name
        else:
            assert s.label.class_ != "none" and s.expect == "fail", s.name


def test_a_rendezvous_misconfiguration_is_labelled_with_its_host() -> None:
    for s in SCENARIOS:
        if "rendezvous_misconfig" in s.covers:
            assert derive_initiator(s) == f"host={s.last_fault.host}", s.name


def test_initiator_of_a_rank_fault() -> None:
    s = _scenario()
    assert derive_initiator(s) == "rank=3"
    # the pid is no term (the right pid under a wrong rank is a wrong answer); c10d's hosts come from side files
    assert derive_initiator(s, {3: {"pid": 4242, "host": "node02", "local_rank": 1}}) == "rank=3"
    solo_c10d = _scenario(hosts=4, procs=1, rdzv="c10d")
    assert derive_initiator(solo_c10d) == "rank=3"
    assert derive_initiator(solo_c10d, {3: {"pid": 7, "host": "node01", "local_rank": 0}}) == "rank=3&host=node01"
    # one host: the local rank is the rank
    one = _scenario(hosts=1, procs=4)
    assert derive_initiator(one) == "rank=3&local_rank=3"
    # one rank per host: naming the host names the rank
    solo = _scenario(hosts=4, procs=1)
    assert derive_initiator(solo) == "rank=3&host=node04"


def test_initiator_of_a_host_fault_and_of_all() -> None:
    shm = _scenario(fault={"kind": "shm_small", "host": "node02"},
                    label={"class": "shm_exhausted", "why": "node02's /dev/shm is tiny"})
    assert derive_initiator(shm) == "host=node02&rank=2&rank=3"
    c10d = _scenario(rdzv="c10d", fault={"kind": "shm_small", "host": "node02"},
                     label={"class": "shm_exhausted", "why": "node02's /dev/shm is tiny"})
    # c10d assigns ranks at run time: the ranks come from the side files
    assert derive_initiator(c10d, {0: {"host": "node02"}, 1: {"host": "node01"}, 2: {"host": "node02"}}) == \
        "host=node02&rank=0&rank=2"
    rdzv = _scenario(fault={"kind": "rdzv_wrong_port", "host": "node02"},
                     label={"class": "rendezvous_failure", "why": "node02 dialled the wrong port"})
    assert derive_initiator(rdzv) == "host=node02"
    every = _scenario(fault={"kind": "state_dict", "variant": "shape"},
                      label={"class": "model_state_dict_mismatch", "initiator": "all", "why": "every rank fails"})
    assert derive_initiator(every) == "all"


def test_restarts_are_labelled_with_the_last_attempt() -> None:
    s = _scenario(hosts=1, procs=4, max_restarts=1, fault=None,
                  attempts=[{"kind": "bad_record", "rank": 1, "step": 9}, {"kind": "sigsegv", "rank": 2, "step": 3}],
                  label={"class": "process_crash_signal", "why": "the last attempt segfaulted"})
    assert derive_initiator(s) == "rank=2&local_rank=2"


def test_label_row_has_the_corpus_columns() -> None:
    for s in SCENARIOS:
        row = label_row(s)
        assert tuple(row) == LABEL_COLUMNS
        assert row["file"] == s.name and row["class"] == s.label.class_
        assert all("\t" not in v and "\n" not in v for v in row.values())


# --- validation and errors ---------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "line", "what"), [
    (("- name: a\n  covers: [bad_record]\n  about: something that breaks\n  procs: 2\n  launcher: torchrun\n"
     "  fault: {kind: bad_record, rank: 5}\n  fired: [x]\n  label: {class: python_exception, why: rank five raised}\n"),
     2, "fault rank 5 outside the world of 2"),
    (("- name: a\n  covers: [bad_record]\n  about: something that breaks\n  procs: 2\n  launcher: torchrun\n"
     "  fault: {kind: bad_record, rank: 1}\n  fired: [x]\n  label:\n    class: not_a_class\n    why: rank one raised\n"),
     10, "unknown class 'not_a_class'"),
    (("- name: a\n  covers: [bad_record]\n  about: something that breaks\n  procs: 2\n  launcher: torchrun\n"
     "  colour: blue\n  fault: {kind: bad_record, rank: 1}\n  fired: [x]\n"
     "  label: {class: python_exception, why: rank one raised}\n"), 2, "colour"),
    (("- name: a\n  covers: [bad_record]\n  about: something that breaks\n  procs: 2\n  launcher: torchrun\n"
     "  fault:\n    kind: sigkill\n    host: node01\n  fired: [x]\n  label: {class: python_exception, why: one raised}\n"),
     8, "injected in a rank, not a host"),
    ("- name: a\n  covers: [bad_record\n", 4, "not valid YAML"),
])
def test_errors_say_file_and_line(tmp_path: Path, body: str, line: int, what: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("scenarios:\n" + textwrap.indent(body, "  "))
    with pytest.raises(ScenarioError) as err:
        load_file(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert what in msg


def test_select_by_name_or_coverage_item() -> None:
    assert [s.name for s in select(SCENARIOS, SCENARIOS[0].name)] == [SCENARIOS[0].name]
    sig = select(SCENARIOS, "sigkill")
    assert sig and all("sigkill" in s.covers for s in sig)
    with pytest.raises(ScenarioError):
        select(SCENARIOS, "no-such-scenario")


# --- log shapes, without a job ----------------------------------------------------------------------

def test_srun_labels_are_zero_padded_task_numbers() -> None:
    # Slurm's write_labelled_message: "%0*d: " with the width of the largest task id (step_io.c _wid)
    assert _srun_width(4) == 1 and _srun_width(10) == 1 and _srun_width(11) == 2 and _srun_width(16) == 2


def test_collected_consoles_are_written_in_each_shape(tmp_path: Path) -> None:
    console = Console()
    console.lines = [(0, 0, b"a from node01\n"), (1, 1, b"b from node02\n"), (2, 0, b"partial line")]
    shapes = {"per-host": None, "srun": None, "pdsh": None}
    for collect in shapes:
        s = _scenario(collect=collect)
        case = tmp_path / collect
        write_case(s, console, case, tmp_path)
        files = {p.name: p.read_text() for p in case.iterdir()}
        shapes[collect] = files
    assert shapes["per-host"] == {"node01.log": "a from node01\npartial line\n", "node02.log": "b from node02\n"}
    (name, text), = shapes["srun"].items()
    assert name.startswith("slurm-") and name.endswith(".out")
    assert text == "0: a from node01\n1: b from node02\n0: partial line\n"
    assert shapes["pdsh"] == {"train.log": "node01: a from node01\nnode02: b from node02\nnode01: partial line\n"}


def test_the_lab_imports_without_torch() -> None:
    code = ("import sys, lab.scenario, lab.runner, lab.score, lab.__main__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'lightning')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docs_table_lists_every_scenario() -> None:
    doc = (REPO / "docs" / "lab.md").read_text()
    missing = [s.name for s in SCENARIOS if f"`{s.name}`" not in doc]
    assert not missing, f"docs/lab.md's table lacks {missing}: python -m lab list --markdown"
