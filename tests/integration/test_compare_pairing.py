"""Two runs compared in the database (comparisons.compare_runs: the items paired, the pairs
counted by their scores, the largest changes, the flipped claims counted by a join on their
text) give exactly what recallq.core.compare computes from every item and claim in memory, on
Postgres and on SQLite: random runs with items in one run only, items not scored, ties,
claims that differ in text, claims said twice, claims with no verdict, metadata with and
without the field."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from recallq.core import compare as ab
from recallq.runs import comparisons
from recallq.state import migrate
from recallq.state.db import Database
from recallq.state.tables import Claim, Item, Run

SCORES = (0.0, 0.33, 0.5, 0.67, 1.0)
TEXTS = ("Paris is in France.", "The Seine is a river.", "Lyon has old streets.", "Nice is sunny.")
# keys whose code point order is not their order in most collations
KEYS = ("q", "Q", "é", "e", "Z", "z", "ä", "q_1", "q-1", "10", "9")


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'compare.db'}"
        migrate.upgrade(url)
    else:
        url = request.getfixturevalue("pg_database")
    database = Database(url)
    yield database
    database.dispose()


def _run_items(rng: random.Random, keys: list[str]) -> list[dict[str, Any]]:
    items = []
    for key in keys:
        status = rng.choices(["succeeded", "failed", "pending"], [8, 1, 1])[0]
        claims = []
        for text in rng.sample(TEXTS, rng.randrange(len(TEXTS) + 1)):
            if rng.random() < 0.1:
                text = text.upper()  # a claim the other run words differently
            claims.append((text, rng.choice(["yes", "no", "yes", None])))
        if claims and rng.random() < 0.1:
            claims.append((claims[0][0], rng.choice(["yes", "no"])))  # said twice
        metadata = rng.choice(
            [None, {}, {"topic": "a"}, {"topic": "b"}, {"topic": 3}, {"topic": None}]
        )
        items.append(
            {
                "key": key,
                "status": status,
                "score": rng.choice(SCORES) if status == "succeeded" else None,
                "claims": claims,
                "metadata": metadata,
            }
        )
    return items


def _two_runs(seed: int, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    keys = [f"k{i}" for i in range(n)] + [f"{k}{i}" for i, k in enumerate(KEYS)]
    rng.shuffle(keys)
    base_keys = [k for k in keys if rng.random() < 0.95]
    candidate_keys = [k for k in keys if rng.random() < 0.95]
    return _run_items(rng, base_keys), _run_items(rng, candidate_keys)


def _store(database: Database, items: list[dict[str, Any]]) -> Run:
    run_id = str(uuid.uuid4())
    with database.session() as session:
        session.add(Run(id=run_id, model="stub", scale=1.0, status="completed"))
        session.flush()
        session.execute(
            insert(Item),
            [
                {
                    "run_id": run_id,
                    "idx": i,
                    "key": item["key"],
                    "status": item["status"],
                    "score": item["score"],
                    "item_metadata": item["metadata"],
                }
                for i, item in enumerate(items)
            ],
        )
        rows = session.execute(select(Item.key, Item.id).where(Item.run_id == run_id))
        ids = {key: item_id for key, item_id in rows}
        claims = [
            {"item_id": ids[item["key"]], "idx": j, "text": text, "verdict": verdict}
            for item in items
            for j, (text, verdict) in enumerate(item["claims"])
        ]
        if claims:
            session.execute(insert(Claim), claims)
    with database.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        session.expunge(run)
    return run


def _in_memory(items: list[dict[str, Any]]) -> list[ab.ItemScores]:
    return [
        ab.ItemScores(
            item["key"],
            item["score"] if item["status"] == "succeeded" else None,
            [(text, verdict) for text, verdict in item["claims"] if verdict is not None],
            item["metadata"],
        )
        for item in items
    ]


@pytest.mark.parametrize(
    ("seed", "n", "by", "top"),
    [
        (1, 150, None, 10),  # the bootstrap interval
        (2, 150, "topic", 500),  # every change listed
        (3, 40, "topic", 0),
        (4, ab.BOOTSTRAP_MAX_PAIRS + 300, "topic", 25),  # the normal interval
    ],
)
def test_the_database_pairs_as_the_pure_comparison_does(
    database: Database, seed: int, n: int, by: str | None, top: int
) -> None:
    base_items, candidate_items = _two_runs(seed, n)
    base, candidate = _store(database, base_items), _store(database, candidate_items)
    expected = ab.compare(
        _in_memory(base_items), _in_memory(candidate_items), scale=1.0, top=top, by=by
    )
    assert expected["unmatched"]["base_only"] and expected["unmatched"]["unscored"]
    assert expected["claims_flipped"]["no_to_yes"] and expected["claims_flipped"]["yes_to_no"]
    with database.session() as session:
        found = comparisons.compare_runs(session, base, candidate, by=by, top=top, pairs=7)
    sample = found.pop("pairs")
    del found["base_run"], found["candidate_run"]
    assert found.pop("precision")["paired"] == 0  # these items have no context precision
    assert found == expected
    scored = {i["key"]: i["score"] for i in candidate_items if i["status"] == "succeeded"}
    every_pair = sorted(
        (i["key"], i["score"], scored[i["key"]])
        for i in base_items
        if i["status"] == "succeeded" and i["key"] in scored
    )
    assert len(every_pair) == found["matched"]
    assert sample == [every_pair[p] for p in ab.even_positions(len(every_pair), 7)]


def test_ties_of_the_largest_changes_go_by_key_in_code_point_order(database: Database) -> None:
    keys = ["b", "B", "é", "e", "Z", "a", "à"]
    base_items: list[dict[str, Any]] = [
        {"key": k, "status": "succeeded", "score": 0.0, "claims": [], "metadata": None}
        for k in keys
    ]
    candidate_items = [{**item, "score": 1.0} for item in base_items]
    base, candidate = _store(database, base_items), _store(database, candidate_items)
    with database.session() as session:
        found = comparisons.compare_runs(session, base, candidate, top=4, pairs=len(keys))
    assert [c["key"] for c in found["largest_changes"]] == sorted(keys)[:4]
    assert [p[0] for p in found["pairs"]] == sorted(keys)
