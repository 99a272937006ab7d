"""/jobs/{job_id}/webhooks logic: bearer token for writes, every input validated, nothing secret echoed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from correlator.sinks.webhooks.api import MAX_BODY_BYTES, ApiResponse, RegistrationAPI
from correlator.sinks.webhooks.receivers.generic_json import generate_secret
from correlator.sinks.webhooks.registry import MAX_REGISTRATIONS_PER_JOB, Registry

TOKEN = "t0ken-for-writes"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def call(api: RegistrationAPI, method: str, job_id: str = "job-a", headers: dict[str, str] | None = None,
         query: dict[str, str] | None = None, body: Any = None) -> ApiResponse:
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    return asyncio.run(api.handle(method, job_id, headers if headers is not None else AUTH, query or {}, raw))


def test_writes_need_the_bearer_token() -> None:
    api = RegistrationAPI(Registry(), TOKEN)
    body = {"url": "https://hooks.example.com/x"}
    assert call(api, "PUT", headers={"Content-Type": "application/json"}, body=body).status == 401
    wrong = call(api, "PUT", headers={**AUTH, "Authorization": "Bearer nope"}, body=body)
    assert wrong.status == 401 and wrong.headers["WWW-Authenticate"].startswith("Bearer")
    assert call(api, "PUT", headers={**AUTH, "Authorization": f"Basic {TOKEN}"}, body=body).status == 401
    assert call(api, "DELETE", headers={}, query={"all": "true"}).status == 401
    assert call(api, "PUT", body=body).status == 201
    assert call(api, "PUT", body=body).status == 200  # same target: replaced, not duplicated
    assert len(api.registry.for_job("job-a")) == 1


def test_without_a_configured_token_writes_are_refused() -> None:
    api = RegistrationAPI(Registry(), None)
    response = call(api, "PUT", body={"url": "https://hooks.example.com/x"})
    assert response.status == 403 and "api_token" in response.body["error"]
    assert call(api, "GET").status == 200


def test_get_redacts_targets_unless_the_token_is_presented() -> None:
    api = RegistrationAPI(Registry(), TOKEN)
    secret = generate_secret()
    slack = "https://hooks.slack.com/services/T1/B1/SlackPathSecret"
    assert call(api, "PUT", body={"url": "https://hooks.example.com/in", "secret": secret}).status == 201
    assert call(api, "PUT", body={"kind": "slack", "url": slack}).status == 201
    assert call(api, "PUT", body={"kind": "pagerduty", "routing_key": "R0uting"}).status == 201

    anonymous = call(api, "GET", headers={})
    assert anonymous.status == 200
    text = json.dumps(anonymous.body)
    assert "SlackPathSecret" not in text and secret not in text and "R0uting" not in text
    assert [w["target"].split("/…")[0] for w in anonymous.body["webhooks"]] == [
        "https://hooks.example.com", "https://hooks.slack.com", "https://events.pagerduty.com"
    ]
    assert [w["signed"] for w in anonymous.body["webhooks"]] == [True, False, False]

    owner = call(api, "GET")
    owner_text = json.dumps(owner.body)
    assert slack in owner_text
    assert secret not in owner_text and "R0uting" not in owner_text  # secrets are write-only


def test_delete_one_or_all() -> None:
    api = RegistrationAPI(Registry(), TOKEN)
    ids = [call(api, "PUT", body={"url": f"https://h.example.com/{i}"}).body["webhook"]["id"] for i in range(3)]
    assert call(api, "DELETE", query={"id": ids[1]}).status == 200
    assert [w["id"] for w in call(api, "GET").body["webhooks"]] == [ids[0], ids[2]]
    assert call(api, "DELETE", query={"id": ids[1]}).status == 404
    assert call(api, "DELETE", query={"id": "../../etc"}).status == 400
    assert call(api, "DELETE").status == 400  # neither id nor all=true: refuse to guess
    assert call(api, "DELETE", query={"all": "true"}).body == {"job_id": "job-a", "removed": 2}
    assert call(api, "GET").body["webhooks"] == []


@pytest.mark.parametrize(
    ("job_id", "headers", "body", "status", "problem"),
    [
        ("../other", AUTH, {"url": "https://h.example.com"}, 400, "job_id"),
        ("a" * 201, AUTH, {"url": "https://h.example.com"}, 400, "job_id"),
        ("job a", AUTH, {"url": "https://h.example.com"}, 400, "job_id"),
        ("job-a", {**AUTH, "Content-Type": "text/plain"}, {"url": "https://h.example.com"}, 415, "Content-Type"),
        ("job-a", AUTH, b"{not json", 400, "not valid JSON"),
        ("job-a", AUTH, b"", 400, "body is required"),
        ("job-a", AUTH, b"x" * (MAX_BODY_BYTES + 1), 413, "larger"),
        ("job-a", AUTH, ["https://h.example.com"], 422, "JSON object"),
        ("job-a", AUTH, {"url": "javascript:alert(1)"}, 422, "scheme"),
        ("job-a", AUTH, {"url": "https://h.example.com/\r\nX-Injected: 1"}, 422, "control characters"),
        ("job-a", AUTH, {"url": "https://"}, 422, "no host"),
        ("job-a", AUTH, {"url": "https://h.example.com", "secret": "plaintext-secret"}, 422, "whsec_"),
        ("job-a", AUTH, {"kind": "slack", "url": "https://h.example.com", "secret": generate_secret()}, 422, "secret"),
        ("job-a", AUTH, {"kind": "teams", "url": "https://h.example.com"}, 422, "unknown kind"),
        ("job-a", AUTH, {"url": "https://h.example.com", "extra": 1}, 422, "extra"),
        ("job-a", AUTH, {"url": "https://h.example.com", "min_severity": "urgent"}, 422, "min_severity"),
        ("job-a", AUTH, {"url": "https://h.example.com", "classes": ["a b"]}, 422, "classes"),
        ("job-a", AUTH, {"url": "https://h.example.com/" + "x" * 3000}, 422, "longer"),
    ],
)
def test_inputs_are_validated(job_id: str, headers: dict[str, str], body: Any, status: int, problem: str) -> None:
    api = RegistrationAPI(Registry(), TOKEN)
    response = call(api, "PUT", job_id=job_id, headers=headers, body=body)
    assert response.status == status, response.body
    assert problem.lower() in response.body["error"].lower()
    assert api.registry.for_job("job-a") == []
    if isinstance(body, dict) and "secret" in body:
        assert body["secret"] not in response.body["error"]


def test_registrations_per_job_are_capped() -> None:
    api = RegistrationAPI(Registry(), TOKEN)
    for i in range(MAX_REGISTRATIONS_PER_JOB):
        assert call(api, "PUT", body={"url": f"https://h.example.com/{i}"}).status == 201
    refused = call(api, "PUT", body={"url": "https://h.example.com/one-more"})
    assert refused.status == 409
    assert call(api, "PUT", body={"url": "https://h.example.com/0"}).status == 200  # replacing still works


def test_methods_other_than_get_put_delete_are_refused() -> None:
    assert call(RegistrationAPI(Registry(), TOKEN), "POST", body={}).status == 405
