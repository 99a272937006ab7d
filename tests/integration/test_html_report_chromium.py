"""The incident picture renders in a real browser: headless Debian Chromium, driven over the DevTools protocol.

Checks what a person would see: the initiator's lane exists and is marked, the initiating event is drawn
inside that lane (layout, not just markup), and the page logs no console error, no uncaught exception and
no blocked request. `ROOTRANK_WRITE_SCREENSHOT=1` also writes docs/img/incident.png from the demo scenario.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from correlator.diagnosis.models import CollateralEntry, Evidence, Incident, Initiator, Signal
from correlator.render.html import render_incident_html
from tests.fixtures.chromium import Browser, needs_chromium

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# Runs in the page after load: what the browser laid out, as JSON.
LAYOUT_PROBE = """
(() => {
  const lane = document.getElementById('initiator-lane');
  const marks = document.querySelectorAll('[data-role="initiator"]');
  const out = {lane: !!lane, marks: marks.length, lanes: document.querySelectorAll('g.lane').length,
               title: document.title, svg: !!document.getElementById('swimlanes')};
  if (lane) {
    const r = lane.getBoundingClientRect();
    out.laneRank = lane.getAttribute('data-rank');
    out.laneHost = lane.getAttribute('data-host');
    out.laneBox = [r.top, r.bottom, r.width];
  }
  if (marks.length) {
    const m = marks[0].querySelector('circle').getBoundingClientRect();
    out.markCenterY = (m.top + m.bottom) / 2;
    out.markBox = [m.width, m.height];
  }
  out.scripts = document.scripts.length;
  out.svgBottom = document.getElementById('swimlanes') ? document.getElementById('swimlanes').getBoundingClientRect().bottom : 0;
  out.bodyHeight = document.documentElement.scrollHeight;
  return JSON.stringify(out);
})()
"""


def _incident_64(init_rank: int = 37) -> tuple[Incident, list[Signal]]:
    """A 64-rank job on 8 skewed hosts: Xid on rank 37's host, CUDA error on 37, watchdog on the other 63."""
    world, hosts = 64, 8
    per = world // hosts
    t0 = datetime(2026, 11, 30, 18, 30, 35, 382000, tzinfo=UTC)
    skew = {f"node{h:02d}": ((h * 7) % 5 - 2) * 1.1 for h in range(hosts)}
    signals: list[Signal] = []

    def add(t: float, host: str, **kw: Any) -> None:
        ts = t0 + timedelta(seconds=t + skew[host])
        signals.append(Signal(job_id="j", order=len(signals), ts=ts, host=host, file=f"{host}.log", **kw))

    ih = f"node{init_rank // per:02d}"
    xid = "NVRM: Xid (PCI:0000:ab:00): 79, pid=26711, GPU has fallen off the bus."
    add(0.0, ih, rule_id="gpu-xid", class_="gpu_hardware_error", role="cause", severity="critical", pid=26711, line=xid)
    add(0.35, ih, rule_id="cuda-launch-failure", class_="cuda_illegal_memory_access", severity="critical", rank=init_rank,
        line="RuntimeError: CUDA error: unspecified launch failure")
    for r in range(world):
        if r != init_rank:
            add(600.6 + (r % 7) * 0.004, f"node{r // per:02d}", rule_id="nccl-watchdog", class_="nccl_timeout",
                role="collateral", rank=r, fields={"seq": 3143, "op": "ALLREDUCE"},
                line=f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3143, OpType=ALLREDUCE)")
    for h in range(hosts):
        add(601.5 + h * 0.1, f"node{h:02d}", rule_id="torchelastic-child-failed", class_="launcher_teardown",
            role="collateral", line="torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ")
    iso = t0.isoformat().replace("+00:00", "Z")
    incident = Incident(
        incident_id="3f1c0a9e5b7d2c4e6a80",
        job_id="sim-gpu-hardware-error-0",
        class_="gpu_hardware_error",
        title=f"GPU hardware fault on rank {init_rank} ({ih})",
        severity="critical",
        confidence=0.95,
        confidence_reason="raised first; explains nccl_timeout on 63 ranks",
        initiator=Initiator(rank=init_rank, local_rank=init_rank % per, host=ih, pid=26711, gpu="5", ts=iso,
                            rule="gpu-xid", line=xid),
        collateral=[CollateralEntry(class_="nccl_timeout", ranks=[r for r in range(world) if r != init_rank],
                                    hosts=sorted(skew), count=world - 1)],
        evidence=[
            Evidence(rank=init_rank, host=ih, ts=iso, rule="gpu-xid", line=xid),
            # Log text is data: markup in it must be shown, never executed.
            Evidence(rank=0, host="node00", ts=iso, rule="nccl-watchdog",
                     line="[Rank 0] Watchdog caught ... <script>console.error('injected')</script><img src=x onerror=alert(1)>"),
        ],
        fix=["Drain the node and run dcgmi diag -r 3.", "Replace the GPU; resume from the last checkpoint."],
        verify=["dcgmi diag -r 3 passes", "No new Xid under load for 24 h."],
        references=["https://docs.nvidia.com/deploy/xid-errors/index.html"],
        window_start=iso,
        window_end=(t0 + timedelta(seconds=602.5)).isoformat(),
        world_size=world,
    )
    return incident, signals


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path.as_uri()


