"""Does anything answer at a service's address? Asked before a command talks to it, so that nothing
listening is said at once and plainly, not after minutes of a client's retries.

    nothing answers at http://localhost:5601 (connection refused); is Kibana running?

Only the TCP connection is tried (a TLS or HTTP answer of any kind means something is there, and the
client's own errors say what is wrong with it).
"""

from __future__ import annotations

import socket
import urllib.parse

PROBE_TIMEOUT_S = 3.0


def _reason(exc: OSError, timeout_s: float, host: str) -> str:
    if isinstance(exc, socket.gaierror):
        return f"no such host: {host}"
    if isinstance(exc, TimeoutError):
        return f"no answer in {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return exc.strerror or exc.__class__.__name__


def _address(target: str, default_port: int) -> tuple[str, int]:
    """host and port of a URL (`http://h:9200`) or of `host:port`; ValueError when there is none."""
    parts = urllib.parse.urlsplit(target if "://" in target else f"tcp://{target}")
    if not parts.hostname:
        raise ValueError(f"no host in {target!r}")
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, default_port)
    return parts.hostname, port


def probe(targets: str, service: str, *, default_port: int = 80, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when one of `targets` (a URL, or comma-separated host:port, e.g. Kafka's bootstrap servers)
    accepts a TCP connection within `timeout_s`; else what to tell the user."""
    reasons: list[str] = []
    for target in (t.strip() for t in targets.split(",")):
        if not target:
            continue
        try:
            host, port = _address(target, default_port)
        except ValueError as exc:
            return f"{targets} is not an address ({exc}); where does {service} run?"
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as exc:
            reasons.append(_reason(exc, timeout_s, host))
    reason = "; ".join(dict.fromkeys(reasons)) or "no address given"
    return f"nothing answers at {targets} ({reason}); is {service} running?"
