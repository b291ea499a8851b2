"""Views of completed runs are kept (recallq.state.kept, through recallq.runs.run_views), on
Postgres and on SQLite: a completed run's run object, group summary and comparison are computed
once and read back; a retried run that completes again gets its new numbers; active and cancelled
runs are never kept; a run's kept views go with it; a view that cannot be kept is still read."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, false, func, insert, select, text, update

from recallq.core.usage import Usage
from recallq.runs import comparisons, run_views
from recallq.runs.precision_views import PrecisionAggregates
from recallq.state import kept, migrate
from recallq.state.db import Database
from recallq.state.items import ItemStore
from recallq.state.runs import RunStore
from recallq.state.tables import Claim, Item, KeptView, Run, as_utc, utcnow
from tests.services import migrated_database

PROJECT = "default"


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A database of the test's own: the tests count every kept view, and one drops the table."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'kept.db'}"
            migrate.upgrade(url)
        else:
            url = stack.enter_context(migrated_database())
        database = Database(url)
        yield database
        database.dispose()


@pytest.fixture
def runs(database: Database) -> RunStore:
    return RunStore(database, ItemStore(database, 60, 60, 100, 10), 500)


def _store(database: Database, status: str, scores: list[float | None]) -> str:
    """A run of these items (None: a failed item), each with a claim, with `status`."""
    run_id = str(uuid.uuid4())
    ended = status in ("completed", "cancelled")
    with database.session() as session:
        session.add(
            Run(
                id=run_id,
                project=PROJECT,
                model="stub",
                status=status,
                total_items=len(scores),
                finished_at=utcnow() - timedelta(minutes=5) if ended else None,
            )
        )
        session.flush()
        session.execute(
            insert(Item),
            [
                {
                    "run_id": run_id,
                    "idx": i,
                    "key": f"k{i}",
                    "status": "failed" if score is None else "succeeded",
                    "score": score,
                    "error": "boom" if score is None else None,
                    "claims_total": 1,
                    "claims_attributed": 1 if score else 0,
                    "item_metadata": {"topic": "ab"[i % 2]},
                }
                for i, score in enumerate(scores)
            ],
        )
        ids = session.scalars(select(Item.id).where(Item.run_id == run_id)).all()
        session.execute(
            insert(Claim), [{"item_id": i, "idx": 0, "text": "c", "verdict": "yes"} for i in ids]
        )
    return run_id


def _views(database: Database, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's view and its summary by topic."""
    with database.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return run_views.run_view(session, run), comparisons.group_summary(session, run_id, "topic")


def _kept(database: Database, run_id: str | None = None) -> int:
    with database.session() as session:
        query = select(func.count()).select_from(KeptView)
        if run_id is not None:
            query = query.where(KeptView.run_id == run_id)
        return session.scalar(query) or 0


def _tamper(database: Database) -> None:
    """Mark every kept run view, so that a view read back from the table shows it."""
    with database.session() as session:
        for view in session.scalars(select(KeptView)):
            if view.body["shape"] == run_views.RUN_VIEW_SHAPE:
                body = {**view.body["body"], "failures": [{"error": "kept", "count": 0}]}
                view.body = {**view.body, "body": body}


def test_a_completed_runs_views_are_kept_and_read_back(database: Database) -> None:
    run_id = _store(database, "completed", [1.0, 0.5, None, 0.0])
    computed = _views(database, run_id)
    assert _kept(database, run_id) == 2  # the run's aggregates and its summary by topic
    assert _views(database, run_id) == computed
    assert computed[0]["failures"] == [{"error": "boom", "count": 1, "example_id": "k2"}]
    assert computed[0]["summary"]["scored_items"] == 3

    _tamper(database)
    assert _views(database, run_id)[0]["failures"] == [{"error": "kept", "count": 0}]
    with database.session() as session:  # the list reads the same kept view
        listed, _ = run_views.list_runs(session, PROJECT)
    assert listed[0]["failures"] == [{"error": "kept", "count": 0}]


