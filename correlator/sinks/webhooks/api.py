"""`/jobs/{job_id}/webhooks`: the HTTP API's logic, independent of the web server that hosts it.

- GET    list the job's webhooks; targets redacted unless the caller presents the API token; with each,
         `delivery`: its queue on the worker that answers (state ok/retrying/dead, pending, last error,
         next retry), or null when that worker has not had to deliver to it.
- PUT    body = one registration ({"url", "kind", "secret", "routing_key", "min_severity", "classes"});
         adds it, or replaces the one with the same target. 201 created / 200 replaced.
- DELETE ?id=<registration id> removes one; ?all=true removes all of the job's webhooks.
Writes need `Authorization: Bearer <api_token>`; with no token configured, writes are refused.
Every input is validated (job id, size, content type, JSON shape, URL, secret format); error
messages name the field, never echo a value (it may be a secret).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from correlator.sinks.webhooks.dispatcher import registration_key
from correlator.sinks.webhooks.registry import (
    MAX_REGISTRATIONS_PER_JOB,
    Registration,
    RegistrationError,
    Registry,
    check_job_id,
)

log = logging.getLogger("rootrank.webhooks.api")

MAX_BODY_BYTES = 16 * 1024
REGISTRATION_ID_LENGTH = 12


@dataclass
class ApiResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _error(status: int, message: str, **headers: str) -> ApiResponse:
    return ApiResponse(status, {"error": message}, dict(headers))


StatusFn = Callable[[str], dict[str, Any] | None]


class RegistrationAPI:
    def __init__(self, registry: Registry, api_token: SecretStr | str | None, *, status_of: StatusFn | None = None) -> None:
        self.registry = registry
        self.status_of = status_of  # destination key -> its delivery status (the worker's queues)
        token = api_token.get_secret_value() if isinstance(api_token, SecretStr) else api_token
        self._token = token.encode("utf-8") if token else None

    def _bearer_ok(self, headers: Mapping[str, str]) -> bool:
        if self._token is None:
            return False
        value = headers.get("Authorization") or headers.get("authorization") or ""
        scheme, _, presented = value.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        return hmac.compare_digest(presented.strip().encode("utf-8"), self._token)

    def _write_denied(self, headers: Mapping[str, str]) -> ApiResponse | None:
        if self._token is None:
            return _error(403, "writes are disabled: no webhooks.api_token is configured")
        if not self._bearer_ok(headers):
            return _error(401, "a valid bearer token is required", **{"WWW-Authenticate": 'Bearer realm="rootrank"'})
        return None

    async def handle(
        self,
        method: str,
        job_id: str,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        body: bytes | None,
    ) -> ApiResponse:
        try:
            check_job_id(job_id)
        except ValueError as exc:
            return _error(400, str(exc))
        method = method.upper()
        if method == "GET":
            return self._get(job_id, headers)
        if method in ("PUT", "DELETE"):
            denied = self._write_denied(headers)
            if denied is not None:
                log.warning("%s /jobs/%s/webhooks refused: %s", method, job_id, denied.body["error"])
                return denied
            if method == "PUT":
                return self._put(job_id, headers, body)
            return self._delete(job_id, query)
        return _error(405, "allowed: GET, PUT, DELETE", Allow="GET, PUT, DELETE")

    def _get(self, job_id: str, headers: Mapping[str, str]) -> ApiResponse:
        show_urls = self._bearer_ok(headers)
        webhooks = []
        for registration in self.registry.for_job(job_id):
            view = registration.public_view(show_url=show_urls)
            if self.status_of is not None:
                view["delivery"] = self.status_of(registration_key(registration.id))
            webhooks.append(view)
        return ApiResponse(200, {"job_id": job_id, "webhooks": webhooks})

    def _put(self, job_id: str, headers: Mapping[str, str], body: bytes | None) -> ApiResponse:
        content_type = (headers.get("Content-Type") or headers.get("content-type") or "").split(";")[0].strip()
        if content_type != "application/json":
            return _error(415, "Content-Type must be application/json")
        if body is None or not body:
            return _error(400, "a JSON body is required")
        if len(body) > MAX_BODY_BYTES:
            return _error(413, f"body larger than {MAX_BODY_BYTES} bytes")
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return _error(400, "body is not valid JSON")
        try:
            registration = Registration.parse(raw)
            created = self.registry.upsert(job_id, registration)
        except RegistrationError as exc:
            status = 409 if "at most" in str(exc) else 422
            return _error(status, str(exc))
        view = registration.public_view(show_url=False)
        log.info("job %s: webhook %s %s (%s)", job_id, view["id"], "added" if created else "replaced", view["target"])
        return ApiResponse(201 if created else 200, {"job_id": job_id, "webhook": view, "created": created})

    def _delete(self, job_id: str, query: Mapping[str, str]) -> ApiResponse:
        registration_id = query.get("id")
        if registration_id is not None:
            if len(registration_id) != REGISTRATION_ID_LENGTH or not all(c in "0123456789abcdef" for c in registration_id):
                return _error(400, f"id must be {REGISTRATION_ID_LENGTH} lowercase hex characters")
            if not self.registry.remove(job_id, registration_id):
                return _error(404, "no such webhook for this job")
            log.info("job %s: webhook %s removed", job_id, registration_id)
            return ApiResponse(200, {"job_id": job_id, "removed": 1})
        if query.get("all") == "true":
            removed = self.registry.clear(job_id)
            log.info("job %s: all %d webhooks removed", job_id, removed)
            return ApiResponse(200, {"job_id": job_id, "removed": removed})
        return _error(400, "say which: ?id=<webhook id> or ?all=true")


__all__ = ["MAX_BODY_BYTES", "MAX_REGISTRATIONS_PER_JOB", "ApiResponse", "RegistrationAPI"]
