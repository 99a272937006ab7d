"""The JSON contract of `rootrank diagnose --format json`, as bytes: the one writer of it, so that
`diagnose` and `rootrank serve`'s `POST /api/diagnose` give the same bytes for the same incidents."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from correlator.diagnosis.models import Incident


def report_payload(incidents: Sequence[Incident]) -> dict[str, list[dict[str, object]]]:
    """`{"incidents": [...], "recovered": [...]}`, primary first: failures the job survived are warnings,
    never "the" incident, so they have their own list."""
    return {"incidents": [i.to_json_dict() for i in incidents if not i.recovered],
            "recovered": [i.to_json_dict() for i in incidents if i.recovered]}


def report_json(incidents: Sequence[Incident]) -> bytes:
    """The payload, indented by two spaces, ending with a newline (what `diagnose --format json` prints)."""
    return orjson.dumps(report_payload(incidents), option=orjson.OPT_INDENT_2) + b"\n"
