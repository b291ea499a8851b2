"""recallq.state.migrate knows the newest migration without loading alembic (SCHEMA_HEAD), so a
database already at it is used as it is (tests/e2e/test_startup.py: no alembic is imported);
one behind it is upgraded by alembic."""

from __future__ import annotations

from pathlib import Path

from alembic.script import ScriptDirectory

from recallq.state import migrate


def test_the_schema_head_is_the_newest_migration() -> None:
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    assert scripts.get_current_head() == migrate.SCHEMA_HEAD, (
        "a migration was added: set recallq.state.migrate.SCHEMA_HEAD to its revision"
    )


def test_a_database_behind_the_head_is_upgraded_and_one_at_it_is_left_as_it_is(
    tmp_path: Path,
) -> None:
    path = tmp_path / "local.db"
    url = f"sqlite:///{path}"
    assert migrate.current_revision(url) is None
    migrate.upgrade(url)
    assert migrate.current_revision(url) == migrate.SCHEMA_HEAD
    previous = ScriptDirectory.from_config(migrate.alembic_config()).get_revision(
        migrate.SCHEMA_HEAD
    )
    assert previous is not None and isinstance(previous.down_revision, str)
    migrate.downgrade(url, previous.down_revision)
    assert migrate.current_revision(url) == previous.down_revision
    migrate.upgrade(url)
    assert migrate.current_revision(url) == migrate.SCHEMA_HEAD
