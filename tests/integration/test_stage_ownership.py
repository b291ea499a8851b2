"""Who owns an item while a stage runs, checked on real Postgres and Redis with the pipeline
stages called in-process (the judge is a double at the LLM boundary).

The attribution stage often runs on another worker than the extraction did. If that worker
dies mid-call while the extracting worker lives on, the reaper must still see the item as lost
at its next sweep, not 600 s later when the stage's lease runs out.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from recallq.core.outcomes import Continue, Ended, Skipped, SkipReason, Taken
from recallq.core.status import ItemStatus
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.tables import Claim, Item
from tests.fakes import RecordingQueue, ScriptedJudge
from tests.services import migrated_database, redis_database

MODEL = "ownership-probe"


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: the reaper's view must hold no other test's items."""
    with migrated_database() as url:
        yield url


@pytest.fixture()
def workers(pg_database: str) -> Iterator[Callable[[str], Runtime]]:
    """Runtimes of worker processes, by worker id, sharing one probe judge."""
    settings = Settings(database_url=pg_database, redis_url=redis_database(14))
    judge = ScriptedJudge(MODEL)
    made: list[Runtime] = []

    def worker(worker_id: str) -> Runtime:
        runtime = Runtime.distributed(
            settings, RecordingQueue(), worker_id=worker_id, judges={MODEL: judge}
        )
        made.append(runtime)
        return runtime

    yield worker
    for runtime in made:
        runtime.close()


def _judge(runtime: Runtime) -> ScriptedJudge:
    judge = runtime.judges.get(MODEL)
    assert isinstance(judge, ScriptedJudge)
    return judge


def _queued_item(runtime: Runtime) -> int:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL])
    ground_truth = f"Ada was born in 1815 ({uuid.uuid4()})."  # no claim-cache hit across tests
    with runtime.database.session() as session:
        run = ingest.create_run(
            session,
            runtime.runs,
            spec,
            [{"ground_truth": ground_truth, "context": ["Ada: 1815."]}],
            runtime.settings,
        )
        run_id = run.id
    runtime.engine.dispatch(run_id)  # the run starts; its item is queued
    with runtime.database.session() as session:
        return session.scalars(select(Item.id).where(Item.run_id == run_id)).one()


def _item(runtime: Runtime, item_id: int) -> Item:
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
    assert item is not None
    return item


def _extracted(runtime: Runtime, item_id: int) -> Taken:
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue)
    extracted = runtime.engine.extract(taken.taken)
    assert isinstance(extracted, Continue) and extracted.taken.claims
    return extracted.taken


def test_attribution_worker_that_dies_is_noticed_while_the_extracting_one_lives(
    workers: Callable[[str], Runtime],
) -> None:
    extracting, attributing = workers("host:extracting"), workers("host:attributing")
    item_id = _queued_item(extracting)
    extracted = _extracted(extracting, item_id)

    # the extracting worker keeps beating; the attributing one never will again (SIGKILL)
    assert extracting.heartbeat is not None
    extracting.heartbeat.beat()
    reaper = extracting.reaper()
    seen_as_lost: list[list[int]] = []
    _judge(attributing).during_attribution = lambda: seen_as_lost.append(reaper.items_to_requeue())
    attributing.engine.attribute(extracted)

    assert seen_as_lost == [[item_id]]


def test_a_duplicate_attribution_message_makes_no_second_call(
    workers: Callable[[str], Runtime],
) -> None:
    runtime = workers("host:one")
    judge = _judge(runtime)
    item_id = _queued_item(runtime)
    extracted = _extracted(runtime, item_id)

    duplicate_results: list[Any] = []
    judge.during_attribution = lambda: duplicate_results.append(runtime.engine.attribute(extracted))
    ended = runtime.engine.attribute(extracted)

    assert duplicate_results == [Skipped(SkipReason.NOT_OWNED)]  # no longer the copy's own
    assert judge.attribution_calls == 1
    assert isinstance(ended, Ended)
    item = _item(runtime, item_id)
    assert item.status == ItemStatus.SUCCEEDED and item.llm_calls == 2


def test_an_item_taken_again_keeps_when_it_first_started(
    workers: Callable[[str], Runtime],
) -> None:
    runtime = workers("host:one")
    item_id = _queued_item(runtime)
    first = runtime.engine.take(item_id)
    assert isinstance(first, Continue)
    started = _item(runtime, item_id).started_at
    assert started is not None

    runtime.items.requeue_lost([item_id])  # its worker died: back to the queue
    again = runtime.engine.take(item_id)

    assert isinstance(again, Continue) and again.taken.owner != first.taken.owner
    item = _item(runtime, item_id)
    assert item.started_at == started and item.attempts == 2


def test_calls_in_flight_when_the_run_is_cancelled_still_count(
    workers: Callable[[str], Runtime],
) -> None:
    runtime = workers("host:one")
    item_id = _queued_item(runtime)
    extracted = _extracted(runtime, item_id)
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        run_id = item.run_id

    _judge(runtime).during_attribution = lambda: runtime.runs.cancel(run_id, "default")
    assert runtime.engine.attribute(extracted) == Skipped(SkipReason.NOT_OWNED)

    item = _item(runtime, item_id)
    assert item.status == ItemStatus.CANCELLED and item.score is None
    assert item.llm_calls == 2  # extraction and the attribution that was in flight
    with runtime.database.session() as session:
        verdicts = session.scalars(select(Claim.verdict).where(Claim.item_id == item_id)).all()
    assert verdicts == [None]  # its answer is not written