@needs_chromium
def test_initiator_lane_is_marked_and_page_is_clean(browser: Browser, tmp_path: Path) -> None:
    incident, signals = _incident_64()
    url = _write(tmp_path, "incident.html", render_incident_html(incident, signals))

    result = browser.render(url, LAYOUT_PROBE)

    assert result["problems"] == []
    assert result["svg"] and result["lane"]
    assert (result["laneRank"], result["laneHost"]) == ("37", "node04")
    assert result["marks"] == 1
    top, bottom, lane_width = result["laneBox"]
    assert lane_width > 400
    assert top <= result["markCenterY"] <= bottom, "the initiating event is not drawn on the initiator's lane"
    assert result["lanes"] >= 64  # one lane per rank (plus host lanes)
    assert result["scripts"] == 0  # the evidence line's <script> stayed text


@needs_chromium
def test_report_without_signals_still_marks_initiator(browser: Browser, tmp_path: Path) -> None:
    incident, _ = _incident_64(init_rank=5)
    url = _write(tmp_path, "evidence-only.html", render_incident_html(incident, None, title="evidence only"))

    result = browser.render(url, LAYOUT_PROBE)

    assert result["problems"] == []
    assert result["title"] == "evidence only"
    assert result["laneRank"] == "5"
    top, bottom, _ = result["laneBox"]
    assert top <= result["markCenterY"] <= bottom


@needs_chromium
def test_probe_reports_console_errors(browser: Browser, tmp_path: Path) -> None:
    """The clean-page assertions above mean something: a page with an error is caught."""
    url = _write(
        tmp_path, "broken.html",
        "<!DOCTYPE html><html><head><title>broken</title></head><body>"
        "<script>console.error('boom'); undefinedFunction();</script></body></html>",
    )

    result = browser.render(url, LAYOUT_PROBE)

    assert any("boom" in p for p in result["problems"])
    assert any("undefinedFunction" in p for p in result["problems"])
    assert not result["lane"]


@needs_chromium
def test_demo_incident_from_simulated_logs(browser: Browser, tmp_path: Path) -> None:
    """The demo scenario end to end: simulate, diagnose, render; rank 37's lane carries the initiator.

    With ROOTRANK_WRITE_SCREENSHOT=1 the full-page screenshot is written to docs/img/incident.png.
    """
    from correlator.offline.diagnose import Diagnoser
    from correlator.tooling.simulate import logs_dir, simulate_demo

    truth = simulate_demo(tmp_path / "sim")
    incidents, signals = Diagnoser().diagnose([str(logs_dir(tmp_path / "sim", truth))])
    assert incidents, "the demo scenario produced no incident"
    url = _write(tmp_path, "demo.html", render_incident_html(incidents[0], signals))
    write_png = os.environ.get("ROOTRANK_WRITE_SCREENSHOT", "") not in ("", "0")

    result = browser.render(url, LAYOUT_PROBE, screenshot=write_png)

    assert result["problems"] == []
    assert incidents[0].class_ == "gpu_hardware_error"
    assert result["laneRank"] == "37"
    top, bottom, _ = result["laneBox"]
    assert top <= result["markCenterY"] <= bottom
    if write_png:
        out = REPO / "docs" / "img" / "incident.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(result["png"])
        assert out.stat().st_size > 10_000