def test_the_runs_list_keeps_completed_runs_only(database: Database) -> None:
    completed = _store(database, "completed", [1.0, None])
    running = _store(database, "running", [0.5])
    cancelled = _store(database, "cancelled", [0.0])
    with database.session() as session:
        listed, _ = run_views.list_runs(session, PROJECT)
    with database.session() as session:
        again, _ = run_views.list_runs(session, PROJECT)
        one_by_one = [run_views.run_view(session, r) for r in session.scalars(select(Run))]
    assert again == listed
    assert sorted(one_by_one, key=lambda v: v["id"]) == sorted(listed, key=lambda v: v["id"])
    assert (_kept(database, completed), _kept(database, running)) == (1, 0)
    assert _kept(database, cancelled) == 0


def test_a_retried_run_that_completes_again_gets_its_new_numbers(
    database: Database, runs: RunStore
) -> None:
    run_id = _store(database, "completed", [1.0, None, None])
    before, groups_before = _views(database, run_id)
    assert before["counts"]["failed"] == 2

    assert runs.retry_failed(run_id, PROJECT) == 2
    retried, _ = _views(database, run_id)
    assert retried["status"] == "running" and retried["counts"]["pending"] == 2
    with database.session() as session:  # the retried items are scored
        session.execute(
            update(Item)
            .where(Item.run_id == run_id, Item.status == "pending")
            .values(status="succeeded", score=0.0, finished_at=utcnow())
        )
    assert runs.complete_if_done(run_id)

    after, groups_after = _views(database, run_id)
    assert after["status"] == "completed"
    assert after["counts"]["failed"] == 0 and after["failures"] == []
    assert after["summary"]["scored_items"] == 3
    assert groups_after != groups_before
    assert _views(database, run_id) == (after, groups_after)  # now kept, the new numbers


def test_active_and_cancelled_runs_are_never_kept(database: Database) -> None:
    completed = _store(database, "completed", [1.0, 0.5])
    for status in ("queued", "running", "cancelled"):
        run_id = _store(database, status, [1.0, None])
        for _ in range(2):
            _views(database, run_id)
            with database.session() as session:
                b, c = session.get(Run, completed), session.get(Run, run_id)
                assert b is not None and c is not None
                comparisons.compare_runs(session, b, c)
                comparisons.compare_runs(session, c, b)
        assert _kept(database, run_id) == 0, status
    assert _kept(database) == 0


def test_a_runs_kept_views_go_with_it(database: Database, runs: RunStore) -> None:
    base = _store(database, "completed", [1.0, 0.5])
    candidate = _store(database, "completed", [0.5, 0.5])
    _views(database, base)
    with database.session() as session:
        b, c = session.get(Run, base), session.get(Run, candidate)
        assert b is not None and c is not None
        comparisons.compare_runs(session, b, c, by="topic")
    assert _kept(database, base) == 3
    runs.delete(candidate, PROJECT)  # its comparison with base goes
    assert _kept(database) == 2
    runs.delete(base, PROJECT)
    assert _kept(database) == 0


def test_a_comparison_kept_equals_a_fresh_one(database: Database) -> None:
    base = _store(database, "completed", [1.0, 0.5, None, 0.0, 1.0])
    candidate = _store(database, "completed", [0.5, 0.5, 1.0, None, 1.0])

    def compare() -> dict[str, Any]:
        with database.session() as session:
            b, c = session.get(Run, base), session.get(Run, candidate)
            assert b is not None and c is not None
            return comparisons.compare_runs(session, b, c, by="topic", top=3, pairs=10)

    first = compare()
    assert _kept(database) == 1
    assert compare() == first
    with database.session() as session:
        session.execute(delete(KeptView))
    assert compare() == first
    assert first["matched"] == 3 and len(first["pairs"]) == 3 and first["largest_changes"]


def test_a_view_that_cannot_be_kept_is_still_read(database: Database) -> None:
    run_id = _store(database, "completed", [1.0, None])
    expected = _views(database, run_id)
    with database.session() as session:
        session.execute(text("DROP TABLE kept_views"))
    assert _views(database, run_id) == expected
    with database.session() as session:
        listed, _ = run_views.list_runs(session, PROJECT)
    assert listed == [expected[0]]


