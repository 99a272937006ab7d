"""The incident picture says what it shows (issue 31): hosts known from other lines, logs without times laid
out in line order, a note when the skew correction moved lines, long fix lines wrapped; and a page that
says so when there is no incident. Layout in a real browser: tests/integration/test_html_report_chromium.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from correlator import cli
from correlator.diagnosis.models import Incident, Initiator, Signal
from correlator.render.html import render_incident_html
from tests.integration.test_html_report_chromium import _incident_64

T0 = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def _oom_incident(ts: str | None = T0.isoformat(), host: str | None = None) -> Incident:
    return Incident(
        incident_id="i", job_id="j", class_="cuda_oom", title="CUDA out of memory on rank 2", severity="critical",
        confidence=0.9, confidence_reason="first", world_size=8,
        initiator=Initiator(rank=2, host=host, ts=ts, rule="cuda-oom", line=OOM),
        fix=["Lower the micro-batch size."], verify=["It runs."],
    )


def _lanes(page: str) -> set[tuple[str, str]]:
    return set(re.findall(r'<g class="lane[^"]*" data-host="([^"]*)" data-rank="([^"]+)"', page))


def _notes(page: str) -> list[str]:
    return [n.replace("&#x27;", "'") for n in re.findall(r'<p class="picture-note">([^<]*)</p>', page)]


def test_ranks_go_under_the_host_other_lines_name() -> None:
    """Rank 2's OOM line names no host, but its NCCL init line does; rank 6's watchdog line neither, but its
    file's other lines all name node01. Switched off: both under "unknown host"."""
    signals = [
        Signal(job_id="j", rule_id="nccl-init", kind="fact", host="node00", pid=11, file="a.log", order=0, ts=T0,
               fields={"comm_rank": 2}, line="node00:11:11 [2] NCCL INFO comm 0x1 rank 2 nranks 8"),
        Signal(job_id="j", rule_id="cuda-oom", class_="cuda_oom", rank=2, file="a.log", order=1,
               ts=T0 + timedelta(seconds=1), line=OOM),
        Signal(job_id="j", rule_id="nccl-init", kind="fact", host="node01", pid=15, file="b.log", order=0, ts=T0,
               fields={"comm_rank": 5}, line="node01:15:15 [1] NCCL INFO comm 0x1 rank 5 nranks 8"),
        Signal(job_id="j", rule_id="nccl-watchdog", class_="nccl_timeout", role="collateral", rank=6, file="b.log",
               order=1, ts=T0 + timedelta(seconds=30), line="[Rank 6] Watchdog caught collective operation timeout"),
    ]
    page = render_incident_html(_oom_incident(), signals)
    assert "unknown host" not in page
    assert {("node00", "2"), ("node01", "6")} <= _lanes(page)
    assert 'data-host="node00" data-rank="2" id="initiator-lane"' in page


def test_a_job_whose_times_were_not_parsed_is_laid_out_in_line_order() -> None:
    """Switched off, every event sits on one instant (one x) and the axis shows seconds."""
    signals = [
        Signal(job_id="j", rule_id="cuda-oom", class_="cuda_oom", rank=2, host="node00", file="a.log", order=3,
               line=OOM),
        *(Signal(job_id="j", rule_id="nccl-watchdog", class_="nccl_timeout", role="collateral", rank=r,
                 host=f"node0{r // 4}", file="a.log", order=10 + r, line=f"[Rank {r}] Watchdog caught collective timeout")
          for r in range(8) if r != 2),
    ]
    page = render_incident_html(_oom_incident(ts=None, host="node00"), signals)
    xs = {float(x) for x in re.findall(r'<circle class="event [^"]*"[^>]* cx="([\d.]+)"', page)}
    assert len(xs) >= 7, xs  # one place per line, not one instant
    initiator_x = float(re.search(r'data-role="initiator"[^>]*><circle cx="([\d.]+)"', page).group(1))  # type: ignore[union-attr]
    assert initiator_x < min(xs)  # the OOM line came first
    assert "line order (no time could be read from these lines)" in page
    assert any("could not be read" in note and "order they were logged" in note for note in _notes(page))
    assert ">line 1<" in page and "skew-corrected (UTC)" not in page


def test_a_note_says_when_the_skew_correction_moved_lines() -> None:
    """The 64-rank job's hosts run up to 2.4 s apart: the picture says whose clock and by how much.
    Switched off, the marks move without a word."""
    incident, signals = _incident_64()
    [note] = _notes(render_incident_html(incident, signals))
    assert "node07's clock ran 2.4 s ahead" in note and "node00's clock ran 2.4 s behind" in note
    assert note.count("shown corrected") == 1 and "another order than their logged times" in note
    # One skewed host: the sentence of the issue.
    one = [s.model_copy(update={"ts": s.ts + timedelta(seconds=0.8)}) if s.host == "node04" and s.ts else s
           for s in _unskewed(signals)]
    [note] = _notes(render_incident_html(incident, one))
    assert note.startswith("node04's clock ran 0.8 s ahead; shown corrected.")  # (and: some lines reordered)
    # No skew, no note.
    assert _notes(render_incident_html(incident, _unskewed(signals))) == []


def _unskewed(signals: list[Signal]) -> list[Signal]:
    """The 64-rank job's lines on true time: no host skew, and every host's launcher line at one moment."""
    skew = {f"node{h:02d}": ((h * 7) % 5 - 2) * 1.1 for h in range(8)}
    launcher = min(s.ts for s in signals if s.class_ == "launcher_teardown" and s.ts)
    out = []
    for s in signals:
        if s.ts is None:
            out.append(s)
        elif s.class_ == "launcher_teardown":
            out.append(s.model_copy(update={"ts": launcher - timedelta(seconds=skew["node00"])}))
        else:
            out.append(s.model_copy(update={"ts": s.ts - timedelta(seconds=skew[s.host or ""])}))
    return out


def test_long_fix_lines_wrap_inside_their_panel() -> None:
    incident, signals = _incident_64()
    long = incident.model_copy(update={"fix": ["nvidia-smi --query-gpu=" + ",".join(["clocks_throttle_reasons.active"] * 20)]})
    page = render_incident_html(long, signals)
    assert "aside li, aside dd, aside td, .reason { overflow-wrap:anywhere; }" in page
    assert "aside { min-width:0; }" in page


@pytest.mark.parametrize(("content", "verdict"), [
    ("[rank0]: step 10 loss 2.1\n", "No incident: no failure signature in these logs."),
    ("", "The input has no lines: nothing to diagnose."),
])
def test_diagnose_html_with_no_incident_writes_a_page_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, verdict: str,
) -> None:
    """Switched off, no file is written (the reader of a CI artifact finds nothing)."""
    log = tmp_path / "clean.log"
    log.write_text(content)
    out = tmp_path / "picture.html"
    assert cli.main(["diagnose", "-j", "1", "--format", "html", "-o", str(out), str(log)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'id="no-incident"' in page and verdict in page
    assert "default-src 'none'" in page and "<script" not in page