def test_page_is_self_contained_and_escapes_log_text() -> None:
    incident, signals = _incident_64()
    page = render_incident_html(incident, signals)

    assert "<script" not in page.replace("&lt;script", "")  # the evidence's <script> is text
    assert "&lt;script&gt;console.error(&#x27;injected&#x27;)&lt;/script&gt;" in page
    assert not re.search(r"<[a-zA-Z][^<>]*\b(?:src|href)\s*=", page), "the report must load nothing"
    assert "default-src 'none'" in page  # and the browser is told so


def test_huge_world_keeps_one_lane_per_host_plus_the_initiator() -> None:
    world, hosts = 2048, 256
    per = world // hosts
    t0 = datetime(2026, 11, 30, 18, 0, tzinfo=UTC)
    signals = [
        Signal(job_id="j", rule_id="nccl-watchdog", class_="nccl_timeout", rank=r, host=f"h{r // per:03d}",
               ts=t0 + timedelta(seconds=600 + (r % 5) * 0.01), order=r, file=f"h{r // per:03d}.log",
               line=f"[Rank {r}] Watchdog caught collective operation timeout")
        for r in range(world) if r != 1500
    ]
    signals.append(Signal(job_id="j", rule_id="cuda-oom", class_="cuda_oom", rank=1500, host="h187", ts=t0, order=0,
                          file="h187.log", line="torch.OutOfMemoryError: CUDA out of memory."))
    incident = Incident(
        incident_id="x", job_id="j", class_="cuda_oom", title="CUDA out of memory on rank 1500", severity="critical",
        confidence=0.95, confidence_reason="first", world_size=world,
        initiator=Initiator(rank=1500, host="h187", ts=t0.isoformat(), rule="cuda-oom",
                            line="torch.OutOfMemoryError: CUDA out of memory."),
    )
    page = render_incident_html(incident, signals)

    lanes = re.findall(r'<g class="lane[^"]*" data-host="([^"]+)" data-rank="([^"]+)"', page)
    assert len(lanes) == hosts + 1  # a shared lane per host, and the initiator's own
    assert re.search(r'<g class="lane initiator-lane" data-host="h187" data-rank="1500" id="initiator-lane"', page)
    assert page.count('data-role="initiator"') == 1


# Runs in the page after load: the side panel's lines, the notes over the picture, the hosts' labels.
PANEL_PROBE = """
(() => {
  const aside = document.querySelector('aside').getBoundingClientRect();
  const items = [...document.querySelectorAll('aside ol.fix li, aside ol.verify li')].map(li => {
    const r = li.getBoundingClientRect();
    return {left: r.left, right: r.right, scroll: li.scrollWidth, client: li.clientWidth};
  });
  const notes = [...document.querySelectorAll('.picture-note')].map(n => {
    const r = n.getBoundingClientRect();
    return {text: n.textContent, shown: r.width > 0 && r.height > 0};
  });
  const svg = document.getElementById('swimlanes');
  const lane = document.getElementById('initiator-lane');
  return JSON.stringify({
    aside: [aside.left, aside.right], items, notes,
    hosts: [...document.querySelectorAll('text.host-label')].map(t => t.textContent),
    initiatorLane: lane ? [lane.getAttribute('data-host'), lane.getAttribute('data-rank')] : null,
    pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
    svgBottom: svg ? svg.getBoundingClientRect().bottom : 0,
  });
})()
"""


