"""The README's operator path, as a new user runs it (issue 17), with only documented commands and flags:

    make demo                      (its command: python -m correlator.tooling.demo)
    rootrank up &
    rootrank webhooks add --job demo URL --generate-secret
    rootrank simulate --demo --out sim
    rootrank ship --job demo --host-from dir --file 'sim/*/*/*.log'   (read from the README, as written)
    rootrank incidents --job demo            -> the incident names the simulated host (node04), not this
                                                machine; the receiver got one signed notification
    rootrank show ID                         -> the same renderer as diagnose
    rootrank up                              -> "already running", exit 1

Real servers: the embedded stack `rootrank up` starts (noida-db's Kafka and Elasticsearch APIs from
their PyPI wheel) on free ports, and the local webhook receiver of tests/fixtures/http_receiver.py.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.http_receiver import HttpReceiver
from tests.integration.operator_support import ROOT, new_user_shell
from tests.integration.test_docs import shell_blocks

pytestmark = pytest.mark.timeout(420)


def readme_ship_command() -> str:
    """The operator quick start's `rootrank ship` line, as the README writes it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quick start: cluster operator"):]
    for block in shell_blocks(ROOT / "README.md"):
        if block.run and block.text in section:
            for line in block.text.splitlines():
                if line.startswith("rootrank ship "):
                    return line.split("   #")[0].strip()
    raise AssertionError("the README's operator quick start has no rootrank ship line")


def _noida_available() -> bool:
    from correlator.tooling.embedded import noida_binary

    return noida_binary() is not None


@pytest.mark.skipif(not _noida_available(), reason="noida-db is not installed (make install)")
def test_operator_quick_start_as_written(tmp_path: Path, http_receiver: HttpReceiver) -> None:
    with new_user_shell(tmp_path) as sh:
        # make demo (the Makefile's command, from the checkout)
        demo = sh.run(f"cd {ROOT} && {sys.executable} -m correlator.tooling.demo --out {tmp_path / 'demo-out'}",
                      timeout=240)
        assert demo.returncode == 0, demo.stderr[-3000:]
        assert (tmp_path / "demo-out" / "demo-incident.html").is_file()

        sh.start_up()
        env = sh.run("rootrank up --print-env", check=True).stdout
        assert "export ROOTRANK_API_TOKEN=" in env and "export ROOTRANK_KAFKA__BOOTSTRAP_SERVERS=" in env

        added = sh.run(f"rootrank webhooks add --job demo {http_receiver.url('/hook')} --generate-secret",
                       check=True)
        secret = re.search(r"(whsec_\S+)", added.stdout)
        assert secret, added.stdout
        http_receiver.expect_secret(secret.group(1))
        listed = sh.run("rootrank webhooks list --job demo", check=True).stdout
        assert "signed" in listed

        assert "bin/activate" in demo.stdout and "pipx install ." in demo.stdout  # how to get rootrank on PATH
        sh.run("rootrank simulate --demo --out sim", check=True)
        truth = json.loads((sh.cwd / "sim" / "truth.json").read_text())
        ship = readme_ship_command()
        assert ship.startswith("rootrank ship --job demo "), ship
        shipped = sh.run(ship, check=True)
        assert "2286 lines" in shipped.stderr or "lines in" in shipped.stderr, shipped.stderr

        incident = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            listing = sh.run("rootrank incidents --job demo --format json")
            assert listing.returncode == 0, listing.stderr
            lines = [json.loads(line) for line in listing.stdout.splitlines() if line.strip()]
            if lines:
                incident = lines[0]
                break
            time.sleep(2)
        assert incident is not None, f"no incident in the search store:\n{sh.up_log()}"
        assert incident["class"] == "gpu_hardware_error"
        assert incident["initiator"]["rank"] == 37
        # The simulated host, not the machine the files were shipped from.
        assert incident["initiator"]["host"] == "node04" == truth["initiator"]["host"], incident["initiator"]

        table = sh.run("rootrank incidents --job demo", check=True).stdout
        assert incident["incident_id"] in table

        [notification] = http_receiver.wait_for(1, delivered=True, timeout=60)
        assert notification.signature_valid is True
        body = json.loads(notification.body)
        assert json.dumps(body).count(incident["incident_id"]) >= 1
        time.sleep(3)  # nothing else should follow: one incident, one notification
        assert len(http_receiver.delivered()) == 1

        shown = sh.run(f"rootrank show {incident['incident_id'][:10]}", check=True).stdout
        assert "Xid 79" in shown and "rank 37" in shown and "63 other ranks" in shown
        assert "host node04" in shown
        html = sh.run(f"rootrank show {incident['incident_id']} --format html", check=True).stdout
        assert html.lstrip().startswith("<!DOCTYPE html>")

        second = sh.run("rootrank up", timeout=60)
        assert second.returncode == 1
        assert "already running" in second.stderr

        assert sh.stop_up() == 0, sh.up_log()
        assert not sh.context_file.exists()
        gone = sh.run("rootrank up --print-env")
        assert gone.returncode == 1 and "no rootrank up is running" in gone.stderr
