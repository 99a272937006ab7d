"""Local stand-ins for the production services, for `rootrank up` and `make demo`.

The search store is noida-db's Elasticsearch API (production: real Elasticsearch); the webhook
receiver (`make demo`'s) is a small HTTP server that records what it receives and checks Standard
Webhooks signatures (production: Slack, PagerDuty, any HTTPS endpoint).
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from correlator.tooling.embedded import (
    ManagedProcess,
    Part,
    UpContext,
    UpError,
    free_port,
    http_ok,
    noida_binary,
)


def start_elasticsearch(ctx: UpContext, port: int | None = None) -> Part:
    """noida-db's Elasticsearch API on 127.0.0.1, data under the stack's data dir."""
    binary = noida_binary()
    if binary is None:
        raise UpError("noida-db is not installed: pip install noida-db==0.2.3 (or point ROOTRANK_ELASTICSEARCH__URL "
                      "at a real Elasticsearch)")
    port = port or ctx.es_port or free_port()
    data = ctx.data_dir / "elasticsearch"
    data.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess(
        "the search store (noida-db)",
        [binary, "start", "--only", "elasticsearch", "--elasticsearch-port", str(port), "--host", "127.0.0.1",
         "--data-dir", str(data)],
        ctx.data_dir / "elasticsearch.log",
    )
    process.start(lambda: http_ok(url))
    ctx.settings.elasticsearch.url = url
    from correlator.sinks.elasticsearch.indices import install_templates

    try:
        for _ in install_templates(ctx.settings):
            pass
    except Exception as exc:  # noqa: BLE001 - report it as the part failing to start
        process.stop()
        raise UpError(f"the search store at {url} refused the index templates: {exc}") from None
    refresher = _Refresher(url)
    refresher.start()

    def stop() -> None:
        refresher.stop()
        process.stop()

    return Part("search store", url, f"noida-db Elasticsearch API, data in {data}", stop)


class _Refresher:
    """noida-db ignores the templates' refresh_interval (1s): a document becomes searchable only at an
    explicit refresh or the next write, so a job's single incident would never show. The local store
    is refreshed every second instead, as Elasticsearch itself would (production is not touched)."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = f"{url}/_refresh"
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-store-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):  # stopping, or busy: the next tick refreshes
                opener.open(urllib.request.Request(self.url, data=b"", method="POST"), timeout=5).close()


@dataclass
class ReceivedWebhook:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_valid: bool | None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    """Records every POST; verifies `webhook-signature` when it knows the secret."""

    secret: str | None = None
    received: list[ReceivedWebhook] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def verify(self, headers: dict[str, str], body: bytes) -> bool | None:
        if not self.secret:
            return None
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            return False
        return True

    def start(self, port: int = 0) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.received.append(ReceivedWebhook(self.path, headers, body, receiver.verify(headers, body)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
