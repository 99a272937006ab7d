"""`rootrank replay --job J`: a job's lines, read again from the logs topic, give diagnose's incidents, and
with another rule set that rule set's: what an operator runs after a rule change."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.fixtures.equivalence import open_essentials
from tests.integration.operator_support import new_user_shell

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_replay_gives_diagnoses_incidents_and_follows_a_rule_change(tmp_path: Path) -> None:
    from correlator.diagnosis.rules import default_rules_dir

    job = f"replay-{time.time_ns() % 10**8}"
    with new_user_shell(tmp_path / "home") as sh:
        sh.env.update(ROOTRANK_ENGINE__QUIET_WINDOW_S="3", ROOTRANK_ENGINE__TICK_INTERVAL_S="0.5")
        sh.start_up()
        sh.run("rootrank simulate --class cuda_oom --world-size 8 --hosts 2 --seed 4 --out sim", check=True)
        sh.run("rootrank simulate --class nccl_timeout --world-size 8 --hosts 2 --seed 5 --out other", check=True)
        for folder, name in (("sim", job), ("other", f"{job}-other")):  # another job's lines in the same topic
            for host in ("node00", "node01"):
                sh.run(f"rootrank ship --job {name} --host {host} --file '{folder}/*/{host}/*.log'", check=True)
        offline = json.loads(sh.run(f"rootrank diagnose --format json --job {job} sim/*/", check=True).stdout)
        assert offline["incidents"][0]["class"] == "cuda_oom"

        replayed = sh.run(f"rootrank replay --job {job} --format json", timeout=300)
        assert replayed.returncode == 0, replayed.stderr
        report = json.loads(replayed.stdout)
        assert open_essentials(report["incidents"] + report["recovered"]) == \
            open_essentials(offline["incidents"] + offline["recovered"])
        assert f"signals of job {job}" in replayed.stderr

        # A rule change: the OOM rules gone, the same lines tell another story (the OOM's traceback is
        # now a generic exception), and replay says so.
        rules = tmp_path / "rules"
        shutil.copytree(default_rules_dir(), rules, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        for path in rules.rglob("cuda-oom-*.yaml"):
            path.unlink()
        changed = json.loads(sh.run(f"rootrank replay --job {job} --format json --rules {rules}", timeout=300,
                                    check=True).stdout)
        assert changed["incidents"] and changed["incidents"][0]["class"] != "cuda_oom"
        again = json.loads(sh.run(f"rootrank diagnose --format json --job {job} --rules {rules} sim/*/",
                                  check=True).stdout)
        assert open_essentials(changed["incidents"]) == open_essentials(again["incidents"])

        nothing = sh.run("rootrank replay --job no-such-job --format json", timeout=300)
        assert nothing.returncode == 0 and "no line of job no-such-job" in nothing.stderr
        assert json.loads(nothing.stdout) == {"incidents": [], "recovered": []}
