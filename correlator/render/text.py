"""Incidents for people, in the terminal (rich)."""

from __future__ import annotations

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


def print_incidents(incidents: Sequence[Incident], console: Console | None = None) -> None:
    console = console or Console(emoji=False)
    if not incidents:
        console.print("[green]No incident:[/] no failure signature in these logs.")
        return
    for n, incident in enumerate(incidents):
        header = Text()
        header.append("RECOVERED " if incident.recovered else "PRIMARY " if n == 0 else "ALSO ", style="bold")
        header.append(f"{incident.class_}", style="bold red")
        header.append(f"  {incident.title}")
        body = Table.grid(padding=(0, 1))
        body.add_column(style="bold", no_wrap=True)
        body.add_column()
        body.add_row("Initiator", _who(incident))
        if incident.initiator.ts:
            body.add_row("First seen", incident.initiator.ts)
        body.add_row("Line", Text(incident.initiator.line[:400]))
        body.add_row("Confidence", f"{incident.confidence:.2f} — {incident.confidence_reason}")
        if incident.collateral:
            rows = []
            for c in incident.collateral[:8]:
                ranks = _ranges(c.ranks)
                rows.append(f"{c.class_}: {c.count} line(s)" + (f" on {len(c.ranks)} rank(s) [{ranks}]" if c.ranks else ""))
            body.add_row("Collateral", "\n".join(rows))
        if incident.evidence:
            lines = []
            for e in incident.evidence[:5]:
                who = f"rank {e.rank}" if e.rank is not None else (e.host or "-")
                lines.append(f"[{who}] {e.line[:160]}")
            body.add_row("Evidence", Text("\n".join(lines)))
        if incident.fix:
            body.add_row("Fix", "\n".join(f"- {f}" for f in incident.fix))
        if incident.verify:
            body.add_row("Verify", "\n".join(f"- {v}" for v in incident.verify))
        body.add_row("Incident", f"{incident.incident_id}  job {incident.job_id}  severity {incident.severity}")
        console.print(Panel(body, title=header, title_align="left", border_style="red" if n == 0 else "yellow"))


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
