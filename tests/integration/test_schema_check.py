"""`recallq api` and `recallq worker` on a database whose schema is missing or older than this
recallq's: one line naming the revision and `recallq migrate`, exit 2, no traceback (the API
answered 500 to every request, and a worker logged a traceback every 10 s). Once migrated,
both start. Real Postgres (a throwaway database), real processes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from alembic.script import ScriptDirectory

from recallq.state import migrate
from tests.integration.secured import recallq
from tests.services import PostgresDatabase, start_api, start_worker


@pytest.fixture()
def database() -> Iterator[str]:
    with PostgresDatabase() as created:
        yield created.url


def _env(service_env: dict[str, str], url: str) -> dict[str, str]:
    return {**service_env, "RECALLQ_DATABASE_URL": url}


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
