"""Hot reload in a running `rootrank worker`: a rule added to the rule folder is matched a few
seconds later, a broken rule is reported with `file:line` while the last good set keeps running,
SIGHUP reloads on demand, and every incident names the rule-set version that produced it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from correlator.diagnosis.rules import load_ruleset
from ingest.ship.wire_format import encode_batch
from tests.fixtures.kafka import BrokerAddress, produce, read_topic, start_pipeline, wait_for
from tests.unit.test_rules_reload import CANARY, CANARY_RULE, rules_folder

pytestmark = pytest.mark.integration


def test_worker_reloads_rules_and_keeps_the_last_good_set(noida_kafka: BrokerAddress, tmp_path: Path) -> None:
    root = rules_folder(tmp_path)  # a few real rules: each reload is a full load + compile
    first_version = load_ruleset(root).version
    pipeline = start_pipeline(noida_kafka, tmp_path, "rr-reload", ENGINE__RULES_DIR=str(root),
                              ENGINE__RULES_RELOAD_S="1")
    worker = pipeline.worker
    log = worker.log_path

    def reloads() -> int:
        return log.read_text(errors="replace").count("rules reloaded from")

    def send_canary(job: str) -> dict[str, object]:
        produce(noida_kafka, "rootrank.logs",
                [encode_batch([(None, None, "[rank1]: step 9 loss 2.0"), (None, None, f"[rank3]: {CANARY}")],
                              job_id=job, host="node-r", offset=0)])
        (incident,) = pipeline.incidents(job, timeout=60)
        return incident

    try:
        started = time.monotonic()
        # Before: the canary line is nobody's failure.
        produce(noida_kafka, "rootrank.logs", [encode_batch([(None, None, f"[rank3]: {CANARY}")], job_id="reload-before",
                                                            host="node-r", offset=0)])

        (root / "test").mkdir()
        (root / "test" / "reload-canary.yaml").write_text(CANARY_RULE)
        second_version = load_ruleset(root).version
        wait_for(lambda: reloads() >= 1, 60, what="the worker to reload the rules")
        picked_up_s = time.monotonic() - started
        incident = send_canary("reload-added")
        assert incident["initiator"]["rule"] == "reload-canary"  # type: ignore[index]
        assert incident["rule_set_version"] == second_version != first_version
        before = [r for r in read_topic(noida_kafka, "rootrank.incidents", idle_s=0.5, timeout=10)
                  if b'"reload-before"' in r.value]
        assert before == [], "a line sent before the rule existed was matched"

        # A broken rule: reported with file:line; the last good set keeps running.
        broken = root / "test" / "broken.yaml"
        broken.write_text(CANARY_RULE.replace("reload-canary", "broken-rule").replace("severity: critical",
                                                                                      "severity: apocalyptic"))
        wait_for(lambda: f"{broken}:4:" in log.read_text(errors="replace"), 60, what="the broken rule reported")
        assert "rules reload refused, still running rule set " + second_version in log.read_text(errors="replace")
        incident = send_canary("reload-after-broken")
        assert incident["initiator"]["rule"] == "reload-canary"  # type: ignore[index]
        assert incident["rule_set_version"] == second_version
        assert worker.proc is not None and worker.proc.poll() is None

        # Fixed (the broken file removed), then SIGHUP with nothing changed: a reload on demand.
        broken.unlink()
        wait_for(lambda: reloads() >= 2, 60, what="the reload after the fix")
        worker.send_signal(signal.SIGHUP)
        wait_for(lambda: reloads() >= 3, 30, what="the reload on SIGHUP")
        assert worker.proc.poll() is None, "SIGHUP stopped the worker"
        print(f"\nrules hot reload: new rule live {picked_up_s:.1f} s after it was written; broken rule refused "
              f"with file:line, set {second_version} kept running; SIGHUP reloaded; "
              f"{time.monotonic() - started:.1f} s in all")
    finally:
        pipeline.stop()
