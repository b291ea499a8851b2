"""Alembic from empty to head and back, on Postgres and on SQLite; the schema matches the models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from recallq import migrate
from recallq.models import Base
from tests.services import PostgresDatabase

TABLES = {"runs", "items", "claims", "claim_cache", "api_keys"}


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_database(request, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'migrations.db'}"
        return
    with PostgresDatabase() as database:
        yield database.url


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_to_head_matches_models_then_downgrade(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    assert _tables(empty_database) == TABLES
    engine = create_engine(empty_database)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []

    migrate.downgrade(empty_database, "base")
    assert _tables(empty_database) == set()

    migrate.upgrade(empty_database)  # and up again
    assert _tables(empty_database) == TABLES
