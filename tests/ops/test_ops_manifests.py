"""Kubernetes manifests: every overlay renders, validates offline and keeps the deployment invariants."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from ops_support import DASHBOARD_PATH, OVERLAYS, Manifest, find_tool, render_overlay

if find_tool("kubectl") is None:
    pytest.skip("kubectl (with its built-in kustomize) is not installed", allow_module_level=True)

# The oldest Kubernetes the manifests target, and the newest schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    return {name: render_overlay(name) for name in OVERLAYS}


def objects(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [manifest for manifest in manifests if manifest["kind"] == kind]


def one(manifests: list[Manifest], kind: str, name: str = "trace-rollout") -> Manifest:
    matching = [manifest for manifest in objects(manifests, kind) if manifest["metadata"]["name"] == name]
    assert len(matching) == 1, f"expected one {kind} {name}, found {len(matching)}"
    return matching[0]


def server_container(manifests: list[Manifest]) -> dict[str, Any]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "trace-rollout")
    return container


def environment(manifests: list[Manifest]) -> dict[str, str]:
    """The settings the server container gets from its ConfigMap and Secret, by variable name."""
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in manifests}
    settings: dict[str, str] = {}
    for source in server_container(manifests)["envFrom"]:
        if "configMapRef" in source:
            settings |= by_name["ConfigMap", source["configMapRef"]["name"]]["data"]
        else:
            secret = by_name["Secret", source["secretRef"]["name"]]
            settings |= secret.get("stringData", {}) | {
                key: base64.b64decode(value).decode() for key, value in secret["data"].items()
            }
    return settings


def test_every_overlay_renders_the_service(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    kinds = {manifest["kind"] for manifest in rendered[overlay]}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds


def test_core_objects_validate_against_kubernetes_schemas(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for manifest in rendered[overlay]:
        if manifest["kind"] in OPERATOR_KINDS:
            continue  # CRDs of the Prometheus Operator: checked by hand below
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_schema_validation_rejects_an_unknown_field(rendered: dict[str, list[Manifest]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = copy.deepcopy(one(rendered["cpu"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_selectors_reach_the_pods(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    manifests = rendered[overlay]
    deployment = one(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert one(manifests, "Service")["spec"]["selector"].items() <= pod_labels.items()
    assert (
        one(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    )
    for autoscaler in objects(manifests, "HorizontalPodAutoscaler"):
        target = autoscaler["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_server_container_is_probed_limited_and_locked_down(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    manifests = rendered[overlay]
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = server_container(manifests)
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}

    resources = container["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert "cpu" in resources["requests"], "the CPU autoscaler needs a CPU request"

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    tmp_volume = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp_volume)


def test_settings_come_from_the_config_map_and_secret(
    rendered: dict[str, list[Manifest]], overlay: str
) -> None:
    manifests = rendered[overlay]
    settings = environment(manifests)
    assert {"TRACE_STORE_URL", "TRACE_AUTH_TOKENS", "TRACE_PREDICTOR_DEVICE", "TRACE_METRICS_PORT"} <= set(
        settings
    )
    secret_names = {
        s["secretRef"]["name"] for s in server_container(manifests)["envFrom"] if "secretRef" in s
    }
    secret_keys = {
        key for m in manifests if m["metadata"]["name"] in secret_names for key in m.get("data", {})
    }
    assert {"TRACE_STORE_URL", "TRACE_AUTH_TOKENS"} <= secret_keys, "credentials belong in the Secret"
    # Replicas share tree state only through Redis: the embedded store is private to one process.
    assert settings["TRACE_STORE_URL"].startswith("redis://")


def test_cpu_overlay_runs_the_predictor_on_cpu(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["cpu"]
    assert environment(manifests)["TRACE_PREDICTOR_DEVICE"] == "cpu"
    assert "nvidia.com/gpu" not in server_container(manifests)["resources"]["limits"]


def test_gpu_overlay_asks_for_one_gpu_on_gpu_nodes(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["gpu"]
    container = server_container(manifests)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert environment(manifests)["TRACE_PREDICTOR_DEVICE"] == "cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    assert container["image"].endswith("-cuda")
    assert pod["nodeSelector"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_dev_overlay_brings_its_own_redis(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["dev"]
    redis_service = one(manifests, "Service", "trace-rollout-redis")
    redis_pod = one(manifests, "Deployment", "trace-rollout-redis")["spec"]["template"]
    assert redis_service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()
    port = redis_service["spec"]["ports"][0]["port"]
    assert environment(manifests)["TRACE_STORE_URL"] == f"redis://trace-rollout-redis:{port}/0"
    # A trial cluster may lack the Prometheus Operator and the metrics server.
    assert not {"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler"} & {
        m["kind"] for m in manifests
    }


@pytest.mark.parametrize("overlay_name", ["cpu", "gpu"])
def test_service_monitor_scrapes_the_service_port(
    rendered: dict[str, list[Manifest]], overlay_name: str
) -> None:
    manifests = rendered[overlay_name]
    service = one(manifests, "Service")
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    port_names = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
        # The scrape job stays Prometheus's: the service names the training run `training_job`.
        assert not endpoint.get("honorLabels", False)


@pytest.mark.parametrize("overlay_name", ["cpu", "gpu"])
def test_prometheus_rule_is_well_formed(rendered: dict[str, list[Manifest]], overlay_name: str) -> None:
    rule = one(rendered[overlay_name], "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    names = [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert len(names) == len(set(names)), "alert names must be unique"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for alert in group["rules"]:
            assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}
            assert alert["labels"]["severity"] in SEVERITIES
            assert alert["annotations"]["summary"] and alert["annotations"]["description"]


def test_dashboard_ships_as_a_grafana_config_map(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    config_map = one(rendered[overlay], "ConfigMap", "trace-rollout-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"]["trace-rollout.json"] == DASHBOARD_PATH.read_text()
