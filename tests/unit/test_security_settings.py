"""Security settings reach the clients that need them, and secrets stay out of what is printed.

- Elasticsearch: basic auth and API keys go on the wire (seen by a real local HTTP server), a
  `ca_certs` file makes a TLS handshake with a self-signed server succeed and its absence makes it
  fail (a real TLS server on 127.0.0.1, certificate made with openssl for the test).
- Kafka: SASL/SSL settings reach kafka-python's config (admin, ES sink, shipper) and faust's
  credentials (the worker), with the CA file loaded into the SSL context. TLS itself is exercised
  end to end in tests/integration/test_kafka_tls.py (a broker behind a TLS proxy); SASL is checked
  up to the client objects, as no test broker here offers it.
- Secrets: the webhook API token is a SecretStr (never printed with the settings).
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from correlator.config import ElasticsearchSettings, KafkaSettings, Settings
from correlator.sinks.elasticsearch.client import make_client
from correlator.stream.app import _credentials
from correlator.stream.setup_topics import kafka_python_config
from tests.fixtures.http_receiver import HttpReceiver
from tests.fixtures.tls import self_signed_cert


def _es_request(settings: ElasticsearchSettings) -> None:
    client = make_client(settings, request_timeout_s=5)
    try:
        with contextlib.suppress(Exception):  # the test servers are not Elasticsearch; only what was sent matters
            client.info()
    finally:
        client.close()


def test_elasticsearch_credentials_go_on_the_wire(http_receiver: HttpReceiver) -> None:
    _es_request(ElasticsearchSettings(url=http_receiver.url("").rstrip("/"), username="sink", password="s3cr3t-pw"))
    _es_request(ElasticsearchSettings(url=http_receiver.url("").rstrip("/"), api_key="a2V5aWQ6a2V5c2VjcmV0"))
    auth = [r.headers.get("authorization") for r in http_receiver.requests]
    assert auth[0] == "Basic " + base64.b64encode(b"sink:s3cr3t-pw").decode()
    assert auth[-1] == "ApiKey a2V5aWQ6a2V5c2VjcmV0"


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """(https URL, CA file, paths requested) of a TLS server with a self-signed certificate."""
    cert, key = self_signed_cert(tmp_path)
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            body = b'{"version": {"number": "9.0.0"}, "tagline": "You Know, for Search"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Elastic-Product", "Elasticsearch")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert, seen
    finally:
        server.shutdown()
        server.server_close()


def test_elasticsearch_ca_certs_are_used_for_tls(tls_server: tuple[str, Path, list[str]]) -> None:
    url, ca, seen = tls_server
    _es_request(ElasticsearchSettings(url=url))  # the system CAs do not know this server
    assert seen == []
    client = make_client(ElasticsearchSettings(url=url, ca_certs=str(ca)), request_timeout_s=5)
    try:
        assert client.info()["tagline"] == "You Know, for Search"
    finally:
        client.close()
    assert seen == ["/"]


def test_kafka_sasl_ssl_settings_reach_every_client(tmp_path: Path) -> None:
    ca = Path(ssl.get_default_verify_paths().cafile or "")
    if not ca.is_file():
        import certifi

        ca = Path(certifi.where())
    kafka = KafkaSettings(bootstrap_servers="k1:9093, k2:9093", security_protocol="SASL_SSL",
                          sasl_mechanism="SCRAM-SHA-512", sasl_username="rootrank", sasl_password="kafka-pw",
                          ssl_cafile=str(ca))
    config = kafka_python_config(kafka)
    assert config == {"bootstrap_servers": ["k1:9093", "k2:9093"], "security_protocol": "SASL_SSL",
                      "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "rootrank",
                      "sasl_plain_password": "kafka-pw", "ssl_cafile": str(ca)}
    # kafka-python accepts the whole set (it validates names and the mechanism up front).
    from kafka.admin import KafkaAdminClient

    with pytest.raises(Exception) as err:  # no such hosts: it must fail on the connection, not the config
        KafkaAdminClient(**config, bootstrap_timeout_ms=500, request_timeout_ms=500)
    assert "sasl" not in str(err.value).lower() and "unrecognized" not in str(err.value).lower()

    credentials = _credentials(Settings(kafka=kafka))
    assert type(credentials).__name__ == "SASLCredentials"
    assert (credentials.username, credentials.password) == ("rootrank", "kafka-pw")
    assert str(credentials.mechanism.value if hasattr(credentials.mechanism, "value") else credentials.mechanism) \
        == "SCRAM-SHA-512"
    assert credentials.ssl_context is not None and credentials.ssl_context.get_ca_certs()

    tls_only = _credentials(Settings(kafka=KafkaSettings(security_protocol="SSL", ssl_cafile=str(ca))))
    assert type(tls_only).__name__ == "SSLCredentials"
    assert _credentials(Settings()) is None


def test_the_webhook_api_token_is_never_printed_with_the_settings() -> None:
    settings = Settings.model_validate({"webhooks": {"api_token": "tok-9f8e7d"}})
    assert "tok-9f8e7d" not in repr(settings) and "tok-9f8e7d" not in str(settings)
    assert "tok-9f8e7d" not in settings.model_dump_json()
    assert settings.webhooks.api_token is not None and settings.webhooks.api_token.get_secret_value() == "tok-9f8e7d"
