"""Usage of answered calls is counted once whatever befalls its write: a refused write still
counts it, a charge kept through an outage is written once however often it is flushed.
SQLite at the head revision (the integration tests do the same with real outages:
tests/integration/test_usage_kept.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy import func, select

from recallq.core.outcomes import Skipped, SkipReason, Stage, Taken
from recallq.core.scoring import Outcome
from recallq.core.usage import Usage
from recallq.runs.ingest import build_spec, create_run
from recallq.settings import Settings
from recallq.state.db import Database
from recallq.state.items import ItemStore
from recallq.state.migrate import upgrade
from recallq.state.runs import stores_for
from recallq.state.tables import Item, UsageCharge
from recallq.state.usage_spool import Charge, UsageSpool

USED = Usage(llm_calls=1, prompt_tokens=100, completion_tokens=20, cost_usd=0.5, call_attempts=1)


@pytest.fixture()
def db(tmp_path) -> Iterator[Database]:
    url = "sqlite:///" + str(tmp_path / "t.db")
    upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def _item(db: Database) -> tuple[ItemStore, int]:
    """An item released to the queue, and the item store (its spool in memory)."""
    settings = Settings(database_url=db.url)
    items, runs = stores_for(db, settings)
    spec = build_spec(model="local/lexical", known_models=["local/lexical"])
    with db.session() as session:
        run_id = create_run(
            session, runs, spec, [{"ground_truth": "a. b.", "context": ["a"]}], settings
        ).id
    assert runs.release_window(run_id)
    with db.session() as session:
        return items, session.scalars(select(Item.id).where(Item.run_id == run_id)).one()


def _usage(db: Database, item_id: int) -> tuple[int, int, int]:
    with db.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        return item.llm_calls, item.prompt_tokens, item.extraction_calls


def _charges(db: Database) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(UsageCharge)) or 0


def _taken(items: ItemStore, item_id: int, owner: str) -> Taken:
    taken = items.take(item_id, owner, lambda holder: False)  # no holder is alive
    assert isinstance(taken, Taken)
    return taken


def test_a_refused_write_still_counts_its_usage(db: Database) -> None:
    items, item_id = _item(db)
    stale = _taken(items, item_id, "w1/a")
    current = _taken(items, item_id, "w2/b")  # taken over: w1 was taken for dead
    outcome = Outcome(1.0, 1, 1, "ok")

    refused = items.succeed(stale, outcome, USED, Stage.ATTRIBUTION)
    assert refused == Skipped(SkipReason.NOT_OWNED)
    assert _usage(db, item_id) == (1, 100, 0)  # counted, though nothing else was written
    items.succeed(current, outcome, USED, Stage.ATTRIBUTION)
    assert _usage(db, item_id) == (2, 200, 0)  # both calls were billed

    items.save_claims(stale, ["a"], USED, cache_hit=False, cache_key="k" * 64)
    assert _usage(db, item_id) == (3, 300, 1)  # extraction's, counted as extraction's


def test_a_kept_charge_is_written_once_however_often_it_is_flushed(db: Database) -> None:
    items, item_id = _item(db)
    charge = Charge.new(item_id, "run", Stage.EXTRACTION, USED)
    items.spool.keep(charge)
    assert items.write_spooled() == 1
    assert items.write_spooled() == 0  # nothing left
    assert _usage(db, item_id) == (1, 100, 1)

    # the same charge again: a flush whose commit was lost, another copy of it (Redis's)
    items.spool.keep(Charge.from_json(charge.to_json()))
    assert items.write_spooled() == 1
    assert _usage(db, item_id) == (1, 100, 1) and _charges(db) == 1


def test_charges_stay_kept_while_they_cannot_be_written(db: Database) -> None:
    items, item_id = _item(db)
    spool = UsageSpool()
    spool.keep(Charge.new(item_id, "run", Stage.ATTRIBUTION, USED))

    def down(charges: Sequence[Charge]) -> None:
        raise ConnectionError("the database is down")

    with pytest.raises(ConnectionError):
        spool.flush(down)
    assert len(spool.pending()) == 1
    items.charges.spool = spool
    assert items.write_spooled() == 1 and spool.pending() == []
    assert _usage(db, item_id) == (1, 100, 0)


def test_a_charge_of_a_deleted_item_is_dropped(db: Database) -> None:
    items, _ = _item(db)
    items.spool.keep(Charge.new(10**9, "gone", Stage.ATTRIBUTION, USED))
    assert items.write_spooled() == 1 and items.spool.pending() == []
    assert _charges(db) == 0
