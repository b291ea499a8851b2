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
import redis
from sqlalchemy import select

from recallq import db, ingest
from recallq.models import Claim, Item, ItemStatus
from recallq.settings import get_settings
from tests.services import migrated_database, redis_database
from worker import judges, liveness, pipeline, reaper
from worker.judge.base import JudgeReply, Usage

MODEL = "ownership-probe"


class ProbeJudge:
    """Answers like a judge and runs `during_attribution` inside the attribution call."""

    name = MODEL
    prompt_version = "probe-v1"

    def __init__(self) -> None:
        self.attribution_calls = 0
        self.during_attribution: Callable[[], None] = lambda: None

    def extract_claims(self, ground_truth: str) -> JudgeReply:
        return JudgeReply({"claims": [ground_truth]}, Usage(llm_calls=1))

    def attribute(self, claims: list[str], contexts: list[str]) -> JudgeReply:
        self.attribution_calls += 1
        self.during_attribution()
        verdicts = [
            {"claim_index": i, "verdict": "yes", "context_indices": [0], "reason": "stated"}
            for i in range(len(claims))
        ]
        return JudgeReply({"verdicts": verdicts}, Usage(llm_calls=1))


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """This module's own database: the reaper's view must hold no other test's items."""
    with migrated_database() as url:
        yield url


@pytest.fixture()
def stage_env(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    url = redis_database(14)
    monkeypatch.setenv("RECALLQ_DATABASE_URL", pg_database)
    monkeypatch.setenv("RECALLQ_REDIS_URL", url)
    get_settings.cache_clear()
    db.dispose_engines()
    judge = ProbeJudge()
    monkeypatch.setitem(judges._judges, MODEL, judge)
    client = redis.Redis.from_url(url)
    yield {"judge": judge, "redis": client}
    client.flushdb()
    db.dispose_engines()
    get_settings.cache_clear()


def _queued_item() -> int:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL])
    ground_truth = f"Ada was born in 1815 ({uuid.uuid4()})."  # no claim-cache hit across tests
    with db.session_scope() as session:
        run = ingest.create_run(
            session, spec, [{"ground_truth": ground_truth, "context": ["Ada: 1815."]}]
        )
        run_id = run.id
    pipeline.dispatch(run_id, lambda ids: None)  # the run starts; its item is queued
    with db.session_scope() as session:
        return session.scalars(select(Item.id).where(Item.run_id == run_id)).one()


def _item(item_id: int) -> Item:
    with db.session_scope() as session:
        item = session.get(Item, item_id)
    assert item is not None
    return item


def _extracted_on(worker_id: str, item_id: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(liveness, "WORKER_ID", worker_id)
    taken = pipeline.take(item_id, lambda owner: True)
    assert isinstance(taken, pipeline.Taken)
    extracted = pipeline.extract(taken)
    assert isinstance(extracted, pipeline.Taken) and extracted.claims
    return extracted


def test_attribution_worker_that_dies_is_noticed_while_the_extracting_one_lives(
    stage_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, judge = stage_env["redis"], stage_env["judge"]
    item_id = _queued_item()
    extracted = _extracted_on("host:extracting", item_id, monkeypatch)

    # the extracting worker keeps beating; the attributing one never will again (SIGKILL)
    client.set(liveness.heartbeat_key("host:extracting"), "1", ex=60)
    monkeypatch.setattr(liveness, "WORKER_ID", "host:attributing")
    seen_as_lost: list[list[int]] = []
    judge.during_attribution = lambda: seen_as_lost.append(
        reaper.items_to_requeue(client, broker_lost=False)
    )
    pipeline.attribute(extracted)

    assert seen_as_lost == [[item_id]]


def test_a_duplicate_attribution_message_makes_no_second_call(
    stage_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = stage_env["judge"]
    item_id = _queued_item()
    extracted = _extracted_on("host:one", item_id, monkeypatch)

    duplicate_results: list[Any] = []
    judge.during_attribution = lambda: duplicate_results.append(pipeline.attribute(extracted))
    ended = pipeline.attribute(extracted)

    assert duplicate_results == [None]  # the copy found the item no longer its own
    assert judge.attribution_calls == 1
    assert isinstance(ended, pipeline.Ended)
    item = _item(item_id)
    assert item.status == ItemStatus.SUCCEEDED and item.llm_calls == 2


def test_an_item_taken_again_keeps_when_it_first_started(
    stage_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    item_id = _queued_item()
    first = pipeline.take(item_id, lambda owner: True)
    assert isinstance(first, pipeline.Taken)
    started = _item(item_id).started_at
    assert started is not None

    reaper.requeue([item_id], lambda ids: None)  # its worker died: back to the queue
    again = pipeline.take(item_id, lambda owner: False)

    assert isinstance(again, pipeline.Taken) and again.owner != first.owner
    item = _item(item_id)
    assert item.started_at == started and item.attempts == 2


def test_calls_in_flight_when_the_run_is_cancelled_still_count(
    stage_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = stage_env["judge"]
    item_id = _queued_item()
    extracted = _extracted_on("host:one", item_id, monkeypatch)

    def cancel_the_run() -> None:  # what POST /cancel writes, while the call is out
        with db.session_scope() as session:
            item = session.get(Item, item_id)
            assert item is not None
            item.status = ItemStatus.CANCELLED

    judge.during_attribution = cancel_the_run
    assert pipeline.attribute(extracted) is None

    item = _item(item_id)
    assert item.status == ItemStatus.CANCELLED and item.score is None
    assert item.llm_calls == 2  # extraction and the attribution that was in flight
    with db.session_scope() as session:
        verdicts = session.scalars(select(Claim.verdict).where(Claim.item_id == item_id)).all()
    assert verdicts == [None]  # its answer is not written
