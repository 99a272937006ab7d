"""The web app of `rootrank serve`: the page, `POST /api/diagnose`, the incident pictures, and the guards.

Routes: `GET /` (paste, drop, diagnose), `GET /static/...` (the page's own script and style: nothing is
loaded from elsewhere), `POST /api/diagnose` (the JSON of `rootrank diagnose --format json` for the
uploaded files or pasted text), `GET /incident/ID` (the picture of an incident of a recent answer).

Guards, on every request: the Host header must name this machine's loopback when the server listens only
there (a web page elsewhere cannot reach it by rebinding a DNS name to 127.0.0.1); with a token, the
request must carry it (`Authorization: Bearer`, `X-Rootrank-Token`, or the cookie `/?token=` sets).
Errors are JSON `{"error": "..."}` under /api/, a short page elsewhere; bad input is a 4xx, never a 500.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import sys
import tempfile
import time
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from urllib.parse import quote

import jinja2
from aiohttp import web
from aiohttp.http import HttpVersion11

from correlator.offline.diagnose import Diagnoser
from correlator.serve.diagnosis import Outcome, diagnose_upload
from correlator.serve.uploads import UploadError, overhead_allowance, receive_upload, too_large_message

TOKEN_COOKIE = "rootrank_serve_token"
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# The picture's own page: as self-contained as `diagnose --format html` (its meta tag says the same).
INCIDENT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; frame-ancestors 'self'"
API_CSP = "default-src 'none'; frame-ancestors 'none'"
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"rootrank serve: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Settings:
    max_upload_bytes: int = 512 << 20
    token: str | None = None
    loopback_only: bool = True  # the Host header must name loopback (127.0.0.0/8, ::1, localhost)
    tmp_root: str | None = None  # where each request's temporary folder is made (None: the system's)
    keep_pages: int = 64  # incident pictures kept for GET /incident/ID, the most recent
    keep_bytes: int = 64 << 20
    idle_s: float = 60.0  # an upload that sends nothing for this long is dropped (408)
    log: Log = field(default=_stderr)


class PageStore:
    """The pictures of recent answers, by incident id; the oldest go past `count` pages or `size` bytes."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self._pages: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0

    def put(self, incident_id: str, page: str) -> None:
        data = page.encode("utf-8")
        self.discard(incident_id)
        self._pages[incident_id] = data
        self._bytes += len(data)
        while self._pages and (len(self._pages) > self.count or self._bytes > self.size):
            _, old = self._pages.popitem(last=False)
            self._bytes -= len(old)

    def discard(self, incident_id: str) -> None:
        old = self._pages.pop(incident_id, None)
        if old is not None:
            self._bytes -= len(old)

    def get(self, incident_id: str) -> bytes | None:
        return self._pages.get(incident_id)

    def __len__(self) -> int:
        return len(self._pages)


SETTINGS = web.AppKey("settings", Settings)
DIAGNOSER = web.AppKey("diagnoser", Diagnoser)
PAGES = web.AppKey("pages", PageStore)
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
TEMPLATES = web.AppKey("templates", jinja2.Environment)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip().lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")]
    return host_header.rsplit(":", 1)[0]


