"""recallq.db on real Postgres: a single statement commits on its own, and the autocommit it
runs in never leaks into the pooled connection's next transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from recallq import db


@pytest.fixture()
def scratch(pg_database: str) -> Iterator[str]:
    db.dispose_engines()
    with db.transaction(pg_database) as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS scratch_db_test (v int)"))
        conn.execute(text("DELETE FROM scratch_db_test"))
    yield pg_database
    with db.transaction(pg_database) as conn:
        conn.execute(text("DROP TABLE scratch_db_test"))
    db.dispose_engines()


def _values_seen_elsewhere(url: str) -> list[int]:
    engine = create_engine(url)
    with engine.connect() as conn:
        values = list(conn.execute(text("SELECT v FROM scratch_db_test ORDER BY v")).scalars())
    engine.dispose()
    return values


def test_a_single_statement_is_committed_on_its_own(scratch: str) -> None:
    with db.single_statement(scratch) as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (1)"))
        assert _values_seen_elsewhere(scratch) == [1]  # visible before the block even ends


def test_the_next_transaction_on_that_connection_still_rolls_back(scratch: str) -> None:
    with db.single_statement(scratch) as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (1)"))
    assert db.get_engine(scratch).pool.checkedin() == 1  # the next block reuses it

    with pytest.raises(RuntimeError), db.transaction(scratch) as conn:
        conn.execute(text("INSERT INTO scratch_db_test VALUES (2)"))
        conn.execute(text("INSERT INTO scratch_db_test VALUES (3)"))
        raise RuntimeError("fails half-way")

    assert _values_seen_elsewhere(scratch) == [1]