@needs_chromium
def test_a_long_fix_line_wraps_inside_its_panel(browser: Browser, tmp_path: Path) -> None:
    """A fix step with a long unbroken command stays inside the side panel (switched off, the CSS's
    overflow-wrap: the line runs out of the panel and the page scrolls sideways)."""
    incident, signals = _incident_64()
    command = "nvidia-smi --query-gpu=" + ",".join(["clocks_throttle_reasons.hw_thermal_slowdown"] * 12)
    incident = incident.model_copy(update={"fix": ["Drain the node.", command], "verify": [command]})
    url = _write(tmp_path, "long-fix.html", render_incident_html(incident, signals))

    result = browser.render(url, PANEL_PROBE)

    assert result["problems"] == []
    left, right = result["aside"]
    assert len(result["items"]) == 3
    for item in result["items"]:
        assert left - 1 <= item["left"] and item["right"] <= right + 1, (item, result["aside"])
        assert item["scroll"] <= item["client"] + 1, item
    assert result["pageWidth"] <= result["viewport"] + 1


def _picture_of(tmp_path: Path, name: str, files: list[Path]) -> tuple[str, Incident]:
    from correlator.offline.diagnose import Diagnoser

    incidents, signals = Diagnoser().diagnose([str(f) for f in files])
    assert incidents, f"{name}: no incident"
    return _write(tmp_path, f"{name}.html", render_incident_html(incidents[0], signals)), incidents[0]


def _keep_screenshot(result: dict[str, Any], name: str) -> None:
    out = REPO / "docs" / "img" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(result["png"])
    assert out.stat().st_size > 10_000


@needs_chromium
def test_an_oom_job_whose_files_do_not_name_their_hosts(browser: Browser, tmp_path: Path) -> None:
    """A 16-rank OOM on 2 hosts, each host's log copied to a file whose name says nothing (a.log, b.log): the
    ranks' OOM and watchdog lines name no host, their NCCL lines do. No rank under "unknown host".

    With ROOTRANK_WRITE_SCREENSHOT=1 the picture is written to docs/img/incident-oom.png."""
    from correlator.tooling.simulate import logs_dir, simulate

    truth = simulate("cuda_oom", world_size=16, hosts=2, seed=3, out=tmp_path / "sim",
                     start=datetime(2026, 12, 4, 21, 0, tzinfo=UTC))
    flat = tmp_path / "flat"
    flat.mkdir()
    files = []
    for name, host_log in zip("ab", sorted(logs_dir(tmp_path / "sim", truth).glob("*/train.log")), strict=False):
        files.append(flat / f"{name}.log")
        files[-1].write_bytes(host_log.read_bytes())
    url, incident = _picture_of(tmp_path, "oom", files)
    write_png = os.environ.get("ROOTRANK_WRITE_SCREENSHOT", "") not in ("", "0")

    result = browser.render(url, PANEL_PROBE, screenshot=write_png)

    assert result["problems"] == []
    assert incident.class_ == "cuda_oom" and incident.initiator.rank == truth.initiator.rank
    assert not any("unknown host" in label for label in result["hosts"]), result["hosts"]
    assert result["initiatorLane"] == [truth.initiator.host, str(truth.initiator.rank)]
    if write_png:
        _keep_screenshot(result, "incident-oom.png")


@needs_chromium
def test_a_skewed_job_says_whose_clock_was_corrected(browser: Browser, tmp_path: Path) -> None:
    """Hosts' clocks up to 4 s apart: the picture is drawn on corrected time and says so over the picture.

    With ROOTRANK_WRITE_SCREENSHOT=1 the picture is written to docs/img/incident-skew.png."""
    from correlator.tooling.simulate import logs_dir, simulate

    truth = simulate("gpu_hardware_error", world_size=16, hosts=4, seed=1, skew_max_s=4.0, out=tmp_path / "sim",
                     start=datetime(2026, 12, 4, 21, 0, tzinfo=UTC))
    url, incident = _picture_of(tmp_path, "skew", [logs_dir(tmp_path / "sim", truth)])
    write_png = os.environ.get("ROOTRANK_WRITE_SCREENSHOT", "") not in ("", "0")

    result = browser.render(url, PANEL_PROBE, screenshot=write_png)

    assert result["problems"] == []
    assert incident.initiator.rank == truth.initiator.rank
    [note] = result["notes"]
    assert note["shown"] and "shown corrected" in note["text"]
    skewed = max(truth.skew_s, key=lambda h: abs(truth.skew_s[h]))
    assert f"{skewed}'s clock ran" in note["text"], (note, truth.skew_s)
    if write_png:
        _keep_screenshot(result, "incident-skew.png")
