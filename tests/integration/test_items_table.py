"""The items table of the web pages (item_views.items_table) on real Postgres: every filter, order
and page size pages through exactly the items a plain filter of all items gives, in order; a
text filter looks through a bounded number of items per page and says where it stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from recallq.runs import item_views
from recallq.state.db import Database
from recallq.state.tables import Run
from tests.launcher import run_recallq
from tests.services import REPO

FACTS = ["Paris is in France.", "The Seine is a river.", "Lyon has old streets."]


def _items() -> list[dict[str, Any]]:
    """Scores 0, 0.33, 0.67 and 1 in turn (the lexical judge finds what the context holds)."""
    items = []
    for i in range(40):
        found = i % 4
        truth = " ".join(FACTS)
        if i == 13:
            truth += " A 100%_literal needle."
        items.append({"id": f"q{i}", "ground_truth": truth, "context": FACTS[:found]})
    items.append({"id": "no-truth", "context": ["x"]})
    return items


@pytest.fixture(scope="module")
def scored(pg_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("items-table") / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in _items()))
    env = {"RECALLQ_DATABASE_URL": pg_database, "PATH": "/usr/bin:/bin"}
    done = run_recallq(["run", str(data), "--name", "items-table"], env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    database = Database(pg_database)
    with database.session() as session:
        run_id = session.scalars(select(Run.id).where(Run.name == "items-table")).one()
    database.dispose()
    yield run_id


@pytest.fixture()
def database(pg_database: str) -> Iterator[Database]:
    database = Database(pg_database)
    yield database
    database.dispose()


def _all(database: Database, run_id: str) -> list[dict[str, Any]]:
    with database.session() as session:
        return list(item_views.iter_results(session, run_id, item_data=True))


def _expected(items: list[dict[str, Any]], where: item_views.ItemFilter) -> list[str]:
    chosen = [
        item
        for item in items
        if (where.status is None or item["status"] == where.status)
        if not (where.by_score or where.min_score is not None or where.max_score is not None)
        or item["score"] is not None
        if where.min_score is None or item["score"] >= where.min_score
        if where.max_score is None or item["score"] <= where.max_score
        if not where.text
        or where.text.lower() in item["id"].lower()
        or where.text.lower() in (item["ground_truth"] or "").lower()
    ]
    if where.sort == "score":
        chosen.sort(key=lambda item: (item["score"], item["index"]))
    elif where.sort == "-score":
        chosen.sort(key=lambda item: (-item["score"], item["index"]))
    return [item["id"] for item in chosen]


def _paged(
    database: Database, run_id: str, where: item_views.ItemFilter, limit: int, scan: int
) -> tuple[list[str], int]:
    """Every row, page by page through the cursors (encoded as the page links do), and how
    many pages it took."""
    seen: list[str] = []
    after: item_views.ItemsCursor | None = None
    pages = 0
    while True:
        with database.session() as session:
            table = item_views.items_table(session, run_id, where, limit, after, scan=scan)
        pages += 1
        assert len(table.rows) <= limit
        seen += [row["id"] for row in table.rows]
        if table.cursor is None:
            return seen, pages
        encoded = item_views.encode_items_cursor(table.cursor)
        assert encoded is not None
        after = item_views.decode_items_cursor(encoded)
        assert pages < 100


FILTERS = [
    item_views.ItemFilter(),
    item_views.ItemFilter(sort="score"),
    item_views.ItemFilter(sort="-score"),
    item_views.ItemFilter(status="succeeded", min_score=0.3, max_score=0.7),
    item_views.ItemFilter(min_score=0.5, sort="-score"),
    item_views.ItemFilter(text="SEINE", sort="score"),
    item_views.ItemFilter(text="q1"),
    item_views.ItemFilter(text="100%_lit"),
    item_views.ItemFilter(text="%"),
    item_views.ItemFilter(text="_", sort="-score"),
    item_views.ItemFilter(text="nowhere"),
    item_views.ItemFilter(status="pending"),
]


@pytest.mark.parametrize("where", FILTERS, ids=repr)
@pytest.mark.parametrize(("limit", "scan"), [(7, 10), (200, 20_000)])
def test_pages_hold_exactly_the_filtered_items_in_order(
    database: Database, scored: str, where: item_views.ItemFilter, limit: int, scan: int
) -> None:
    items = _all(database, scored)
    assert {item["score"] for item in items} >= {0.0, 0.33, 0.67, 1.0}
    expected = _expected(items, where)
    seen, pages = _paged(database, scored, where, limit, scan)
    assert seen == expected
    if where.text and scan < len(items):
        # a text filter stops after `scan` items a page, however few of them match
        assert pages >= len(items) // scan


def test_a_text_filter_says_where_it_stopped(database: Database, scored: str) -> None:
    with database.session() as session:
        first = item_views.items_table(
            session, scored, item_views.ItemFilter(text="needle"), 5, scan=10
        )
        assert first.rows == [] and first.searched_to == 9 and first.cursor == (None, 9)
        second = item_views.items_table(
            session, scored, item_views.ItemFilter(text="needle"), 5, first.cursor, scan=10
        )
        assert [row["id"] for row in second.rows] == ["q13"] and second.searched_to == 19
        found = item_views.items_table(session, scored, item_views.ItemFilter(text="q"), 5, scan=10)
        assert len(found.rows) == 5 and found.searched_to is None  # a full page: no notice


def test_a_text_filter_counts_its_matches_within_the_scan_bound(
    database: Database, scored: str
) -> None:
    items = _all(database, scored)
    every_q = len([i for i in items if "q" in i["id"]])
    with database.session() as session:
        exact = item_views.items_table(session, scored, item_views.ItemFilter(text="q"), 5)
        assert (exact.matched, exact.searched, exact.searched_all) == (every_q, len(items), True)
        # a bound smaller than the run: a lower bound over the items searched, never more
        bounded = item_views.items_table(
            session, scored, item_views.ItemFilter(text="q"), 5, scan=10
        )
        assert (bounded.matched, bounded.searched, bounded.searched_all) == (10, 10, False)
        needle = item_views.items_table(
            session, scored, item_views.ItemFilter(text="needle"), 5, scan=10
        )
        assert (needle.matched, needle.searched_all) == (0, False)
        # the next window (after the cursor) counts its own items: q13 is among them
        after = item_views.items_table(
            session, scored, item_views.ItemFilter(text="needle"), 5, needle.cursor, scan=10
        )
        assert (after.matched, after.searched) == (1, 10)
        plain = item_views.items_table(session, scored, item_views.ItemFilter(), 5)
        assert plain.matched is None and plain.searched is None


def test_rows_carry_what_the_table_shows(database: Database, scored: str) -> None:
    with database.session() as session:
        table = item_views.items_table(session, scored, item_views.ItemFilter(sort="-score"), 1)
    (row,) = table.rows
    assert set(row) == {
        "id",
        "index",
        "status",
        "score",
        "claims_total",
        "claims_attributed",
        "error",
        "ground_truth",
        "no_context",
    }
    assert row["score"] == 1.0 and row["claims_attributed"] == row["claims_total"] == 3
    assert len(row["ground_truth"]) <= item_views.TABLE_TEXT
    # items scored without any context are marked (issue 28.7): on Postgres as on SQLite
    with database.session() as session:
        every = item_views.items_table(session, scored, item_views.ItemFilter(), 100).rows
    marked = {row["id"] for row in every if row["no_context"]}
    assert marked == {f"q{i}" for i in range(0, 40, 4)}


def test_cursors_the_table_did_not_make_are_refused() -> None:
    # not base64; [1, -1]; ["x", 1]; null; [1, 2, 3]
    for junk in ("", "%%%", "WzEsIC0xXQ", "WyJ4IiwgMV0", "bnVsbA", "WzEsIDIsIDNd"):
        with pytest.raises(ValueError):
            item_views.decode_items_cursor(junk)
    assert item_views.decode_items_cursor(item_views.encode_items_cursor((0.5, 3)) or "") == (
        0.5,
        3,
    )
