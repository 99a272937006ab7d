"""`rootrank webhooks add|list|remove`: a small client of the worker's /jobs/{job_id}/webhooks API.

Credentials never go on the command line (shell history, `ps`): the API token comes from
ROOTRANK_API_TOKEN, a --token-file, or the config's webhooks.api_token; a signing secret from
--secret-file or --generate-secret (printed once, for the receiver's side).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from correlator.sinks.webhooks.receivers.generic_json import generate_secret


class ClientError(Exception):
    pass


@dataclass
class WebhooksClient:
    base_url: str
    token: str | None
    timeout_s: float = 10.0

    def _call(self, method: str, job_id: str, *, query: dict[str, str] | None = None,
              body: dict[str, Any] | None = None, auth: bool = True) -> tuple[int, dict[str, Any]]:
        url = f"{self.base_url.rstrip('/')}/jobs/{urllib.parse.quote(job_id, safe='')}/webhooks"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if auth and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        # No proxies: the token and secrets go to the worker, not through whatever HTTP_PROXY says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=self.timeout_s) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                payload = json.loads(exc.read() or b"{}")
            except ValueError:
                payload = {}
            return exc.code, payload
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"cannot reach the rootrank worker at {self.base_url}: {reason}") from None

    def _ok(self, status: int, payload: dict[str, Any]) -> dict[str, Any]:
        if status < 300:
            return payload
        detail = payload.get("error")
        if status == 404 and not detail:
            detail = (f"{self.base_url} does not serve the webhooks API (a worker running the webhooks role "
                      "with --web-port serves it; so does `rootrank up`)")
        elif status == 401 and not self.token:
            detail = f"{detail or 'unauthorized'}: no API token (--token-file, $ROOTRANK_API_TOKEN)"
        raise ClientError(f"HTTP {status}: {detail or 'no detail'}")

    def add(self, job_id: str, registration: dict[str, Any]) -> dict[str, Any]:
        return self._ok(*self._call("PUT", job_id, body=registration))

    def list(self, job_id: str) -> list[dict[str, Any]]:
        webhooks: list[dict[str, Any]] = self._ok(*self._call("GET", job_id))["webhooks"]
        return webhooks

    def remove(self, job_id: str, *, url: str | None = None, registration_id: str | None = None,
               everything: bool = False) -> int:
        if everything:
            return int(self._ok(*self._call("DELETE", job_id, query={"all": "true"}))["removed"])
        ids = [registration_id] if registration_id else [w["id"] for w in self.list(job_id) if w["target"] == url]
        if not ids:
            raise ClientError(f"job {job_id} has no webhook {'with that id' if registration_id else 'to that URL'}")
        for one in ids:
            self._ok(*self._call("DELETE", job_id, query={"id": one}))
        return len(ids)


def read_secret_file(path: str) -> str:
    return Path(path).read_text(encoding="utf-8").strip()


def resolve_token(token_file: str | None, configured: str | None) -> str | None:
    if token_file:
        return read_secret_file(token_file)
    return os.environ.get("ROOTRANK_API_TOKEN") or configured


def registration_from_args(args: Any) -> tuple[dict[str, Any], str | None]:
    """The PUT body from `webhooks add` arguments, and a generated secret to show (or None)."""
    body: dict[str, Any] = {"kind": args.kind}
    if args.url:
        body["url"] = args.url
    shown = None
    if args.generate_secret:
        shown = generate_secret()
        body["secret"] = shown
    elif args.secret_file:
        body["secret"] = read_secret_file(args.secret_file)
    if args.routing_key_file:
        body["routing_key"] = read_secret_file(args.routing_key_file)
    if args.min_severity:
        body["min_severity"] = args.min_severity
    if args.classes:
        body["classes"] = list(args.classes)
    return body, shown
