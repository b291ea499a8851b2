"""recallq.state.db on real Postgres: a single statement commits on its own, and the autocommit it
runs in never leaks into the pooled connection's next transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import QueuePool

from recallq.state.db import Database


@pytest.fixture()
def scratch(pg_database: str) -> Iterator[Database]:
    database = Database(pg_database)
    with database.transaction() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS scratch_db_test (v int)"))
        conn.execute(text("DELETE FROM scratch_db_test"))
    yield database
    with database.transaction() as conn:
        conn.execute(text("DROP TABLE scratch_db_test"))
    database.dispose()


def _values_seen_elsewhere(url: str) -> list[int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        values = list(conn.execute(text("SELECT v FROM scratch_db_test ORDER BY v")).scalars())
    engine.dispose()
    return values


def test_a_single_statement_is_committed_on_its_own(scratch: Database) -> None:
    with scratch.single_statement() as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (1)"))
        assert _values_seen_elsewhere(scratch.url) == [1]  # visible before the block even ends


def test_the_next_transaction_on_that_connection_still_rolls_back(scratch: Database) -> None:
    with scratch.single_statement() as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (1)"))
    pool = scratch.engine.pool
    assert isinstance(pool, QueuePool) and pool.checkedin() == 1  # the next block reuses it

    with pytest.raises(RuntimeError), scratch.transaction() as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (2)"))
        conn.execute(text("INSERT INTO scratch_db_test VALUES (3)"))
        raise RuntimeError("fails half-way")

    assert _values_seen_elsewhere(scratch.url) == [1]
