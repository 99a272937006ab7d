"""deploy/forwarders/: every config parses and sends the forwarder's default JSON (rsyslog: its file
format) to the logs topic. rsyslog's own validator checks its config for real."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from correlator.config import Settings

FORWARDERS = Path(__file__).resolve().parents[2] / "deploy" / "forwarders"
TOPIC = Settings().topics.logs


def _fluent_bit_sections(path: Path) -> list[tuple[str, dict[str, str]]]:
    """Fluent Bit's classic format: [SECTION] then `Key  value` lines."""
    sections: list[tuple[str, dict[str, str]]] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1].upper(), {}))
            continue
        assert sections, f"{path.name}: {line!r} outside a section"
        key, _, value = line.partition(" ")
        assert value.strip(), f"{path.name}: {key} has no value"
        sections[-1][1][key.lower()] = value.strip()
    return sections


@pytest.mark.parametrize("name", ["fluent-bit.conf", "fluent-bit-kubernetes.conf"])
def test_fluent_bit_tails_and_sends_json_to_the_topic(name: str) -> None:
    sections = _fluent_bit_sections(FORWARDERS / "fluent-bit" / name)
    kinds = [s for s, _ in sections]
    assert kinds.count("SERVICE") == 1 and "INPUT" in kinds and "OUTPUT" in kinds
    inputs = [kv for s, kv in sections if s == "INPUT"]
    assert all(kv["name"] == "tail" for kv in inputs)
    [output] = [kv for s, kv in sections if s == "OUTPUT"]
    assert output["name"] == "kafka" and output["topics"] == TOPIC
    assert output["format"] == "json"  # the default record shape rootrank decodes
    assert "timestamp_format" not in output  # left at Fluent Bit's default
    assert output["brokers"] == "${KAFKA_BROKERS}"
    tags = {kv["tag"].rstrip("*") for kv in inputs}
    assert any(output["match"].rstrip("*") == t for t in tags)


def _yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", ["vector.yaml", "vector-kubernetes.yaml"])
def test_vector_sends_json_events_to_the_topic(name: str) -> None:
    config = _yaml(FORWARDERS / "vector" / name)
    [sink] = config["sinks"].values()
    assert sink["type"] == "kafka" and sink["topic"] == TOPIC
    assert sink["encoding"] == {"codec": "json"}
    assert set(sink["inputs"]) <= set(config["sources"])
    assert sink["acknowledgements"]["enabled"] is True


@pytest.mark.parametrize("name", ["filebeat.yml", "filebeat-kubernetes.yml"])
def test_filebeat_sends_its_default_json_to_the_topic(name: str) -> None:
    config = _yaml(FORWARDERS / "filebeat" / name)
    output = config["output.kafka"]
    assert output["topic"] == TOPIC
    assert "codec.format" not in output and "codec" not in output  # default: the JSON event
    assert all(i["type"] == "filestream" and i["id"] for i in config["filebeat.inputs"])


def test_rsyslog_config_passes_rsyslogs_own_validation(tmp_path: Path) -> None:
    rsyslogd = shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if Path("/usr/sbin/rsyslogd").exists() else None)
    if rsyslogd is None:
        pytest.skip("rsyslogd not installed (scripts/install-system-deps.sh installs rsyslog and rsyslog-kafka)")
    conf = FORWARDERS / "rsyslog" / "rootrank.conf"
    text = conf.read_text(encoding="utf-8")
    assert f'topic="{TOPIC}"' in text and 'template="RSYSLOG_FileFormat"' in text
    # As /etc/rsyslog.conf would include it: the main config sets the work directory.
    main = tmp_path / "rsyslog.conf"
    main.write_text(f'global(workDirectory="{tmp_path}")\ninclude(file="{conf}")\n', encoding="utf-8")
    result = subprocess.run([rsyslogd, "-N1", "-f", str(main)], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr + result.stdout
    # ... and the validator does fail on a broken config (so the check above means something).
    broken = tmp_path / "broken.conf"
    broken.write_text(text.replace('topic="', 'topik="'), encoding="utf-8")
    main.write_text(f'global(workDirectory="{tmp_path}")\ninclude(file="{broken}")\n', encoding="utf-8")
    bad = subprocess.run([rsyslogd, "-N1", "-f", str(main)], capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode != 0
