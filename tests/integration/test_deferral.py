"""What a deferred item keeps, and when waiting turns into failing: the engine and the store on
a real database, with a provider double at the judge boundary."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from recallq.core.errors import ProviderUnavailable, RateLimited
from recallq.core.outcomes import Continue, Deferred, Ended
from recallq.core.status import ItemStatus
from recallq.core.usage import Usage
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.migrate import upgrade
from recallq.state.tables import Claim, Item
from tests.fakes import RecordingQueue, ScriptedJudge

MODEL = "incident-probe"


@pytest.fixture()
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    url = f"sqlite:///{tmp_path / 'deferral.db'}"
    upgrade(url)
    judge = ScriptedJudge(MODEL, usage=Usage(llm_calls=1, call_attempts=1))
    made = Runtime.local(Settings(database_url=url), RecordingQueue(), judges={MODEL: judge})
    yield made
    made.close()


def _provider(runtime: Runtime) -> ScriptedJudge:
    """The provider: extraction answers; attribution raises `trouble` while it is set."""
    judge = runtime.judges.get(MODEL)
    assert isinstance(judge, ScriptedJudge)
    return judge


def _item_taken_to_attribution(runtime: Runtime, deadline: float | None = None) -> int:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL], retry_deadline_s=deadline)
    rows = [{"ground_truth": f"Ada was born in 1815 {uuid.uuid4()}", "context": ["Ada 1815"]}]
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, rows, runtime.settings).id
    runtime.engine.dispatch(run_id)
    with runtime.database.session() as session:
        return session.scalars(select(Item.id).where(Item.run_id == run_id)).one()


def _to_attribution(runtime: Runtime, item_id: int) -> object:
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue)
    extracted = runtime.engine.extract(taken.taken)
    assert isinstance(extracted, Continue)
    return runtime.engine.attribute(extracted.taken)


def _item(runtime: Runtime, item_id: int) -> Item:
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        return item


def test_an_incident_puts_the_item_back_with_its_claims_and_usage(runtime: Runtime) -> None:
    _provider(runtime).trouble = ProviderUnavailable(
        "provider unavailable (503): paused", 30.0, Usage(call_attempts=2, failed_calls=2)
    )
    item_id = _item_taken_to_attribution(runtime)
    before = time.time()
    outcome = _to_attribution(runtime, item_id)

    assert isinstance(outcome, Deferred) and outcome.until.timestamp() >= before + 29
    item = _item(runtime, item_id)
    assert item.status == ItemStatus.QUEUED and item.owner is None
    assert (item.deferrals, item.llm_calls, item.call_attempts, item.failed_calls) == (1, 1, 3, 2)
    assert item.waiting_since is not None and item.error is None
    with runtime.database.session() as session:
        claims = session.scalars(select(Claim.text).where(Claim.item_id == item_id)).all()
    assert len(claims) == 1  # extracted once, kept

    _provider(runtime).trouble = None  # the provider is back: the item goes on from its claims
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue) and taken.taken.claims == tuple(claims)
    assert isinstance(runtime.engine.attribute(taken.taken), Ended)
    item = _item(runtime, item_id)
    assert item.status == ItemStatus.SUCCEEDED and item.waiting_since is None
    assert (item.llm_calls, item.deferrals) == (2, 1)


def test_past_the_runs_retry_deadline_the_item_fails_saying_so(runtime: Runtime) -> None:
    _provider(runtime).trouble = ProviderUnavailable("provider unavailable (503): paused", 0.0)
    item_id = _item_taken_to_attribution(runtime, deadline=0.2)
    assert isinstance(_to_attribution(runtime, item_id), Deferred)  # the wait starts
    time.sleep(0.25)
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue)
    assert isinstance(runtime.engine.attribute(taken.taken), Ended)
    item = _item(runtime, item_id)
    assert item.status == ItemStatus.FAILED and item.deferrals == 1
    assert item.error is not None
    assert item.error.startswith("gave up after the run's retry deadline (0.2 s) passed")
    assert "provider unavailable (503)" in item.error


def test_waiting_for_rate_limit_room_never_runs_into_the_deadline(runtime: Runtime) -> None:
    _provider(runtime).trouble = RateLimited(MODEL, 0.0)
    item_id = _item_taken_to_attribution(runtime, deadline=0.01)
    assert isinstance(_to_attribution(runtime, item_id), Deferred)
    time.sleep(0.05)
    taken = runtime.engine.take(item_id)
    assert isinstance(taken, Continue)
    assert isinstance(runtime.engine.attribute(taken.taken), Deferred)  # still waiting
    item = _item(runtime, item_id)
    assert item.status == ItemStatus.QUEUED and item.deferrals == 2
    assert item.waiting_since is None
