"""Any HTTPS endpoint: the incident as JSON, signed per the Standard Webhooks convention.

Headers on every attempt: `webhook-id` (the delivery id, the same on every retry),
`webhook-timestamp` (Unix seconds of that attempt) and `webhook-signature`:
"v1," + base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")), where the key is the base64 part
of the `whsec_...` secret, decoded (https://www.standardwebhooks.com/, spec/standard-webhooks.md).
The signature is the `standardwebhooks` reference library's.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import ClassVar

from pydantic import Field, SecretStr, field_validator
from standardwebhooks.webhooks import Webhook

from correlator.sinks.webhooks.notification import Notification
from correlator.sinks.webhooks.receivers.base import (
    OutboundRequest,
    Receiver,
    ReceiverConfig,
    UrlReceiverConfig,
    dumps,
)

SECRET_PREFIX = "whsec_"
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64
TIMESTAMP_TOLERANCE_S = 300  # the spec's (and the library's) five minutes


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret; ValueError says what is wrong, never the secret."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"secret must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("secret is not valid base64 after the whsec_ prefix") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"secret key must be {MIN_KEY_BYTES}..{MAX_KEY_BYTES} bytes, got {len(key)}")
    return key


def generate_secret(nbytes: int = 32) -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(nbytes)).decode("ascii")


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    # Bodies are rootrank's own JSON (UTF-8), so the library's str round trip keeps the bytes.
    return Webhook(key).sign(msg_id, datetime.fromtimestamp(timestamp, UTC), body.decode("utf-8"))


def signature_headers(key: bytes | None, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if key is not None:
        headers["webhook-signature"] = sign(key, msg_id, timestamp, body)
    return headers


def verify(
    key: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
) -> bool:
    """True when one of the space-separated v1 signatures matches and the timestamp is within the
    spec's tolerance of `now`. `Webhook.verify` reads the wall clock itself, so the window is checked
    here and the signature compared with the library's."""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        return False
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > TIMESTAMP_TOLERANCE_S:
        return False
    try:
        expected = sign(key, msg_id, timestamp, body).encode("ascii")
    except UnicodeDecodeError:  # not a body rootrank signed
        return False
    return any(
        hmac.compare_digest(candidate.encode("ascii", "replace"), expected)
        for candidate in signatures.split(" ")
        if candidate.startswith("v1,")
    )


class GenericJsonConfig(UrlReceiverConfig):
    kind: str = "generic_json"
    secret: SecretStr | None = None
    # Extra request headers (an Authorization for a gateway, say): values are secrets.
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            decode_secret(value.get_secret_value())
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, header_value in value.items():
            if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
                raise ValueError("header names may contain letters, digits, '-' and '_' only")
            if name.lower().startswith("webhook-") or name.lower() in ("content-type", "content-length", "host"):
                raise ValueError(f"header {name!r} is set by rootrank")
            if any(ord(ch) < 0x20 for ch in header_value.get_secret_value()):
                raise ValueError(f"header {name!r} has control characters")
        return value


def payload(notification: Notification) -> dict[str, object]:
    return {
        "type": f"incident.{notification.transition}",
        "timestamp": notification.event_time,
        "data": {
            "delivery_id": notification.delivery_id,
            "transition": notification.transition,
            "link": notification.link,
            "incident": notification.incident.to_json_dict(),
        },
    }


class GenericJsonReceiver(Receiver[GenericJsonConfig]):
    kind: ClassVar[str] = "generic_json"
    config_model: ClassVar[type[ReceiverConfig]] = GenericJsonConfig

    def render(self, notification: Notification) -> OutboundRequest:
        cfg = self.config
        key = decode_secret(cfg.secret.get_secret_value()) if cfg.secret is not None else None
        return OutboundRequest(
            url=cfg.url,
            body=dumps(payload(notification)),
            headers={name: value.get_secret_value() for name, value in cfg.headers.items()},
            signing_key=key,
        )
