"""`recallq migrate`: alembic upgrade head (or downgrade) on the configured database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def alembic_config(url: str | None = None) -> Config:
    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The database's schema revision; None when it has no recallq schema yet."""
    from alembic.migration import MigrationContext

    from recallq.state.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def schema_problem(url: str) -> str | None:
    """Why this recallq cannot serve the database's schema, or None: it has no recallq schema
    yet, or an older revision than this recallq's (`recallq migrate` mends both). A revision
    this recallq does not know is let be: a newer recallq migrated it, as a rolling upgrade
    does before it replaces the processes."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
    current = current_revision(url)
    if current is None:
        return f"the database has no recallq schema (this recallq needs revision {head})"
    known = {script.revision for script in scripts.walk_revisions()}
    if current != head and current in known:
        return f"the database's schema is at revision {current}, this recallq needs {head}"
    return None


def upgrade_and_say(url: str) -> str:
    """Upgrade to head, and say what happened: created, upgraded, or already up to date."""
    before = current_revision(url)
    upgrade(url)
    after = current_revision(url)
    if before is None:
        return f"created the schema (revision {after})"
    if before != after:
        return f"upgraded the schema from revision {before} to {after}"
    return f"the schema is up to date (revision {after})"
