"""deploy/compose.yaml, the local cluster: a valid Compose file whose proxy, Prometheus and Grafana are
wired to the replicas, the project's alert rules and its dashboard, checked without Docker."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from ops_support import DASHBOARD_PATH, DEPLOY, REPO_ROOT, find_tool, load_dashboard, prometheus_rule_spec

COMPOSE_PATH = DEPLOY / "compose.yaml"
COMPOSE_DIR = DEPLOY / "compose"
RULES_PATH = COMPOSE_DIR / "rules.yaml"
CR_PATH = DEPLOY / "base" / "prometheusrule.yaml"
SCHEMA_PATH = Path(__file__).with_name("compose_spec") / "compose-spec.json"
SERVICE = "trace-rollout"
# Host ports of the services published by default (the variables in compose.yaml can move them).
PUBLISHED = {"proxy": 8000, "prometheus": 9090, "grafana": 3000}
# Files whose text may tell a reader to run `docker compose -f FILE`.
DOC_SUFFIXES = {".md", ".sh", ".yaml", ".yml", ".py"}

_VARIABLE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-(?P<default>[^}]*))?\}")

Service = dict[str, Any]


def with_defaults(text: str) -> str:
    """Compose's interpolation with no variable set: ``${NAME:-default}`` gives its default."""
    return _VARIABLE.sub(lambda match: match["default"] or "", text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(with_defaults(COMPOSE_PATH.read_text()))
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Service]:
    found: dict[str, Service] = compose["services"]
    return found


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def bind_mounts(service: Service) -> dict[PurePosixPath, Path]:
    """Container path -> host path of a service's bind mounts (relative host paths start at deploy/)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith((".", "/")):
            mounts[PurePosixPath(target)] = (DEPLOY / source).resolve()
    return mounts


def mounted(service: Service, container_path: str | PurePosixPath) -> Path:
    """The host file behind a path inside the container, mounted itself or in a mounted folder."""
    wanted = PurePosixPath(container_path)
    for target, source in bind_mounts(service).items():
        if wanted == target or target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"nothing is mounted at {wanted}")


def load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_interpolation_gives_the_defaults() -> None:
    assert with_defaults("${A:-2} ${B} ${C-x}") == "2  x"


def test_compose_file_follows_the_compose_specification(
    compose: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(compose)
    ]
    assert not errors, errors


def test_the_schema_rejects_a_misspelt_key(
    compose: dict[str, Any], validator: jsonschema.Draft202012Validator
) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["redis"]["healthchek"] = broken["services"]["redis"].pop("healthcheck")
    assert not validator.is_valid(broken)


def test_docker_compose_accepts_the_file() -> None:
    docker = find_tool("docker")
    if (
        docker is None
        or subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=30, check=False
        ).returncode
    ):
        pytest.skip("the docker CLI with its compose plugin is not installed")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_PATH), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_image_is_pinned_to_a_version(services: dict[str, Service]) -> None:
    for name, service in services.items():
        repository, _, tag = service["image"].rpartition(":")
        assert repository and "/" not in tag, f"{name}: no tag on {service['image']}"
        assert re.search(r"\d", tag) and tag not in {"latest", "stable", "mainline", "main"}, (name, tag)
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert services[SERVICE]["image"] == f"trace-rollout:{project['version']}"


def test_published_ports_are_on_loopback_only(services: dict[str, Service]) -> None:
    published = {}
    for name, service in services.items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", (name, port)
                published[name] = int(port["published"])
            else:
                host_ip, host_port, _ = str(port).split(":")
                assert host_ip == "127.0.0.1", (name, port)
                published[name] = int(host_port)
    assert published == PUBLISHED
    assert SERVICE not in published, "replicas cannot share a host port: they are reached through the proxy"


def test_replicas_share_one_persistent_redis(compose: dict[str, Any], services: dict[str, Service]) -> None:
    redis = services["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in compose["volumes"]

    server = services[SERVICE]
    assert server["deploy"]["replicas"] == 2
    assert "container_name" not in server, "a fixed container name forbids a second replica"
    assert server["environment"]["TRACE_STORE_URL"] == "redis://redis:6379/0"
    assert server["depends_on"]["redis"]["condition"] == "service_healthy"
    context = (DEPLOY / server["build"]["context"]).resolve()
    assert context == REPO_ROOT and (context / server["build"]["dockerfile"]).is_file()


def test_every_service_has_a_healthcheck(services: dict[str, Service]) -> None:
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), name
    assert "/readyz" in " ".join(services[SERVICE]["healthcheck"]["test"])


def test_bind_mounts_name_files_that_exist(services: dict[str, Service]) -> None:
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_proxy_resolves_the_replicas_at_request_time(services: dict[str, Service]) -> None:
    proxy = services["proxy"]
    config = mounted(proxy, "/etc/nginx/conf.d/default.conf").read_text()
    assert re.search(r"^resolver 127\.0\.0\.11 ", config, re.MULTILINE), "Docker's DNS, re-asked"
    variable, host = re.findall(r"set \$(\w+) ([\w-]+);", config)[0]
    assert host == SERVICE
    assert f"proxy_pass http://${variable}:8000;" in config, "a variable upstream is resolved per request"
    container_port = proxy["ports"][0].rsplit(":", 1)[1]
    assert f"listen {container_port};" in config


def test_nginx_accepts_the_proxy_config(tmp_path: Path) -> None:
    nginx = find_tool("nginx")
    if nginx is None:
        pytest.skip("nginx is not installed (Debian package nginx)")
    # The image's nginx.conf around conf.d/default.conf, with every path in tmp_path.
    paths = "\n".join(
        f"{kind}_temp_path {tmp_path / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path / 'nginx.pid'};\nerror_log stderr;\nevents {{}}\n"
        f"http {{\naccess_log off;\n{paths}\ninclude {COMPOSE_DIR / 'nginx.conf'};\n}}\n"
    )
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def prometheus_config(services: dict[str, Service]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        mounted(services["prometheus"], "/etc/prometheus/prometheus.yml").read_text()
    )
    return config


def test_prometheus_scrapes_every_replica_through_dns(services: dict[str, Service]) -> None:
    config = prometheus_config(services)
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == SERVICE]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    (discovery,) = job["dns_sd_configs"]
    assert (discovery["names"], discovery["type"], discovery["port"]) == ([SERVICE], "A", 8000)
    # Labels the dashboard's variables filter on, which Kubernetes scrapes carry and the service does not
    # write itself: every replica here gets one value for each.
    variable_labels = {
        match
        for variable in load_dashboard()["templating"]["list"]
        for match in re.findall(r"label_values\(.*,\s*(\w+)\)", variable.get("definition", ""))
    } & {"cluster", "namespace"}
    target_labels = {rule["target_label"]: rule["replacement"] for rule in job["relabel_configs"]}
    missing = {label for label in variable_labels | {"namespace"} if target_labels.get(label) != "compose"}
    assert not missing, target_labels


def test_prometheus_loads_the_generated_rules(services: dict[str, Service]) -> None:
    config = prometheus_config(services)
    rule_files = [PurePosixPath("/etc/prometheus") / path for path in config["rule_files"]]
    assert [mounted(services["prometheus"], path) for path in rule_files] == [RULES_PATH]


def test_promtool_accepts_the_config_and_its_rules() -> None:
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", str(COMPOSE_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_rule_file_is_the_prometheus_rule_spec() -> None:
    assert yaml.safe_load(RULES_PATH.read_text()) == prometheus_rule_spec()


def test_rule_file_is_up_to_date() -> None:
    rules = load_script(COMPOSE_DIR / "rules.py")
    assert rules.render(CR_PATH.read_text()) == RULES_PATH.read_text(), (
        "deploy/compose/rules.yaml is stale: run python deploy/compose/rules.py"
    )


def test_rule_extraction_keeps_comments_and_stops_at_the_next_key() -> None:
    rules = load_script(COMPOSE_DIR / "rules.py")
    manifest = (
        "kind: PrometheusRule\nspec:\n  groups:\n    # why\n    - name: g\n      rules:\n"
        "        - alert: A\n          expr: >-\n            up\n            == 0\n"
        "status:\n  groups: []\n"
    )
    text = rules.render(manifest)
    assert "\n  # why\n" in text and "status" not in text
    assert yaml.safe_load(text) == {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]}


def test_grafana_provisions_the_data_source_the_dashboard_asks_for(services: dict[str, Service]) -> None:
    folder = mounted(services["grafana"], "/etc/grafana/provisioning/datasources")
    sources = [
        source
        for path in sorted(folder.glob("*.yaml"))
        for source in yaml.safe_load(path.read_text())["datasources"]
    ]
    variables = {variable["name"]: variable for variable in load_dashboard()["templating"]["list"]}
    # The dashboard's data source variable defaults to the default data source of its type.
    (default,) = [source for source in sources if source.get("isDefault")]
    assert default["type"] == variables["datasource"]["query"] == "prometheus"
    address = re.fullmatch(r"http://([\w-]+):(\d+)", default["url"])
    assert address, default["url"]
    host, port = address.groups()
    assert host in services and services[host]["ports"][0].endswith(f":{port}")


def test_grafana_provisions_the_project_dashboard(services: dict[str, Service]) -> None:
    grafana = services["grafana"]
    folder = mounted(grafana, "/etc/grafana/provisioning/dashboards")
    providers = [
        provider
        for path in sorted(folder.glob("*.yaml"))
        for provider in yaml.safe_load(path.read_text())["providers"]
    ]
    dashboards = [
        mounted(grafana, PurePosixPath(provider["options"]["path"]) / DASHBOARD_PATH.name)
        for provider in providers
    ]
    assert dashboards == [DASHBOARD_PATH]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted(grafana, home) == DASHBOARD_PATH


def test_docs_run_only_compose_files_that_exist() -> None:
    texts = [
        *(path for path in REPO_ROOT.glob("*") if path.suffix in DOC_SUFFIXES),
        *(
            path
            for top in ("deploy", "docs", "examples", "scripts")
            for path in (REPO_ROOT / top).rglob("*")
            if path.suffix in DOC_SUFFIXES
        ),
    ]
    named = {file for text in texts for file in re.findall(r"docker compose -f ([\w./-]+)", text.read_text())}
    assert "deploy/compose.yaml" in named
    assert all((REPO_ROOT / file).is_file() for file in named), named
