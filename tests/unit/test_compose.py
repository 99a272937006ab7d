"""docker-compose.yml without a container engine: Debian's docker-compose parses and resolves it, and
the resolved file is checked for what the stack needs to come up in order and stay up."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from correlator.config import Settings, load_settings
from correlator.stream.app import available_roles
from tests.fixtures.cli import parse_command_line

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ROOTRANK_IMAGE = "rootrank:local"
# Services with no health check, and why: one-shot jobs, and the distroless forwarder image.
NO_HEALTHCHECK = {"setup", "demo-job", "fluent-bit"}


def _compose(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose not installed (scripts/install-system-deps.sh installs it)")
    return subprocess.run([binary, "-f", str(COMPOSE), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors merged, defaults filled), every profile on."""
    result = _compose("--profile", "demo", "config")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert isinstance(config, dict)
    return config


def _rootrank_services(resolved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in resolved["services"].items() if s.get("image") == ROOTRANK_IMAGE}


def _binds(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of the bind mounts, in either of docker-compose's output forms."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out.append((str(volume["source"]), str(volume["target"])))
        elif volume.startswith(("/", ".")):
            source, target = volume.split(":")[:2]
            out.append((source, target))
    return out


def test_docker_compose_config_quiet_passes() -> None:
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_the_stack_has_every_part(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert {"kafka", "elasticsearch", "kibana", "setup", "fluent-bit"} <= set(services)
    roles = {s["command"][s["command"].index("--role") + 1] for s in services.values()
             if s.get("command") and s["command"][0] == "worker"}
    assert {"match", "correlate", "es-sink"} <= roles
    assert roles <= set(available_roles())
    assert "KAFKA_ZOOKEEPER_CONNECT" not in services["kafka"]["environment"]  # KRaft, no ZooKeeper
    assert "broker,controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]


def test_images_are_pinned(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        image = service["image"]
        if image == ROOTRANK_IMAGE:
            assert service["build"]["dockerfile"] == "deploy/docker/Dockerfile", name
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and any(c.isdigit() for c in tag), f"{name}: {image} is not pinned"
    elastic = {s["image"].rsplit(":", 1)[1] for s in resolved["services"].values() if "docker.elastic.co" in s["image"]}
    assert len(elastic) == 1, f"Elasticsearch and Kibana versions differ: {elastic}"


def test_health_checks_and_start_order(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    for name, service in services.items():
        check = service.get("healthcheck", {})
        if name in NO_HEALTHCHECK:
            continue
        assert check.get("test") and check["test"] != ["NONE"], f"{name} has no health check"
    setup_deps = services["setup"]["depends_on"]
    for dep in ("kafka", "elasticsearch", "kibana"):
        assert setup_deps[dep]["condition"] == "service_healthy"
    assert services["kibana"]["depends_on"]["elasticsearch"]["condition"] == "service_healthy"
    for name, service in services.items():
        if service.get("command", [None])[0] == "worker" or name == "fluent-bit":
            assert service["depends_on"]["setup"]["condition"] == "service_completed_successfully", name
    assert services["setup"]["restart"] == "no"


def test_rootrank_commands_parse_and_health_port_matches(resolved: dict[str, Any]) -> None:
    for name, service in _rootrank_services(resolved).items():
        command = parse_command_line(service["command"])  # raises (fails the test) on an unknown option
        assert command.command.callback is not None, name
        if service["command"][0] == "worker":
            assert command.params["web_port"] == 6066
            assert "6066/readyz" in " ".join(service["healthcheck"]["test"])
        if service["command"][0] == "setup":
            assert command.params["kibana"] == "http://kibana:5601"


def _setting_exists(env_name: str) -> bool:
    model: type[BaseModel] = Settings
    parts = env_name.removeprefix("ROOTRANK_").lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        if i < len(parts) - 1:
            annotation = field.annotation
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


def test_rootrank_environment_names_real_settings(resolved: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, service in _rootrank_services(resolved).items():
        env = service.get("environment", {})
        for key in env:
            if key.startswith("ROOTRANK_") and key != "ROOTRANK_KIBANA_OBJECTS":
                assert _setting_exists(key), f"{name}: {key} is not a setting"
    env = resolved["services"]["worker-match"]["environment"]
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("ROOTRANK_CONFIG", raising=False)
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.elasticsearch.url == "http://elasticsearch:9200"
    assert settings.topics.partitions == 8
    job = re.search(settings.engine.job_path_regex or "", "/var/log/training/llama-70b-run3/node04/train.log")
    assert job is not None and job["job"] == "llama-70b-run3"


def test_ports_only_on_localhost_and_bind_mounts_exist(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond this machine"
        for source, _ in _binds(service):
            assert Path(source).exists(), f"{name}: {source} does not exist"


def test_forwarder_sends_to_the_logs_topic(resolved: dict[str, Any]) -> None:
    forwarder = resolved["services"]["fluent-bit"]
    [conf] = [Path(source) for source, target in _binds(forwarder) if target.endswith("fluent-bit.conf")]
    assert f"Topics       {Settings().topics.logs}" in conf.read_text(encoding="utf-8")
    assert forwarder["environment"]["KAFKA_BROKERS"] == "kafka:9092"


def test_dockerfile_builds_from_the_repository_layout() -> None:
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text(encoding="utf-8")
    for line in dockerfile.splitlines():
        if line.startswith("COPY") and "--from" not in line:
            for source in line.split()[1:-1]:
                if not source.endswith("*"):
                    assert list(ROOT.glob(source)), f"Dockerfile copies {source}, which does not exist"
    assert 'ENTRYPOINT ["rootrank"]' in dockerfile
    assert "ROOTRANK_KIBANA_OBJECTS=/opt/rootrank/deploy/kibana" in dockerfile
    assert (ROOT / "deploy" / "docker" / "Dockerfile.dockerignore").exists()


def test_the_webhooks_api_is_reachable_from_the_host_with_a_token_from_the_environment() -> None:
    result = _compose("config")
    assert result.returncode == 0, result.stderr
    service = yaml.safe_load(result.stdout)["services"]["worker-webhooks"]
    ports = [str(p) if not isinstance(p, dict) else f"{p.get('host_ip')}:{p.get('published')}:{p.get('target')}"
             for p in service.get("ports", [])]
    assert any(p.startswith("127.0.0.1:6066:6066") for p in ports), ports
    assert service["environment"]["ROOTRANK_WEB_BIND"] == "0.0.0.0"
    assert "ROOTRANK_WEBHOOKS__API_TOKEN" in service["environment"]
    raw = COMPOSE.read_text(encoding="utf-8")
    assert "ROOTRANK_WEBHOOKS__API_TOKEN: ${ROOTRANK_API_TOKEN:-}" in raw  # from the shell, never in the file
