"""`recallq migrate`: alembic upgrade head (or downgrade) on the configured database.

Alembic is imported only to migrate (about 0.3 s of CPU): a database already at this recallq's
revision is told apart by reading its alembic_version row with SQLAlchemy, so `recallq run`
and the client commands on a local database do not load it each time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config

#: The newest migration's revision (migrations/versions/): what `upgrade()` brings a database
#: to. tests/migrations/test_schema_head.py checks it is alembic's head.
SCHEMA_HEAD = "0012"


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    if revision == "head" and url is not None and _at_head(url):
        return
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    """The database's schema revision; None when it has no recallq schema yet."""
    from sqlalchemy import inspect, text

    from recallq.state.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            found = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
            return ",".join(sorted(found)) or None
    finally:
        engine.dispose()


def _at_head(url: str) -> bool:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return current_revision(url) == SCHEMA_HEAD
    except SQLAlchemyError:  # not reachable, say: alembic tries and says why
        return False


def schema_problem(url: str) -> str | None:
    """Why this recallq cannot serve the database's schema, or None: it has no recallq schema
    yet, or an older revision than this recallq's (`recallq migrate` mends both). A revision
    this recallq does not know is let be: a newer recallq migrated it, as a rolling upgrade
    does before it replaces the processes."""
    current = current_revision(url)
    if current == SCHEMA_HEAD:
        return None
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
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
