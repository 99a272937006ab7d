"""Route matching on job id glob, labels, class and severity."""

from __future__ import annotations

import pytest

from correlator.sinks.webhooks.routes import RouteTable
from tests.unit.webhooks.incidents import make_incident

RECEIVERS = {
    "ml-slack": {"kind": "slack", "url": "https://hooks.slack.com/services/T/B/ml"},
    "oncall": {"kind": "pagerduty", "routing_key": "abc"},
    "audit": {"kind": "generic_json", "url": "https://audit.example.com/in"},
}


def names(table: RouteTable, **incident: object) -> list[str]:
    return [r.name for r in table.receivers_for(make_incident(**incident))]  # type: ignore[arg-type]


def test_conditions_all_must_hold_and_globs_match() -> None:
    table = RouteTable.from_config(
        [
            {
                "match": {"job": ["llm-*", "vlm-*"], "labels": {"team": "ml-*"}, "class": ["cuda_*"], "min_severity": "high"},
                "receivers": ["oncall", "ml-slack"],
            }
        ],
        RECEIVERS,
    )
    assert names(table, job_id="llm-pretrain-7", labels={"team": "ml-infra"}) == ["oncall", "ml-slack"]
    assert names(table, job_id="vlm-1", labels={"team": "ml-x"}) == ["oncall", "ml-slack"]
    assert names(table, job_id="cv-1", labels={"team": "ml-infra"}) == []  # job glob
    assert names(table, labels={"team": "data"}) == []  # label glob
    assert names(table, labels={}) == []  # missing label
    assert names(table, labels={"team": "ml-infra"}, class_="nccl_timeout") == []  # class glob
    assert names(table, labels={"team": "ml-infra"}, severity="medium") == []  # below min_severity


def test_first_match_wins_unless_continue() -> None:
    routes = [
        {"match": {"severity": ["critical"]}, "receivers": "oncall", "continue": True},
        {"match": {"job": "llm-*"}, "receivers": ["ml-slack"]},
        {"receivers": ["audit"]},  # catch-all, reached only when nothing above stopped
    ]
    table = RouteTable.from_config(routes, RECEIVERS)
    assert names(table, job_id="llm-a", severity="critical") == ["oncall", "ml-slack"]
    assert names(table, job_id="llm-a", severity="low") == ["ml-slack"]
    assert names(table, job_id="cv-a", severity="critical") == ["oncall", "audit"]
    assert names(table, job_id="cv-a", severity="low") == ["audit"]


def test_a_receiver_listed_by_two_routes_is_notified_once() -> None:
    routes = [{"receivers": ["audit"], "continue": True}, {"receivers": ["audit", "oncall"]}]
    assert names(RouteTable.from_config(routes, RECEIVERS)) == ["audit", "oncall"]


@pytest.mark.parametrize(
    ("routes", "receivers", "problem"),
    [
        ([{"receivers": ["nope"]}], RECEIVERS, "unknown receiver 'nope'"),
        ([{"receivers": []}], RECEIVERS, "routes[0].receivers"),
        ([{"match": {"jobs": "x"}, "receivers": ["audit"]}], RECEIVERS, "routes[0].match.jobs: Extra inputs"),
        ([{"match": {"min_severity": "urgent"}, "receivers": ["audit"]}], RECEIVERS, "routes[0].match.min_severity"),
        ([], {"x": {"kind": "teams", "url": "https://x"}}, "unknown kind 'teams'"),
        ([], {"x": {"kind": "slack", "url": "ftp://x/y"}}, "url scheme must be http or https"),
        ([], {"x": {"kind": "pagerduty"}}, "routing_key: Field required"),
    ],
)
def test_config_errors_say_where_and_what(routes: list[dict[str, object]], receivers: dict[str, dict[str, object]],
                                          problem: str) -> None:
    with pytest.raises(ValueError) as err:
        RouteTable.from_config(routes, receivers)  # type: ignore[arg-type]
    assert problem in str(err.value)
