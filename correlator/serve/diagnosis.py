"""One upload diagnosed: the engine, the JSON and the pictures `rootrank diagnose` makes, nothing of its own.

Runs in a worker thread (`Diagnoser` with one scan process: the server has threads, so it never forks).
The pictures are rendered here, while the uploaded files still exist (their evidence lines are located in
them); the caller removes the folder right after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from correlator.diagnosis.models import Incident, Signal
from correlator.offline.diagnose import Diagnoser, DiagnoseStats, InputError
from correlator.offline.locate import evidence_signals, line_numbers
from correlator.render.html import OtherIncident, render_incident_html
from correlator.render.json_report import report_json
from correlator.serve.uploads import Upload, UploadError

MAX_PAGES = 16  # pictures kept per upload: the primary incident and the first others


@dataclass
class Outcome:
    body: bytes  # exactly what `rootrank diagnose --format json` prints for the same input
    incidents: list[Incident]
    pages: dict[str, str] = field(default_factory=dict)  # incident id -> its picture (HTML)
    notes: list[str] = field(default_factory=list)  # files skipped and why, as diagnose prints on stderr
    job_id: str = ""


def incident_path(incident_id: str) -> str:
    return f"/incident/{incident_id}"


def diagnose_upload(diagnoser: Diagnoser, upload: Upload) -> Outcome:
    """The upload's incidents, as `rootrank diagnose` finds them for the same files (same order, same job)."""
    stats = DiagnoseStats()
    paths = upload.paths()
    job_id = upload.job_id()
    try:
        incidents, signals = diagnoser.diagnose(paths, job_id, stats=stats)
    except InputError as exc:
        raise UploadError(400, upload.display(str(exc))) from None
    notes = upload.notes + [upload.display(f"skipped: {s}") for s in stats.skipped]
    if stats.decode_errors:
        notes.append(f"skipped {stats.decode_errors} undecodable JSON line(s)")
    if not stats.files and stats.skipped:
        raise UploadError(400, "no input could be read: " + "; ".join(notes))
    if stats.bytes == 0:
        raise UploadError(400, f"nothing to diagnose: the input has no lines ({stats.files} file(s), 0 bytes)")
    outcome = Outcome(report_json(incidents), incidents, notes=notes, job_id=job_id)
    outcome.pages = _pictures(incidents[:MAX_PAGES], incidents, signals, paths, upload)
    return outcome


def _pictures(shown: list[Incident], incidents: list[Incident], signals: list[Signal], paths: list[str],
              upload: Upload) -> dict[str, str]:
    sources = {i.incident_id: evidence_signals(i, signals) for i in shown}
    where = line_numbers(paths, (s.order for found in sources.values() for s in found if s is not None))
    kept = {i.incident_id for i in shown}
    first_failure = next((i for i in incidents if not i.recovered), None)
    pages: dict[str, str] = {}
    for incident in shown:
        located = [where.get(s.order) if s is not None else None for s in sources[incident.incident_id]]
        others = [
            OtherIncident("survived" if o.recovered else "primary" if o is first_failure else "also failed", o,
                          incident_path(o.incident_id) if o.incident_id in kept else None)
            for o in incidents if o is not incident
        ]
        pages[incident.incident_id] = render_incident_html(
            incident, signals,
            evidence_where=[f"{upload.display(loc[0])}:{loc[1]}" if loc else None for loc in located],
            others=others,
        )
    return pages