def _error(request: web.Request, status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    if request.path.startswith("/api/"):
        return web.json_response({"error": message}, status=status, headers=headers)
    body = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>rootrank serve: {status}</title>"
            f"</head><body><p>{_escape(message)}</p><p><a href=\"/\">rootrank serve</a></p></body></html>")
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _token_of(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("X-Rootrank-Token") or request.cookies.get(TOKEN_COOKIE)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as a message: JSON under /api/, a short page elsewhere; a bug is a 500 that says so."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(request, exc.status, exc.reason if exc.text is None else exc.text.removeprefix(f"{exc.status}: "))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:  # noqa: BLE001 - the one place a bug becomes an answer instead of a dropped request
        request.app[SETTINGS].log(f"{request.method} {request.path}: internal error\n{traceback.format_exc()}")
        return _error(request, 500, f"internal error: {type(exc).__name__}: {exc} (a bug in rootrank serve)")


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    if settings.loopback_only and not is_loopback(_host_name(request.host)):
        return _error(request, 403, f"this server answers only to 127.0.0.1 and localhost, not to {request.host!r}")
    if settings.token is not None:
        given = request.query.get("token") if request.path == "/" and request.method == "GET" else None
        if given is not None and hmac.compare_digest(given.encode(), settings.token.encode()):
            # the token leaves the address bar; the cookie carries it from now on
            moved = web.Response(status=303, headers={"Location": "/"})
            moved.set_cookie(TOKEN_COOKIE, settings.token, httponly=True, samesite="Strict", path="/")
            return moved
        sent = _token_of(request)
        if sent is None or not hmac.compare_digest(sent.encode(), settings.token.encode()):
            return _error(request, 401, "this server needs its token: open the address rootrank serve printed "
                                        "(/?token=...), or send Authorization: Bearer TOKEN")
    resp = await handler(request)
    resp.headers.setdefault("Content-Security-Policy", API_CSP if request.path.startswith("/api/") else PAGE_CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    resp.headers.setdefault("Cache-Control", "no-store")
    return resp


async def index(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    page = request.app[TEMPLATES].get_template("index.html.j2").render(
        max_bytes=settings.max_upload_bytes, max_mib=f"{settings.max_upload_bytes / (1 << 20):g}",
    )
    return web.Response(text=page, content_type="text/html")


async def _expect_upload(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` (curl, for large bodies): a body over the limit is refused before it is sent."""
    limit = request.app[SETTINGS].max_upload_bytes
    if request.content_length is not None and request.content_length > limit + overhead_allowance():
        return web.json_response({"error": too_large_message(limit)}, status=413, headers={"Connection": "close"})
    if request.version == HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the response (as aiohttp's own handler does)
        return None
    raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers.get('Expect')}")


async def api_diagnose(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    started = time.monotonic()
    folder = tempfile.TemporaryDirectory(prefix="rootrank-serve-", dir=settings.tmp_root)
    try:
        upload = await receive_upload(request, Path(folder.name), settings.max_upload_bytes, settings.idle_s)
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(request.app[EXECUTOR], diagnose_upload, request.app[DIAGNOSER], upload)
    except UploadError as exc:
        settings.log(f"POST /api/diagnose: {exc.status}: {exc.message}")
        headers = {"Connection": "close"} if exc.status == 413 else None  # the rest of the body is not read
        return _error(request, exc.status, exc.message, headers)
    finally:
        folder.cleanup()  # the logs are gone before the answer leaves
    pages = request.app[PAGES]
    for incident_id, page in outcome.pages.items():
        pages.put(incident_id, page)
    settings.log(_summary(outcome, len(upload.files) + upload.pasted, upload.size, time.monotonic() - started))
    headers = {"X-Rootrank-Job": quote(outcome.job_id, safe="")}  # a job named after a file may be any text
    if outcome.notes:
        headers["X-Rootrank-Notes"] = json.dumps(outcome.notes)  # ASCII: header-safe
    return web.Response(body=outcome.body, content_type="application/json", headers=headers)


def _summary(outcome: Outcome, inputs: int, size: int, seconds: float) -> str:
    what = "no incident"
    if outcome.incidents:
        first = outcome.incidents[0]
        who = f" on rank {first.initiator.rank}" if first.initiator.rank is not None else ""
        what = f"{first.class_}{who} (incident {first.incident_id})"
        if len(outcome.incidents) > 1:
            what += f" and {len(outcome.incidents) - 1} more"
    return f"diagnosed {inputs} input(s), {size / (1 << 20):.1f} MiB in {seconds:.2f} s: {what}"


async def incident_page(request: web.Request) -> web.Response:
    incident_id = request.match_info["incident_id"]
    page = request.app[PAGES].get(incident_id)
    if page is None:
        return _error(request, 404, f"incident {incident_id} is not among the recent answers of this server: "
                                    "diagnose its logs again")
    return web.Response(body=page, content_type="text/html", charset="utf-8",
                        headers={"Content-Security-Policy": INCIDENT_CSP})


async def _start_executor(app: web.Application) -> None:
    app[EXECUTOR] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rootrank-diagnose")


async def _stop_executor(app: web.Application) -> None:
    app[EXECUTOR].shutdown(wait=False, cancel_futures=True)


def create_app(diagnoser: Diagnoser, settings: Settings | None = None) -> web.Application:
    """The app; one diagnosis runs at a time, in a worker thread (uploads stream in meanwhile)."""
    settings = settings or Settings()
    app = web.Application(middlewares=[_errors, _guard], client_max_size=settings.max_upload_bytes + overhead_allowance())
    app[SETTINGS] = settings
    app[DIAGNOSER] = diagnoser
    app[PAGES] = PageStore(settings.keep_pages, settings.keep_bytes)
    app[TEMPLATES] = jinja2.Environment(loader=jinja2.PackageLoader("correlator.serve", "templates"), autoescape=True,
                                        undefined=jinja2.StrictUndefined)
    app.on_startup.append(_start_executor)
    app.on_cleanup.append(_stop_executor)
    app.router.add_get("/", index)
    app.router.add_post("/api/diagnose", api_diagnose, expect_handler=_expect_upload)
    app.router.add_get("/incident/{incident_id}", incident_page)
    app.router.add_static("/static/", Path(str(files("correlator.serve") / "static")))
    return app
