"""docker-compose.yml runs only commands the CLI has, and scales its worker."""

from __future__ import annotations

import shlex

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
    commands = {name: s["command"] for name, s in services.items() if "command" in s}
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
