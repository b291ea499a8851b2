"""An extraction group's items go on to attribution together (one message in a worker), and
are taken over for it in one statement: the passes still owned are handed over, a stale pass
(its item taken over, or ended) is refused on its own, and nothing else changes.

On SQLite (local mode's store) and on Postgres (a worker's), with the real store and engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from redis import Redis
from sqlalchemy import select

from recallq.core.outcomes import Continue, Ended, Skipped, SkipReason, Taken
from recallq.execution import celery_queue as broker
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.migrate import upgrade
from recallq.state.tables import Item
from tests.fakes import RecordingQueue, ScriptedJudge
from tests.services import redis_database

MODEL = "groups-probe"


@pytest.fixture(params=["sqlite", "postgres"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'groups.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("pg_database")
    made = Runtime.local(
        Settings(database_url=url), RecordingQueue(), judges={MODEL: ScriptedJudge(MODEL)}
    )
    yield made
    made.close()


def _queue(runtime: Runtime) -> RecordingQueue:
    queue = runtime.engine.queue
    assert isinstance(queue, RecordingQueue)
    return queue


def _released(runtime: Runtime, n: int) -> list[int]:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL])
    rows = [
        {"ground_truth": f"claim {i} {uuid.uuid4()}", "context": [f"claim {i} passage"]}
        for i in range(n)
    ]
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, rows, runtime.settings).id
    with runtime.database.session() as session:
        ids = list(session.scalars(select(Item.id).where(Item.run_id == run_id).order_by(Item.idx)))
    assert runtime.engine.dispatch(run_id) == n
    return ids


def _owner(runtime: Runtime, item_id: int) -> str | None:
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        return item.owner


def test_a_group_goes_on_to_attribution_in_one_sending(runtime: Runtime) -> None:
    engine = runtime.engine
    ids = _released(runtime, 4)
    outcomes = list(zip(ids, engine.extract_group(ids), strict=True))
    assert all(isinstance(outcome, Continue) for _, outcome in outcomes)

    engine.go_on_group(outcomes)

    sent = _queue(runtime).attributions
    assert [taken.item_id for taken in sent] == ids  # together, in order, once each


def test_a_group_is_handed_over_at_once_and_a_stale_pass_alone_is_refused(
    runtime: Runtime,
) -> None:
    engine, store = runtime.engine, runtime.items
    ids = _released(runtime, 4)
    passes: list[Taken] = []
    for outcome in engine.extract_group(ids):
        assert isinstance(outcome, Continue)
        passes.append(outcome.taken)
    # another worker took the second item over; the fourth has ended already
    stolen = store.hand_over(passes[1], "another-worker:1")
    assert not isinstance(stolen, Skipped)
    ended = engine.attribute(passes[3])
    assert isinstance(ended, Ended)

    handed = engine.hand_over_group(passes)

    assert handed[1] == Skipped(SkipReason.NOT_OWNED)
    assert handed[3] == Skipped(SkipReason.NOT_OWNED)
    assert _owner(runtime, ids[1]) == "another-worker:1"  # the stale pass changed nothing
    for index in (0, 2):
        found = handed[index]
        assert not isinstance(found, Skipped)
        taken, contexts = found
        assert taken.item_id == ids[index] and taken.owner != passes[index].owner
        assert _owner(runtime, ids[index]) == taken.owner
        assert contexts == [f"claim {index} passage"]
        assert isinstance(engine.attribute_handed(found), Ended)
    # a second copy of the message finds every item moved on
    assert all(isinstance(h, Skipped) for h in engine.hand_over_group(passes))


def test_a_worker_sends_a_groups_attribution_in_messages_of_four_items(runtime: Runtime) -> None:
    """Through a real broker: 10 passes are 3 attribute_group messages (4, 4, 2), each naming
    its items, which the reaper reads from the queue as it reads any message's."""
    ids = _released(runtime, 10)
    passes = [o.taken for o in runtime.engine.extract_group(ids) if isinstance(o, Continue)]
    url = redis_database(7)
    app = broker.configure(Celery("attribution-groups-test"), url)
    try:
        broker.CeleryQueue(app, 8).send_attributions(passes)
    finally:
        app.close()

    redis = Redis.from_url(url)
    raw = redis.lrange(broker.QUEUE, 0, -1)
    sizes = sorted(len(broker._message_items(message)) for message in raw)
    assert sizes == [2, 4, 4]
    assert broker.queued_items(redis) == set(ids)
    redis.close()
