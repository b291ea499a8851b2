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
