"""Incidents for people, in the terminal (rich): the one renderer of `diagnose` and `show`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from correlator.diagnosis.models import Incident


def _who(incident: Incident) -> str:
    i = incident.initiator
    parts: list[str] = []
    if i.rank is not None:
        parts.append(f"rank {i.rank}")
    if i.local_rank is not None:
        parts.append(f"local rank {i.local_rank}")
    if i.host:
        parts.append(f"host {i.host}")
    if i.gpu is not None:
        parts.append(f"GPU {i.gpu}")
    if i.pid is not None:
        parts.append(f"pid {i.pid}")
    return ", ".join(parts) or "not identified in these logs"


LINE_CHARS = 400
EVIDENCE_CHARS = 200
_XID = re.compile(r"\bXid\b(?:\s*\([^)]*\))?:\s*(\d+)")


def shorten(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word boundary with an ellipsis (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


def headline(incident: Incident) -> str:
    """What failed, where: the title the engine gave (the rule's own wording and who), with the Xid
    number when the initiating line carries one and the title does not."""
    title = incident.title
    xid = _XID.search(incident.initiator.line or "")
    if xid and "Xid" not in title:
        where = title.find(" on rank ")
        if where < 0:
            where = len(title)
        name = title[:where]
        # "GPU has fallen off the bus (kernel driver lost the device)" -> "GPU has fallen off the bus (Xid 79)"
        name = re.sub(r"\s*\([^)]*\)$", "", name)
        title = f"{name} (Xid {xid.group(1)}){title[where:]}"
    return title


def other_ranks(incident: Incident) -> int:
    """Ranks with collateral failures, the initiator's own rank not counted."""
    ranks = {r for c in incident.collateral for r in c.ranks}
    ranks.discard(incident.initiator.rank)
    return len(ranks)


def print_incidents(incidents: Sequence[Incident], console: Console | None = None, *,
                    detail: bool = False) -> None:
    """The incidents as panels, primary first. `detail` (rootrank show) adds revision, window, every
    evidence line and the references."""
    console = console or Console(emoji=False)
    if not incidents:
        console.print("[green]No incident:[/] no failure signature in these logs.")
        return
    for n, incident in enumerate(incidents):
        header = Text()
        header.append("RECOVERED " if incident.recovered else "PRIMARY " if n == 0 else "ALSO ", style="bold")
        header.append(f"{incident.class_}", style="bold red")
        header.append(f"  severity {incident.severity}")
        body = Table.grid(padding=(0, 1))
        body.add_column(style="bold", no_wrap=True)
        body.add_column()
        body.add_row("Failure", Text(headline(incident), style="bold"))
        body.add_row("Initiator", _who(incident))
        if incident.initiator.ts:
            body.add_row("First seen", incident.initiator.ts + (f"  (rule {incident.initiator.rule})" if detail else ""))
        body.add_row("Line", Text(shorten(incident.initiator.line, LINE_CHARS)))
        body.add_row("Confidence", f"{incident.confidence:.2f} — {incident.confidence_reason}")
        if detail and (incident.window_start or incident.window_end):
            body.add_row("Window", f"{incident.window_start or '?'} .. {incident.window_end or '?'}")
        if incident.collateral:
            rows = []
            shown = incident.collateral if detail else incident.collateral[:8]
            for c in shown:
                ranks = _ranges(c.ranks)
                where = f" on {_count(len(c.ranks), 'rank')} [{ranks}]" if c.ranks else ""
                rows.append(f"{c.class_}: {c.count} line(s){where}")
            others = other_ranks(incident)
            if others:
                rows.append(f"{_count(others, 'other rank')} in all")
            body.add_row("Collateral", Text("\n".join(rows)))
        if incident.evidence:
            lines = []
            for e in incident.evidence if detail else incident.evidence[:5]:
                who = f"rank {e.rank}" if e.rank is not None else (e.host or "-")
                rule = f"{e.rule}: " if detail and e.rule else ""
                lines.append(f"[{who}] {rule}{shorten(e.line, EVIDENCE_CHARS)}")
            body.add_row("Evidence", Text("\n".join(lines)))
        if incident.fix:
            body.add_row("Fix", Text("\n".join(f"- {f}" for f in incident.fix)))
        if incident.verify:
            body.add_row("Verify", Text("\n".join(f"- {v}" for v in incident.verify)))
        if detail and incident.references:
            body.add_row("References", Text("\n".join(incident.references)))
        if detail and incident.labels:
            body.add_row("Labels", ", ".join(f"{k}={v}" for k, v in sorted(incident.labels.items())))
        revision = f"  revision {incident.revision} ({incident.status})" if detail else ""
        body.add_row("Incident", f"{incident.incident_id}  job {incident.job_id}{revision}")
        console.print(Panel(body, title=header, title_align="left", border_style="red" if n == 0 else "yellow"))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _ranges(ranks: Sequence[int]) -> str:
    if not ranks:
        return ""
    out: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = r
    out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)