def test_the_process_that_completes_a_run_keeps_its_view(database: Database) -> None:
    """The first reader of a completed run finds its view kept: the engine that completed the
    run had it computed (workers and the batch lane complete runs through the same runtime)."""
    from recallq.runs.local import local_runtime
    from recallq.settings import Settings

    run_id = _store(database, "running", [1.0, 0.5])  # every item ended: the run is done
    runtime, runner = local_runtime(Settings(database_url=database.url), 1)
    try:
        runtime.engine.dispatch(run_id)
    finally:
        runner.stop(wait=True)
        runtime.close()
    assert _kept(database, run_id) == 1  # nobody has read it yet
    _tamper(database)
    assert _views(database, run_id)[0]["failures"] == [{"error": "kept", "count": 0}]


def _keep_raw(database: Database, run_id: str, key: str, body: Any) -> None:
    with database.session() as session:
        session.execute(
            insert(KeptView).values(key=key, run_id=run_id, body=body, created_at=utcnow())
        )


def _run_key(database: Database, run_id: str) -> str | None:
    with database.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return kept.key(run_views._RUN_VIEW, [run], details=True)


def test_a_view_kept_in_another_shape_is_computed_again_never_misread(
    database: Database,
) -> None:
    """Views kept by another version of recallq: one of 0009's positional rows, under its key
    (as if a status had been added since: every field shifted by one), one under today's key
    in an older shape, and one in today's shape that lacks a field. Each read computes the
    view again (the same as a fresh one) and keeps it in today's shape."""
    run_id = _store(database, "completed", [1.0, 0.5, None, 0.0])
    expected = _views(database, run_id)
    key = _run_key(database, run_id)
    assert key is not None
    with database.session() as session:
        today = session.get(KeptView, key)
        assert today is not None and today.body["shape"] == run_views.RUN_VIEW_SHAPE
        misread = {**today.body["body"], "scored": 1}  # what a misreading would show
        session.execute(delete(KeptView))
        run = session.get(Run, run_id)
        assert run is not None and run.finished_at is not None
        ended = [[run_id, as_utc(run.finished_at).isoformat()]]
    old_key = hashlib.sha256(json.dumps(["run", ended, {"details": True}]).encode()).hexdigest()
    shifted = [0, 3, 1, 0, 1, 0, 0, 0, 0.5, 3, 0.42, 0, 4, 3] + [0] * 17  # scored 3 read as 1...
    _keep_raw(database, run_id, old_key, {"row": shifted, "failures": []})
    assert key != old_key

    current = expected[0]
    for stored in (
        {"shape": "run/an-older-one", "body": misread},  # readable, but of another shape
        {"row": shifted, "failures": []},  # 0009's body under today's key
        {"shape": run_views.RUN_VIEW_SHAPE, "body": {"counts": {}, "scored": 1}},
    ):
        with database.session() as session:
            session.execute(delete(KeptView).where(KeptView.key == key))
        _keep_raw(database, run_id, key, stored)
        view = _views(database, run_id)[0]
        assert view == current, stored
        assert view["summary"]["scored_items"] == 3 and view["counts"]["failed"] == 1
        with database.session() as session:  # kept anew, in today's shape
            kept_now = session.get(KeptView, key)
            assert kept_now is not None and kept_now.body["shape"] == run_views.RUN_VIEW_SHAPE
        with database.session() as session:  # the list reads it the same way
            listed, _ = run_views.list_runs(session, PROJECT)
        assert listed == [current]


def test_a_new_aggregate_column_or_status_is_a_new_shape() -> None:
    """The run view's shape is its columns' and fields' names and the version of the rules
    that count them: changing one changes it, so a view kept before is not read as the new
    shape."""
    columns = [str(c.key) for c in run_views._aggregate_columns(1.0, True, false())]
    assert "count_failed" in columns and "deferrals" in columns
    fields = [f.name for f in dataclasses.fields(run_views.RunAggregates)]
    usage = [f.name for f in dataclasses.fields(Usage)]
    precision = [f.name for f in dataclasses.fields(PrecisionAggregates)]
    rules = ["rules", run_views.RUN_VIEW_RULES]
    shape = run_views.RUN_VIEW_SHAPE
    assert kept.shape("run", columns, fields, usage, precision, rules) == shape
    assert kept.shape("run", [*columns, "count_paused"], fields, usage, precision, rules) != shape
    assert kept.shape("run", columns, [*fields, "median"], usage, precision, rules) != shape
    assert kept.shape("run", columns, fields, usage, [*precision, "median"], rules) != shape
    assert kept.shape("run", columns, fields, usage, precision, ["rules", 1]) != shape
