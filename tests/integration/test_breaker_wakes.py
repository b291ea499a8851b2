"""recallq.execution.breaker_wakes on Postgres and Redis, in-process: items waiting out a
provider incident are sent one at a time when a probe is due, and all together as soon as the
breaker closes (not when their leases run out and the reaper's next sweep finds them)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import select

from recallq.coordination.breaker import BreakerSettings, Probe, RedisCircuitBreaker
from recallq.core.errors import ProviderUnavailable
from recallq.core.outcomes import Continue, Deferred, Ended
from recallq.core.status import ItemStatus
from recallq.execution.breaker_wakes import BreakerWakes
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.tables import Item
from tests.fakes import RecordingQueue, ScriptedJudge
from tests.services import redis_database

UNAVAILABLE = "provider unavailable (503)"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def model() -> str:
    return f"wakes-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def runtime(pg_database: str, model: str) -> Iterator[Runtime]:
    url = redis_database(14)
    settings = Settings(database_url=pg_database, redis_url=url)
    made = Runtime.distributed(
        settings, RecordingQueue(), worker_id="host:1", judges={model: ScriptedJudge(model)}
    )
    yield made
    made.close()


def _waiting_items(runtime: Runtime, model: str, count: int) -> list[int]:
    """Items of a new run of `model`, each deferred by an incident at its attribution."""
    spec = ingest.build_spec(model=model, known_models=[model])
    rows = [{"ground_truth": f"Fact {i} {uuid.uuid4()}", "context": ["x"]} for i in range(count)]
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, rows, runtime.settings).id
    runtime.engine.dispatch(run_id)
    with runtime.database.session() as session:
        ids = list(session.scalars(select(Item.id).where(Item.run_id == run_id).order_by(Item.id)))
    judge = runtime.judges.get(model)
    assert isinstance(judge, ScriptedJudge)
    judge.trouble = ProviderUnavailable(f"{UNAVAILABLE}: paused", 300.0)
    for item_id in ids:
        taken = runtime.engine.take(item_id)
        assert isinstance(taken, Continue)
        extracted = runtime.engine.extract(taken.taken)
        assert isinstance(extracted, Continue)
        assert isinstance(runtime.engine.attribute(extracted.taken), Deferred)
    judge.trouble = None
    return ids


def test_a_due_probe_sends_one_waiting_item_and_a_closed_breaker_sends_them_all(
    runtime: Runtime, model: str
) -> None:
    ids = _waiting_items(runtime, model, 3)
    clock = Clock()
    client = runtime.redis
    assert isinstance(client, redis.Redis)
    breaker = RedisCircuitBreaker(client, BreakerSettings(), clock=clock, local_view_s=0)
    queue = RecordingQueue()
    wakes = BreakerWakes(client, breaker, runtime.items, queue, "host:1")
    for _ in range(5):  # the incident opens the breaker: a probe in 5 s
        breaker.record_failure(model, UNAVAILABLE)

    assert wakes.sweep() == 0 and queue.items == []  # nothing due yet
    clock.now += 5.0
    assert wakes.sweep() == 1 and queue.items == [ids[0]]  # the probe's item, at once
    probe = breaker.before_call(model)
    assert isinstance(probe, Probe)
    taken = runtime.engine.take(ids[0])  # the worker it was sent to scores it
    assert isinstance(taken, Continue)
    assert isinstance(runtime.engine.attribute(taken.taken), Ended)
    breaker.record_success(model, probe)  # the breaker closes

    assert wakes.sweep() == 2 and queue.items == ids  # the others, without waiting 300 s
    with runtime.database.session() as session:
        rows = session.execute(select(Item.id, Item.status).where(Item.id.in_(ids))).all()
    statuses = {row.id: row.status for row in rows}
    assert statuses == {
        ids[0]: ItemStatus.SUCCEEDED,
        ids[1]: ItemStatus.QUEUED,
        ids[2]: ItemStatus.QUEUED,
    }
    assert wakes.sweep() == 0  # each wake once
