"""docker-compose.yml runs only commands the CLI has, and scales its worker."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from recallq.cli import build_parser
from tests.services import REPO


def _subcommands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return set(sub.choices or ())


def test_every_compose_command_is_a_recallq_command() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    parser = build_parser()
    # the services built from this repository; Prometheus runs its own image
    commands = {name: s["command"] for name, s in services.items() if "build" in s}
    assert {"migrate", "api", "worker"} <= set(commands)
    for name, command in commands.items():
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        assert argv[0] == "recallq", name
        assert argv[1] in _subcommands(), name
        parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown option


def test_worker_scales_and_services_are_healthchecked() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["redis"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_contract_commands_exist() -> None:
    assert {"run", "api", "worker", "migrate", "submit", "status", "results"} <= _subcommands()


def test_no_open_api_and_no_password_in_the_file() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    for port in services["api"]["ports"]:
        assert str(port).startswith("127.0.0.1:"), port
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${POSTGRES_PASSWORD"), password
    url = compose["x-recallq-env"]["RECALLQ_DATABASE_URL"]
    assert ":${POSTGRES_PASSWORD" in url
    secret = compose["x-recallq-env"]["RECALLQ_SESSION_SECRET"]  # web sessions: not forgeable
    assert secret.startswith("${RECALLQ_SESSION_SECRET:?"), secret  # from a copy of the keys
    for service in services.values():  # keys required: the default, nowhere turned off
        assert "RECALLQ_AUTH" not in (service.get("environment") or {})
    assert "RECALLQ_AUTH" not in compose["x-recallq-env"]
    assert "recallq keys create" in text  # says how to make the first key


def test_prometheus_scrapes_the_api_with_its_token_and_every_worker(tmp_path) -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    prometheus = services["prometheus"]
    assert "metrics_token" in prometheus["secrets"]
    assert compose["secrets"]["metrics_token"] == {"environment": "RECALLQ_METRICS_TOKEN"}
    assert compose["x-recallq-env"]["RECALLQ_METRICS_TOKEN"].startswith("${RECALLQ_METRICS_TOKEN:?")
    assert all(str(port).startswith("127.0.0.1:") for port in prometheus["ports"])
    worker = build_parser().parse_args(shlex.split(services["worker"]["command"])[1:])
    assert worker.metrics_port == 9100 and "healthcheck" in services["worker"]
    assert worker.processes == 2  # stated, not the container's CPUs: one port serves both
    assert f"127.0.0.1:{worker.metrics_port}/metrics" in " ".join(
        services["worker"]["healthcheck"]["test"]
    )
    config = yaml.safe_load((REPO / "examples" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api = jobs["recallq-api"]
    assert api["authorization"]["credentials_file"] == "/run/secrets/metrics_token"
    assert api["static_configs"][0]["targets"] == ["api:8000"]
    (workers,) = jobs["recallq-workers"]["dns_sd_configs"]
    assert workers["names"] == ["worker"] and workers["port"] == worker.metrics_port
    # Debian's promtool (package prometheus) on the same file, the secret's path made local
    token = tmp_path / "token"
    token.write_text("t")
    local = tmp_path / "prometheus.yml"
    text = (REPO / "examples" / "prometheus.yml").read_text()
    local.write_text(text.replace("/run/secrets/metrics_token", str(token)))
    checked = subprocess.run(
        ["/usr/bin/promtool", "check", "config", str(local)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _dependencies(compose: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every `depends_on` entry of the long form, over all services."""
    for service in compose["services"].values():
        if isinstance(service.get("depends_on"), dict):
            yield from service["depends_on"].values()


#: Compose file features and the first Docker Compose that runs them as this file needs
#: (docker/compose's release notes and history), each with how to find it in a file
COMPOSE_FEATURES: dict[str, tuple[tuple[int, int, int], Callable[[dict[str, Any]], bool]]] = {
    # 2.6.1 reads a secret from an environment variable, but writes it mode 0400, root's only,
    # until 2.20.0 (fd0e0a2): Prometheus's image runs as nobody
    "a secret from an environment variable, read by a non-root service": (
        (2, 20, 0),
        lambda f: any("environment" in s for s in (f.get("secrets") or {}).values()),
    ),
    "depends_on: condition: service_completed_successfully": (
        (2, 0, 0),
        lambda f: any(
            d.get("condition") == "service_completed_successfully" for d in _dependencies(f)
        ),
    ),
    "depends_on: restart": ((2, 17, 0), lambda f: any("restart" in d for d in _dependencies(f))),
    "depends_on: required": ((2, 20, 2), lambda f: any("required" in d for d in _dependencies(f))),
    "top-level include": ((2, 20, 0), lambda f: "include" in f),
    "develop: watch": ((2, 22, 0), lambda f: any("develop" in s for s in f["services"].values())),
}


def test_the_file_states_the_compose_it_needs_and_the_docs_agree() -> None:
    """Compose 2.20.0 or later, as the file's header says, for the reason it gives: a newcomer
    with an older Compose met a Prometheus that could not read its token (issue 28)."""
    text = (REPO / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    stated = re.search(r"^# Needs Docker Compose (\d+)\.(\d+)\.(\d+) or later", text, re.M)
    assert stated is not None, "the header says which Docker Compose the file needs"
    version = tuple(int(part) for part in stated.groups())
    used = {name: needs for name, (needs, found) in COMPOSE_FEATURES.items() if found(compose)}
    assert used, "the features this file uses are in COMPOSE_FEATURES"
    assert version == max(used.values()), used  # no less than it needs, and no more
    shown = ".".join(map(str, version))
    assert f"Docker Compose {shown} or later" in (REPO / "docs" / "deploy.md").read_text()
    assert "version" not in compose  # obsolete: Compose ignores it, with a warning
