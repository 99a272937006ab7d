"""`rootrank setup` with nothing listening says so at once (issue 31: it took 126 s and ended in a raw
`urlopen error`): each service is probed first, with a short timeout."""

from __future__ import annotations

import socket
import time

import pytest

from correlator import cli
from correlator.tooling import probe as probe_module
from correlator.tooling.probe import probe
from tests.fixtures.http_receiver import free_port


@pytest.fixture(autouse=True)
def no_running_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("ROOTRANK_CONTEXT", "/nonexistent/rootrank-context.json")
    for name in ("ROOTRANK_CONFIG", "ROOTRANK_KAFKA__BOOTSTRAP_SERVERS", "ROOTRANK_ELASTICSEARCH__URL"):
        monkeypatch.delenv(name, raising=False)


def test_setup_with_nothing_listening_says_so_within_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    """Switched off (no probe), the Kibana step alone waits two minutes for a Kibana 'still starting'."""
    port = free_port()
    kibana, es = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/"
    started = time.monotonic()
    code = cli.main(["setup", "--bootstrap", f"127.0.0.1:{port}", "--es-url", es, "--kibana", kibana])
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    print(f"\nsetup with nothing listening: exit {code} in {elapsed:.1f}s")
    assert code == 1  # docs/operations.md, exit codes: a step failed
    assert f"kibana: nothing answers at {kibana} (connection refused); is Kibana running?" in err
    assert f"elasticsearch: nothing answers at {es} (connection refused); is Elasticsearch running?" in err
    assert f"topics: nothing answers at 127.0.0.1:{port} (connection refused); is Kafka running?" in err
    assert "urlopen error" not in err and "Traceback" not in err
    assert elapsed < 15, f"{elapsed:.1f}s"


def test_kibana_alone(capsys: pytest.CaptureFixture[str]) -> None:
    kibana = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["setup", "--skip-topics", "--skip-templates", "--kibana", kibana]) == 1
    assert capsys.readouterr().err.strip() == (
        f"rootrank setup: kibana: nothing answers at {kibana} (connection refused); is Kibana running?")


@pytest.mark.parametrize(("error", "reason"), [
    (TimeoutError("timed out"), "no answer in 3 s"),
    (socket.gaierror(-2, "Name or service not known"), "no such host: kibana.example"),
    (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
    (OSError(113, "No route to host"), "No route to host"),
])
def test_each_way_of_not_answering_is_worded(monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str) -> None:
    def fail(address: tuple[str, int], timeout: float) -> socket.socket:
        assert timeout == 3.0
        raise error

    monkeypatch.setattr(probe_module.socket, "create_connection", fail)
    assert probe("https://kibana.example", "Kibana") == (
        f"nothing answers at https://kibana.example ({reason}); is Kibana running?")


def test_something_listening_answers_and_one_of_several_bootstrap_servers_is_enough() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert probe(f"http://127.0.0.1:{port}", "Kibana") is None
        assert probe(f"127.0.0.1:{free_port()},127.0.0.1:{port}", "Kafka") is None
    assert probe("http://", "Kibana") == "http:// is not an address (no host in 'http://'); where does Kibana run?"
