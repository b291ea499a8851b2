"""The engine, the gate and the retention on real databases (SQLite in local mode; Postgres
and the session's redis-server in distributed mode), without HTTP:

- the claim cache belongs to a project: a hit never tells one project that another scored
  the same ground truth;
- items that take the run's static context store none of their own, and are judged
  against it;
- the call gate refuses a run's calls once its recorded spend reaches its budget (seeding
  a spend that Redis lost from the database), in Redis and in one process;
- the retention deletes ended runs older than its days, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select, update

from recallq.coordination.call_gate import OpenGate, RedisCallGate, RunCancelled
from recallq.execution.runtime import Runtime
from recallq.runs import ingest, local
from recallq.settings import Settings
from recallq.state.tables import Claim, Item, Run, utcnow
from tests.fakes import RecordingQueue
from tests.services import redis_database


def _local_run(database: Path, project: str, items: list[dict[str, Any]], **run: Any) -> dict:
    settings = Settings(database_url=f"sqlite:///{database}")
    from recallq.state import migrate

    migrate.upgrade(settings.database_url)
    runtime, runner = local.local_runtime(settings, 2)
    spec = ingest.build_spec(model=None, known_models=runtime.models, project=project, **run)
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, items, settings).id
    view = local.process(runtime, runner, run_id, progress=False)
    with runtime.database.session() as session:
        rows = session.scalars(select(Item).where(Item.run_id == run_id).order_by(Item.idx))
        stored = [row.contexts for row in rows]
    runtime.close()
    return {**view, "stored_contexts": stored}


def test_the_claim_cache_belongs_to_its_project(tmp_path: Path) -> None:
    database = tmp_path / "projects.db"
    items = [{"id": "a", "ground_truth": "Ada Lovelace wrote the first program.", "context": ["x"]}]
    first = _local_run(database, "alpha", items)
    again = _local_run(database, "alpha", items)
    other = _local_run(database, "beta", items)
    assert first["usage"]["claim_cache_hits"] == 0
    assert again["usage"]["claim_cache_hits"] == 1  # the project's own cache
    assert other["usage"]["claim_cache_hits"] == 0  # nothing of alpha's


def test_items_use_the_run_static_context_without_a_copy(tmp_path: Path) -> None:
    items: list[dict[str, Any]] = [
        {"id": "static", "ground_truth": "Tea contains caffeine."},
        {"id": "own", "ground_truth": "Tea contains caffeine.", "context": ["Water is wet."]},
    ]
    done = _local_run(
        tmp_path / "static.db", "default", items, context=["Green tea contains caffeine."]
    )
    assert done["stored_contexts"] == [None, ["Water is wet."]]
    assert done["counts"]["succeeded"] == 2
    assert done["summary"]["claims_attributed"] == 1  # the static one, judged against the run's


@pytest.fixture()
def distributed(pg_database: str) -> Iterator[Runtime]:
    settings = Settings(database_url=pg_database, redis_url=redis_database(13))
    runtime = Runtime.distributed(settings, RecordingQueue())
    yield runtime
    runtime.close()


def _stored_run(runtime: Runtime, n: int = 3, **run: Any) -> str:
    spec = ingest.build_spec(model=None, known_models=runtime.models, project="gate", **run)
    items = [{"id": f"i{i}", "ground_truth": "x", "context": ["x"]} for i in range(n)]
    with runtime.database.session() as session:
        return ingest.create_run(session, runtime.runs, spec, items, runtime.settings).id


def test_the_redis_gate_refuses_calls_once_the_budget_is_spent(distributed: Runtime) -> None:
    run_id = _stored_run(distributed, budget_usd=0.01)
    other = _stored_run(distributed)
    gate = distributed.gate
    assert isinstance(gate, RedisCallGate)
    with gate.call(run_id):  # seeds the spend from the database (nothing yet)
        pass
    gate.charge(run_id, 0.006, 100)
    with gate.call(run_id):
        pass
    gate.charge(run_id, 0.006, 100)  # 0.012: past the budget
    with pytest.raises(RunCancelled) as refused, gate.call(run_id):
        pass
    assert refused.value.reason == "budget"
    with gate.call(other):  # another run is not affected
        pass
    # Redis loses its data: the spend is seeded again from what the items recorded
    client = redis.Redis.from_url(distributed.settings.redis_url)
    client.flushdb()
    with distributed.database.session() as session:
        session.execute(update(Item).where(Item.run_id == run_id).values(cost_usd=0.004))
    with pytest.raises(RunCancelled), gate.call(run_id):  # 3 x 0.004 recorded: over 0.01
        pass


def test_a_budget_in_tokens_and_the_user_cancel_flag(distributed: Runtime) -> None:
    run_id = _stored_run(distributed, budget_tokens=1000)
    gate = distributed.gate
    with gate.call(run_id):
        pass
    gate.charge(run_id, 0.0, 999)
    with gate.call(run_id):
        pass
    gate.charge(run_id, 0.0, 1)
    with pytest.raises(RunCancelled) as refused, gate.call(run_id):
        pass
    assert refused.value.reason == "budget"
    cancelled = _stored_run(distributed)
    gate.close(cancelled)
    with pytest.raises(RunCancelled) as by_user, gate.call(cancelled):
        pass
    assert by_user.value.reason == "user"


def test_the_local_gate_holds_budgets_too() -> None:
    spent = {"r": (0.5, 0)}
    gate = OpenGate(budget_of=lambda run: (1.0, None), spent_of=lambda run: spent[run])
    with gate.call("r"):
        pass
    gate.charge("r", 0.5, 10)
    with pytest.raises(RunCancelled) as refused, gate.call("r"):
        pass
    assert refused.value.reason == "budget"


def test_the_engine_cancels_a_run_over_budget_with_reason_budget(distributed: Runtime) -> None:
    run_id = _stored_run(distributed, budget_usd=0.01)
    assert distributed.runs.cancel_for_budget(run_id)
    with distributed.database.session() as session:
        run = session.get(Run, run_id)
        assert run is not None and (run.status, run.cancel_reason) == ("cancelled", "budget")
        statuses = set(session.scalars(select(Item.status).where(Item.run_id == run_id)))
    assert statuses == {"cancelled"}
    assert not distributed.runs.cancel_for_budget(run_id)  # ended already: nothing to do


def test_retention_deletes_old_ended_runs_only(distributed: Runtime) -> None:
    old, recent, queued = (
        _stored_run(distributed),
        _stored_run(distributed),
        _stored_run(distributed),
    )
    for run_id in (old, recent):
        assert distributed.runs.cancel(run_id, "gate")
    with distributed.database.session() as session:
        session.execute(
            update(Run).where(Run.id == old).values(finished_at=utcnow() - timedelta(days=10))
        )
        session.execute(
            update(Run).where(Run.id == queued).values(created_at=utcnow() - timedelta(days=90))
        )
        item = session.scalars(select(Item.id).where(Item.run_id == old)).first()
        session.add(Claim(item_id=item, idx=0, text="a claim"))
    retention = distributed.retention()
    retention.days = 7
    assert retention.try_sweep() == 1
    assert retention.try_sweep() == 0  # another sweep waits for the interval (one worker)
    with distributed.database.session() as session:
        left = set(session.scalars(select(Run.id).where(Run.id.in_([old, recent, queued]))))
        orphans = session.scalar(select(func.count()).select_from(Item).where(Item.run_id == old))
        claims = session.scalar(
            select(func.count()).select_from(Claim).where(Claim.item_id == item)
        )
    assert left == {recent, queued}
    assert orphans == 0 and claims == 0
