"""Alembic from empty to head and back, on Postgres and on SQLite; the schema matches the models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from recallq.state import migrate
from recallq.state.tables import Base
from tests.launcher import run_recallq
from tests.services import PostgresDatabase

TABLES = {
    "runs",
    "items",
    "claims",
    "claim_cache",
    "kept_views",
    "api_keys",
    "provider_batches",
    "batch_lines",
    "claim_labels",
    "label_samples",
    "broker_epoch",
    "usage_charges",
}


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_database(request, tmp_path: Path) -> Iterator[str]:
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


def test_0004_keeps_existing_items_and_adds_their_metadata(empty_database: str) -> None:
    from sqlalchemy import text

    migrate.upgrade(empty_database, "0001")
    engine = create_engine(empty_database)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO runs (id, project, model, scale, status, total_items, created_at) "
                "VALUES ('r', 'default', 'local/lexical', 1, 'completed', 1, '2026-11-30')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO items (run_id, idx, key, contexts, status, attempts, llm_calls, "
                "prompt_tokens, completion_tokens, cost_usd, cache_hits) "
                "VALUES ('r', 0, 'q1', '[]', 'succeeded', 1, 0, 0, 0, 0, 0)"
            )
        )
    migrate.upgrade(empty_database)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key, metadata FROM items")).all() == [("q1", None)]
    engine.dispose()
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert migrate.current_revision(empty_database) == head


def test_recallq_migrate_says_created_then_up_to_date_and_hides_the_password(
    tmp_path: Path,
) -> None:
    import os
    import subprocess

    def recallq_migrate(url: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
        return run_recallq(["migrate"], env={**env, "RECALLQ_DATABASE_URL": url})

    url = f"sqlite:///{tmp_path / 'm.db'}"
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    first = recallq_migrate(url)
    assert first.returncode == 0 and f"created the schema (revision {head})" in first.stdout
    migrate.downgrade(url, "0001")
    upgraded = recallq_migrate(url)
    assert f"upgraded the schema from revision 0001 to {head}" in upgraded.stdout
    again = recallq_migrate(url)
    assert f"the schema is up to date (revision {head})" in again.stdout

    with PostgresDatabase() as database:
        missing = database.url.replace("postgres@", "postgres:hunter2@") + "_nothere"
        failed = recallq_migrate(missing)
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert "hunter2" not in failed.stderr and "postgres:***@" in failed.stderr
    assert "does not exist; create it first" in failed.stderr


def test_0012_backfills_cited_precision_from_stored_citations(empty_database: str) -> None:
    from sqlalchemy import text

    migrate.upgrade(empty_database, "0011")
    engine = create_engine(empty_database)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO runs (id, project, model, scale, status, total_items, created_at, "
                "context) VALUES ('r', 'default', 'local/lexical', 2, 'completed', 4, "
                "'2026-11-30', '[\"static a\", \"static b\"]')"
            )
        )
        items = [  # id, key, ground truth, own contexts (null: the run's), status
            (1, "interleaved", "g", '["j", "r", "j", "r"]', "succeeded"),
            (2, "static", "g", None, "succeeded"),
            (3, "no-context", "g", "[]", "succeeded"),
            (4, "no-ground-truth", None, '["r"]', "succeeded"),
            (5, "failed", "g", '["r"]', "failed"),
        ]
        for item_id, key, truth, contexts, status in items:
            conn.execute(
                text(
                    "INSERT INTO items (id, run_id, idx, key, ground_truth, contexts, status, "
                    "attempts, llm_calls, prompt_tokens, completion_tokens, cost_usd, "
                    "cache_hits) VALUES (:id, 'r', :id, :key, :truth, :contexts, :status, "
                    "1, 0, 0, 0, 0, 0)"
                ),
                {
                    "id": item_id,
                    "key": key,
                    "truth": truth,
                    "contexts": contexts,
                    "status": status,
                },
            )
        claims = [  # item, idx, verdict, context_indices
            (1, 0, "yes", "[1]"),
            (1, 1, "yes", "[3, 1]"),
            (1, 2, "no", "[]"),
            (2, 0, "yes", "[0]"),
            (5, 0, "yes", "[0]"),
        ]
        for item_id, idx, verdict, indices in claims:
            conn.execute(
                text(
                    "INSERT INTO claims (item_id, idx, text, verdict, context_indices) "
                    "VALUES (:item, :idx, 'c', :verdict, :indices)"
                ),
                {"item": item_id, "idx": idx, "verdict": verdict, "indices": indices},
            )
    migrate.upgrade(empty_database, "0012")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT key, context_precision, first_relevant_rank, passages FROM items "
                "ORDER BY id"
            )
        ).all()
        mode = conn.execute(text("SELECT precision FROM runs")).scalar()
    engine.dispose()
    found = {
        key: (cp, rank, json.loads(p) if isinstance(p, str) else p) for key, cp, rank, p in rows
    }
    assert mode == "cited"
    cp, rank, passages = found["interleaved"]
    assert cp == 1.0 and rank == 2  # scale 2: (1/2 + 2/4) / 2 × 2
    assert [p["relevant"] for p in passages] == [False, True, False, True]
    assert [p["claims"] for p in passages] == [[], [0, 1], [], [1]]
    assert found["static"][:2] == (2.0, 1)  # the run's static context, relevant first
    for key in ("no-context", "no-ground-truth", "failed"):
        assert found[key] == (None, None, None), key
