"""Local stand-ins for the production services, for `rootrank up` and `make demo`.

The search store is noida-db's Elasticsearch API (production: real Elasticsearch); the webhook
receiver is a small HTTP server that records what it receives and checks Standard Webhooks
signatures (production: Slack, PagerDuty, any HTTPS endpoint).
"""

from __future__ import annotations

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
    port = port or free_port()
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
    return Part("search store", url, "noida-db Elasticsearch API", process.stop)


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


def start_webhook_receiver(ctx: UpContext) -> Part:
    """A local receiver, routed every incident (for trying webhooks without an external endpoint)."""
    receiver = WebhookReceiver()
    url = receiver.start()
    ctx.settings.webhooks.receivers.setdefault("local", {"kind": "generic_json", "url": f"{url}/hook"})
    ctx.settings.webhooks.routes.append({"match": {}, "receivers": ["local"]})
    return Part("webhook receiver", f"{url}/hook", "records POSTs (generic JSON)", receiver.stop)
