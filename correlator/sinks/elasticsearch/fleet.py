"""Repeat offenders: hosts (and GPUs) that keep initiating hardware-like incidents across jobs.

One job broken by a host says little (the job may have been unlucky); the same host initiating
GPU-hardware, fabric, ECC or shm incidents in several jobs is a machine to drain. The numbers come
from the incidents index (correlator.sinks.elasticsearch.search.repeat_offenders: one aggregation, the same fields the
Kibana dashboard uses: rootrank.initiator.host / .gpu, rootrank.class, rootrank.hardware_like).

The threshold counts distinct *jobs*, not incidents: a job that restarts three times on one bad node
makes three incidents but is still one job's testimony.

The drain-list webhook is deliberately simple: `rootrank hosts --notify-url URL` (run from cron or a
CronJob) POSTs one JSON document with the hosts that crossed the threshold since the last run; a small
state file remembers who was already reported, so each crossing is announced once.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from correlator.sinks.elasticsearch.search import Offender, repeat_offenders


def find_offenders(client: Any, alias: str, *, since: datetime | None, min_jobs: int,
                   classes: Sequence[str] | None = None) -> list[Offender]:
    """Hosts that initiated hardware-like incidents in at least `min_jobs` distinct jobs, most jobs first."""
    # A host with N jobs has at least N incidents: the server-side min_doc_count prefilter is safe.
    found = repeat_offenders(client, alias, since=since, min_incidents=min_jobs, classes=classes)
    out = [o for o in found if o.jobs >= min_jobs]
    return sorted(out, key=lambda o: (-o.jobs, -o.count, o.host))


def format_offenders(offenders: Sequence[Offender]) -> str:
    rows = [("HOST", "JOBS", "INCIDENTS", "GPUS", "CLASSES", "RECENT INCIDENTS")]
    for o in offenders:
        gpus = ",".join(f"{g}({n})" for g, n in sorted(o.gpus.items())) or "-"
        classes = ",".join(f"{c}({n})" for c, n in sorted(o.classes.items()))
        rows.append((o.host, str(o.jobs), str(o.count), gpus, classes, ",".join(o.incident_ids[:5])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows)


def no_offenders(min_jobs: int, since: datetime | None, since_text: str | None = None) -> str:
    """What `rootrank hosts` says when no host crossed the threshold (rather than nothing at all)."""
    if since is None:
        return f"no host failed in {min_jobs} or more jobs (all incidents searched)"
    when = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ago = f" ({since_text} ago)" if since_text and since_text[:1].isdigit() and since_text[-1:].isalpha() else ""
    return f"no host failed in {min_jobs} or more jobs since {when}{ago}"


def offender_dict(o: Offender) -> dict[str, Any]:
    return asdict(o)


def _reported(state_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def new_crossings(offenders: Sequence[Offender], state_path: Path) -> list[Offender]:
    """Offenders whose host was not reported yet (see `remember_reported`)."""
    reported = _reported(state_path)
    return [o for o in offenders if o.host not in reported]


def remember_reported(offenders: Sequence[Offender], state_path: Path) -> None:
    """Record hosts as reported, only once the webhook took them (so a failed POST is retried next run)."""
    reported = _reported(state_path)
    now = datetime.now(UTC).isoformat()
    reported.update({o.host: {"jobs": o.jobs, "incidents": o.count, "reported_at": now} for o in offenders})
    state_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(reported, indent=1, sort_keys=True))
    tmp.replace(state_path)


def post_drain_list(url: str, offenders: Sequence[Offender], *, min_jobs: int, token: str | None = None,
                    timeout_s: float = 10.0) -> int:
    """POST {"event": "rootrank.hosts.repeat_offenders", "hosts": [...]} to `url`; returns the HTTP status."""
    body = json.dumps({
        "event": "rootrank.hosts.repeat_offenders",
        "threshold_jobs": min_jobs,
        "hosts": [offender_dict(o) for o in offenders],
    }).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "rootrank-hosts"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    host = urllib.parse.urlsplit(url).hostname or ""
    # Loopback never goes through an HTTP proxy from the environment.
    opener = (urllib.request.build_opener(urllib.request.ProxyHandler({})) if host in ("127.0.0.1", "localhost", "::1")
              else urllib.request.build_opener())
    with opener.open(request, timeout=timeout_s) as resp:
        return int(resp.status)
