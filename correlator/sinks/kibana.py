"""Import rootrank's Kibana saved objects (deploy/kibana/*.ndjson) through the saved-objects API.

`POST <kibana>/api/saved_objects/_import?overwrite=true` with the NDJSON as a multipart file, and the
`kbn-xsrf` header Kibana requires on writes. Every file goes in one request, data views first, so the
references between objects resolve inside the import.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay

from correlator.config import RetryPolicy

DEFAULT_PREFIX = "rootrank"

# Polls a Kibana that is still starting about every 2 s (at most), for the caller's `wait_s`.
STARTUP_BACKOFF = RetryPolicy(initial_backoff_s=2.0, max_backoff_s=2.0).backoff()


class KibanaImportError(RuntimeError):
    pass


def default_objects_dir() -> Path:
    """ROOTRANK_KIBANA_OBJECTS, else deploy/kibana next to the sources (a checkout or the image)."""
    env = os.environ.get("ROOTRANK_KIBANA_OBJECTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "deploy" / "kibana"


def load_objects(folder: Path, index_prefix: str = DEFAULT_PREFIX) -> list[dict[str, Any]]:
    """The objects of every *.ndjson in `folder`, in file-name order. With another index prefix,
    the data views point at `<prefix>-incidents` / `<prefix>-signals`."""
    files = sorted(folder.glob("*.ndjson"))
    if not files:
        raise KibanaImportError(f"no *.ndjson saved objects in {folder}")
    objects = []
    for path in files:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KibanaImportError(f"{path}:{n}: not JSON: {exc}") from exc
            if obj.get("type") == "index-pattern" and index_prefix != DEFAULT_PREFIX:
                title = str(obj["attributes"]["title"])
                if title.startswith(f"{DEFAULT_PREFIX}-"):
                    obj["attributes"]["title"] = index_prefix + title[len(DEFAULT_PREFIX):]
            objects.append(obj)
    return objects


def _kibana_still_starting(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (502, 503, 504)
    return isinstance(exc, urllib.error.URLError | OSError)


def _multipart(filename: str, content: bytes) -> tuple[bytes, str]:
    boundary = f"rootrank-{uuid.uuid4().hex}"
    body = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/ndjson\r\n\r\n"
    ).encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@dataclass
class ImportResult:
    success: bool
    success_count: int
    errors: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        text = f"kibana: imported {self.success_count} saved objects"
        if self.errors:
            text += f"; {len(self.errors)} errors: " + "; ".join(
                f"{e.get('type')}/{e.get('id')}: {e.get('error', {}).get('type', e.get('error'))}" for e in self.errors[:5]
            )
        return text


def import_saved_objects(
    kibana_url: str,
    objects: Sequence[dict[str, Any]],
    *,
    space: str | None = None,
    username: str | None = None,
    password: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    wait_s: float = 120.0,
) -> ImportResult:
    """Import (overwriting objects with the same ids, so re-running setup is safe). Waits up to
    `wait_s` for a Kibana that is still starting (503 / connection refused)."""
    base = kibana_url.rstrip("/")
    path = f"/s/{space}/api/saved_objects/_import" if space and space != "default" else "/api/saved_objects/_import"
    ndjson = "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objects).encode()
    body, content_type = _multipart("rootrank.ndjson", ndjson)
    headers = {"kbn-xsrf": "rootrank", "Content-Type": content_type}
    if api_key:
        headers["Authorization"] = f"ApiKey {api_key}"
    elif username:
        token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"

    def post() -> Any:
        request = urllib.request.Request(f"{base}{path}?overwrite=true", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    retrying = Retrying(
        retry=retry_if_exception(_kibana_still_starting),
        wait=STARTUP_BACKOFF,
        stop=stop_after_delay(wait_s),
        reraise=True,
    )
    try:
        data = retrying(post)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise KibanaImportError(f"{base}{path}: HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise KibanaImportError(f"{base}{path}: {exc}") from exc
    return ImportResult(bool(data.get("success")), int(data.get("successCount", 0)), list(data.get("errors") or []))
