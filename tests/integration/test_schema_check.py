"""`recallq api` and `recallq worker` on a database whose schema is missing or older than this
recallq's: one line naming the revision and `recallq migrate`, exit 2, no traceback (the API
answered 500 to every request, and a worker logged a traceback every 10 s). Once migrated,
both start. On a database that does not exist or cannot be reached: one line saying so, exit
2, before "ready." (a worker started anyway, heart-beat, took messages only to hand them back
and logged a traceback every 10 s). Real Postgres (a throwaway database), real processes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from alembic.script import ScriptDirectory

from recallq.state import migrate
from tests.integration.secured import recallq
from tests.services import PG_ADMIN_URL, PostgresDatabase, free_port, start_api, start_worker

COMMANDS = [["api", "--port", "0"], ["worker", "--processes", "2", "--concurrency", "1"]]


@pytest.fixture()
def database() -> Iterator[str]:
    with PostgresDatabase() as created:
        yield created.url


def _env(service_env: dict[str, str], url: str) -> dict[str, str]:
    return {**service_env, "RECALLQ_DATABASE_URL": url}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_database_that_does_not_exist_is_one_line(
    service_env: dict[str, str], command: list[str]
) -> None:
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    done = recallq(_env(service_env, f"{base}/recallq_never_created"), *command, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("recallq: cannot use the database "), line
    assert 'database "recallq_never_created" does not exist' in line
    assert "create it, then run `recallq migrate`" in line
    assert "ready" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_database_that_cannot_be_reached_is_one_line(
    service_env: dict[str, str], command: list[str]
) -> None:
    nobody = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/recallq"
    done = recallq(_env(service_env, nobody), *command, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"recallq: cannot use the database {nobody}: "), line
    assert "Connection refused" in line and "Traceback" not in done.stderr
    assert "ready" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", [["api", "--port", "0"], ["worker", "--concurrency", "1"]])
def test_a_database_without_the_schema_is_one_line(
    service_env: dict[str, str], database: str, command: list[str]
) -> None:
    done = recallq(_env(service_env, database), *command, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("recallq: the database has no recallq schema")
    assert "run `recallq migrate` first" in line and "Traceback" not in done.stderr


def test_an_older_schema_names_both_revisions_and_migrating_mends_it(
    service_env: dict[str, str], database: str
) -> None:
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    head = scripts.get_revision(str(scripts.get_current_head()))
    older = str(head.down_revision)
    migrate.upgrade(database, older)
    env = _env(service_env, database)
    for command in (["api", "--port", "0"], ["worker", "--concurrency", "1"]):
        done = recallq(env, *command, timeout=60)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"schema is at revision {older}, this recallq needs {head.revision}" in done.stderr
    migrated = recallq(env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"upgraded the schema from revision {older}" in migrated.stdout
    api, url = start_api(env)
    worker = start_worker(env, concurrency=1)
    try:
        assert httpx.get(f"{url}/v1/runs").status_code == 200
    finally:
        worker.stop()
        api.stop()
