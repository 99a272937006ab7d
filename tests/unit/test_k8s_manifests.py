"""deploy/k8s without a cluster: every worker Deployment runs a command the CLI accepts, probes the
endpoints the worker serves on the port it listens on, reads config the settings loader accepts, and
the metrics Service selects the worker pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from correlator.config import Settings, load_settings
from correlator.stream.app import available_roles
from tests.fixtures.cli import parse_command_line

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == kind]


def test_every_role_has_a_deployment_with_liveness_and_readiness_probes() -> None:
    roles = set()
    for deployment in of_kind("Deployment"):
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        [container] = spec["template"]["spec"]["containers"]
        command = parse_command_line(container["args"])  # raises (fails the test) on an unknown option
        assert command.command_path == "rootrank worker"
        roles.add(command.params["role"])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == command.params["web_port"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["ROOTRANK_WEB_BIND"] == "0.0.0.0"  # the kubelet and Prometheus come from outside the pod
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        assert volumes["rules"]["configMap"]["name"] == "rootrank-rules"
        assert volumes["config"]["configMap"]["name"] == "rootrank-config"
        assert env["ROOTRANK_CONFIG"] == mounts["config"]
    assert roles == set(available_roles())


def test_config_map_is_valid_settings_pointing_at_the_mounted_rules(tmp_path: Path) -> None:
    [config] = [c for c in of_kind("ConfigMap") if c["metadata"]["name"] == "rootrank-config"]
    path = tmp_path / "rootrank.yaml"
    path.write_text(config["data"]["rootrank.yaml"])
    settings = load_settings(path)
    assert isinstance(settings, Settings)
    [deployment, *_] = of_kind("Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert settings.engine.rules_dir == mounts["rules"]
    assert settings.data_dir == mounts["data"]


def test_metrics_service_selects_the_worker_pods() -> None:
    [service] = of_kind("Service")
    selector = service["spec"]["selector"]
    [port] = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    for deployment in of_kind("Deployment"):
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
