"""`recallq migrate --check [--wait SECONDS]`: what a process about to serve the database asks
first, changing nothing (the wait-for-migrations init containers of deploy/kubernetes). Exit 0
once the schema is one this recallq serves; exit 2 with one line naming the revision and
`recallq migrate` otherwise; with `--wait`, asked again until a migration running elsewhere
ends. A real throwaway Postgres database, the command run in this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from alembic.script import ScriptDirectory

from recallq.cli import main
from recallq.state import migrate
from tests.services import PostgresDatabase


@pytest.fixture()
def database(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with PostgresDatabase() as created:
        monkeypatch.setenv("RECALLQ_DATABASE_URL", created.url)
        yield created.url


def _head() -> str:
    return str(ScriptDirectory.from_config(migrate.alembic_config()).get_current_head())


def test_check_changes_nothing_and_says_what_is_missing(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--check"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("recallq: the database has no recallq schema")
    assert line.endswith("run `recallq migrate` first")
    assert migrate.current_revision(database) is None  # nothing was created

    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    previous = str(scripts.get_revision(_head()).down_revision)
    migrate.upgrade(database, previous)
    assert main(["migrate", "--check"]) == 2
    assert f"schema is at revision {previous}, this recallq needs {_head()}" in (
        capsys.readouterr().err
    )
    assert migrate.current_revision(database) == previous  # still: --check upgrades nothing

    migrate.upgrade(database)
    assert main(["migrate", "--check"]) == 0
    assert f"the schema is ready (revision {_head()})" in capsys.readouterr().out


def test_wait_returns_once_a_migration_elsewhere_ends(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrating = threading.Timer(3.0, migrate.upgrade, args=(database,))
    migrating.start()
    try:
        assert main(["migrate", "--check", "--wait", "60"]) == 0
    finally:
        migrating.join()
    captured = capsys.readouterr()
    assert captured.err.count("recallq: waiting: the database has no recallq schema") == 1
    assert f"the schema is ready (revision {_head()})" in captured.out


def test_wait_ends_with_the_reason_at_its_deadline(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--check", "--wait", "1"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("recallq: the database has no recallq schema")


def test_an_unreachable_database_is_waited_for_then_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.services import free_port

    url = f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{free_port()}/none"
    monkeypatch.setenv("RECALLQ_DATABASE_URL", url)
    assert main(["migrate", "--check", "--wait", "1"]) == 2
    err = capsys.readouterr().err
    assert "waiting: the database is not reachable (OperationalError)" in err
    assert err.strip().splitlines()[-1].startswith("recallq: cannot use the database")
    assert "hunter2" not in err and "Traceback" not in err


def test_wait_without_check_and_check_with_downgrade_are_refused(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--wait", "5"]) == 2
    assert "--wait goes with --check" in capsys.readouterr().err
    assert migrate.current_revision(database) is None  # it did not migrate either
    with pytest.raises(SystemExit) as exited:
        main(["migrate", "--check", "--downgrade", "base"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
