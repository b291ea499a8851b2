"""The provider batch lane in this process: its polls against a real Postgres database and the
stub's Files and Batch APIs over HTTP through litellm.

Crashes are reproduced as the state they leave: a provider call made without the write that
should follow it, or a write lost after the answers it followed were applied.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from recallq.batch.lane import METADATA_KEY, BatchLane
from recallq.batch.requests import InputFile, request_line
from recallq.batch.store import LaneRun, LaneStore
from recallq.core.outcomes import Stage
from recallq.execution.engine import Engine
from recallq.execution.runtime import Runtime
from recallq.judge.models import batch_models, load_models
from recallq.runs import ingest, item_views, run_views
from recallq.settings import Settings
from recallq.state.batched_items import BatchedItemStore
from recallq.state.db import Database
from recallq.state.runs import stores_for
from recallq.state.tables import Item, Run
from tests.fakes import RecordingQueue
from tests.integration.faults import make_items
from tests.integration.test_precision import J1, R1, R2, TRUTH, check_precision
from tests.integration.test_precision import items as precision_items
from tests.services import migrated_database, write_models_file
from tests.stub_llm import StubConfig, StubServer

MODEL = "stub-judge"
KEY = "sk-stub-batch-key-7731"
PRICE_IN, PRICE_OUT = 2e-6, 8e-6  # USD per token, online
STUB_DEFAULTS = StubConfig().as_dict()


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    # its own stub: these tests change its batch settings and the keys it rejects
    with StubServer() as server:
        yield server


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with migrated_database() as url:
        yield url


@pytest.fixture()
def provider(stub: StubServer) -> StubServer:
    stub.configure(**{**STUB_DEFAULTS, "batch_delay_s": 0.3})
    stub.reset()
    return stub


@dataclass
class Lane:
    """A lane over the module's database, as a worker builds it, and helpers around it."""

    lane: BatchLane
    database: Database
    settings: Settings
    models: Any

    def submit(self, rows: Sequence[dict[str, Any]], mode: str = "batch", **fields: Any) -> str:
        spec = ingest.build_spec(
            model=MODEL,
            known_models=self.models,
            mode=mode,
            batch_models=batch_models(self.models),
            **fields,
        )
        with self.database.session() as session:
            run_id = ingest.create_run(session, self.lane.runs, spec, rows, self.settings).id
        if mode == "batch":  # the run's dispatch: it starts, and no item goes to the queue
            assert self.lane.runs.release_window(run_id) == []
        return run_id

    def view(self, run_id: str) -> dict[str, Any]:
        with self.database.session() as session:
            run = session.get(Run, run_id)
            assert run is not None
            return run_views.run_view(session, run)

    def poll_until_ended(self, run_id: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.lane.poll()
            view = self.view(run_id)
            if view["status"] in ("completed", "cancelled"):
                return view
            time.sleep(0.2)
        raise TimeoutError(f"run {run_id} did not end: {self.view(run_id)}")

    def items(self, run_id: str) -> dict[str, dict[str, Any]]:
        with self.database.session() as session:
            page, _ = item_views.items_page(session, run_id, None, 1000, None)
            rows = session.execute(
                select(Item.key, Item.llm_calls, Item.call_attempts, Item.failed_calls).where(
                    Item.run_id == run_id
                )
            ).all()
        usage = {r.key: r for r in rows}
        return {
            item["id"]: {
                **item,
                "llm_calls": usage[item["id"]].llm_calls,
                "failed_calls": usage[item["id"]].failed_calls,
            }
            for item in page
        }

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.database.transaction() as conn:
            result = conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []


@pytest.fixture()
def lane(database_url: str, provider: StubServer, tmp_path: Path, monkeypatch) -> Iterator[Lane]:
    monkeypatch.setenv("STUB_API_KEY", KEY)
    models_path = write_models_file(tmp_path, provider.base_url)
    with models_path.open("a") as handle:
        handle.write("    batch: true\n")
    text_ = models_path.read_text().replace(
        "      api_key: os.environ/STUB_API_KEY\n",
        "      api_key: os.environ/STUB_API_KEY\n"
        f"      input_cost_per_token: {PRICE_IN:.9f}\n"
        f"      output_cost_per_token: {PRICE_OUT:.9f}\n",
    )
    models_path.write_text(text_)
    models = load_models(models_path)
    settings = Settings(
        database_url=database_url,
        models_file=models_path,
        request_timeout=10,
        retry_base_delay=0.05,
    )
    database = Database(database_url)
    _, runs = stores_for(database, settings)
    made = BatchLane(LaneStore(database), BatchedItemStore(), runs, models, settings)
    yield Lane(made, database, settings, models)
    with database.transaction() as conn:  # the next test's polls see only its own runs
        conn.execute(text("UPDATE runs SET status = 'cancelled' WHERE status <> 'completed'"))
        conn.execute(text("UPDATE provider_batches SET state = 'done'"))
    database.dispose()


def unique_custom_ids(stub: StubServer) -> list[str]:
    """Every custom_id the provider was sent, each exactly once (else the test fails)."""
    sent = [custom_id for batch in stub.batches() for custom_id in batch["custom_ids"]]
    repeated = [custom_id for custom_id, n in Counter(sent).items() if n > 1]
    assert repeated == [], f"submitted twice: {repeated}"
    return sent


MIXED = [
    *make_items("m", 12, {3: "STUB_DROP_VERDICT", 5: "STUB_BROKEN_JSON", 7: "STUB_HTTP_400"}),
    {"id": "no-ground-truth", "ground_truth": None, "context": ["anything"]},
    {"id": "no-context", "ground_truth": "Water boils at 100 degrees.", "context": []},
    {
        "id": "partly",
        "ground_truth": "Sample p weighs 3 grams. Sample p is blue.",
        "context": ["Sample p weighs 3 grams exactly."],
    },
]


def score_online(lane: Lane, run_id: str) -> None:
    """The same run's items through the online engine, in this process (real litellm calls
    to the stub)."""
    queue = RecordingQueue()
    settings = lane.settings.model_copy(update={"dispatch_window": 1000})
    runtime = Runtime.local(settings, queue)
    engine: Engine = runtime.engine
    engine.dispatch(run_id)
    for item_id in queue.items:  # one at a time: one request per item and stage, as batches
        (outcome,) = engine.extract_group([item_id])
        engine.go_on(item_id, outcome)  # the routing the workers and the local runner use
        while queue.attributions:
            taken = queue.attributions.pop()
            engine.go_on(taken.item_id, engine.attribute(taken))
    engine.runs.complete_if_done(run_id)
    runtime.close()


def comparable(item: dict[str, Any]) -> tuple[Any, ...]:
    claims = [(c["text"], c["verdict"], c["context_indices"], c["reason"]) for c in item["claims"]]
    error = item["error"] if item["id"] != "m-7" else None  # a 400's text differs by client
    return (item["status"], item["score"], item["reason"], error, item["llm_calls"], claims)


def test_a_batch_run_scores_as_the_online_engine_does(lane: Lane, provider: StubServer) -> None:
    online_run = lane.submit(MIXED, mode="online")
    score_online(lane, online_run)
    online = lane.items(online_run)
    assert {i["status"] for i in online.values()} == {"succeeded", "failed"}
    provider.reset()  # forget the live calls, and which verdicts the stub dropped once
    lane.sql("DELETE FROM claim_cache")  # else the batch run's claims come from the cache

    batch_run = lane.submit(MIXED)
    view = lane.poll_until_ended(batch_run)
    batched = lane.items(batch_run)
    assert {k: comparable(v) for k, v in batched.items()} == {
        k: comparable(v) for k, v in online.items()
    }
    assert batched["m-3"]["llm_calls"] == 3  # a re-ask of the verdict left out, in a batch
    assert batched["m-5"]["error"].startswith("claim_extraction: malformed answer after a repair")
    assert batched["m-7"]["error"].startswith("provider answered 400: STUB_HTTP_400")
    assert provider.calls() == []  # not one online call
    sent = unique_custom_ids(provider)
    assert len(sent) == view["batch"]["requests_submitted"] == view["usage"]["llm_calls"] + 1
    assert view["status"] == "completed" and view["mode"] == "batch"
    assert view["counts"]["succeeded"] == 13 and view["counts"]["failed"] == 2
    assert view["batch"] == {
        "requests_submitted": len(sent),
        "completed": view["usage"]["llm_calls"],
        "failed": 1,  # the 400
        "batches_pending": 0,
    }

    # cost at the batch price: half the online price for the same tokens
    online_view = lane.view(online_run)
    for key in ("llm_calls", "prompt_tokens", "completion_tokens"):
        assert view["usage"][key] == online_view["usage"][key], key
    tokens_cost = (
        view["usage"]["prompt_tokens"] * PRICE_IN + view["usage"]["completion_tokens"] * PRICE_OUT
    )
    assert online_view["usage"]["cost_usd"] == pytest.approx(tokens_cost, rel=1e-4)
    assert view["usage"]["cost_usd"] == pytest.approx(tokens_cost / 2, rel=1e-4)
    assert view["usage"]["by_lane"]["online"]["llm_calls"] == 0
    assert view["usage"]["by_lane"]["batch"]["cost_usd"] == view["usage"]["cost_usd"]
    stages = view["usage"]["by_stage"]
    assert (
        stages["extraction"]["llm_calls"] + stages["attribution"]["llm_calls"]
        == (view["usage"]["llm_calls"])
    )
    assert online_view["usage"]["by_lane"]["batch"]["llm_calls"] == 0
    for stage, used in online_view["usage"]["by_stage"].items():  # the same calls, online
        assert used["llm_calls"] == stages[stage]["llm_calls"], stage
        assert used["prompt_tokens"] == stages[stage]["prompt_tokens"], stage
    assert online_view["batch"] is None


def test_claims_in_the_claim_cache_are_not_extracted_again(
    lane: Lane, provider: StubServer
) -> None:
    rows = make_items("cache", 5)
    lane.poll_until_ended(lane.submit(rows))
    before = len(unique_custom_ids(provider))
    view = lane.poll_until_ended(lane.submit(rows))
    schemas = provider.stats()["batches"]["lines_by_schema"]
    assert schemas == {"claim_extraction": 5, "claim_attribution": 10}
    assert len(unique_custom_ids(provider)) == before + 5
    assert view["usage"]["claim_cache_hits"] == 5 and view["counts"]["succeeded"] == 5


def crash_state(lane: Lane, run_id: str) -> tuple[str, str]:
    """A poll's first steps by hand, up to its batch's create call: returns (our batch id,
    the provider's input file id)."""
    store, api = lane.lane.store, lane.lane.api(MODEL)
    lane.lane.plan(LaneRun(run_id, "default", MODEL, 1.0, None))
    ready = store.ready(run_id, Stage.EXTRACTION, 100)
    file = InputFile(100, 10**6)
    for row in ready:
        assert file.add(row.request.line_id, request_line(row.request, api.body_model, {}))
    batch_id = store.open_batch(run_id, MODEL, Stage.EXTRACTION, file.line_ids)
    file_id = api.upload(f"recallq-{batch_id}.jsonl", file.content())
    assert store.uploaded(batch_id, file_id, file.size) and store.creating(batch_id)
    return batch_id, file_id


def long_ago(lane: Lane, batch_id: str) -> None:
    """As if the create call had been made minutes ago (past any call still in flight)."""
    lane.sql(
        "UPDATE provider_batches SET creating_at = creating_at - interval '10 minutes' "
        "WHERE id = :id",
        id=batch_id,
    )


def test_a_batch_created_by_a_worker_killed_before_it_wrote_so_is_found_not_sent_again(
    lane: Lane, provider: StubServer
) -> None:
    run_id = lane.submit(make_items("lost", 6))
    batch_id, file_id = crash_state(lane, run_id)
    lane.lane.api(MODEL).create(file_id, {METADATA_KEY: batch_id})  # then the worker died
    lane.lane.poll()  # too recent to look for: a call cut off mid-way could still be running
    assert [b["metadata"][METADATA_KEY] for b in provider.batches()] == [batch_id]
    long_ago(lane, batch_id)
    view = lane.poll_until_ended(run_id)
    assert view["counts"]["succeeded"] == 6
    assert len(unique_custom_ids(provider)) == 12
    extraction = [b for b in provider.batches() if b["metadata"][METADATA_KEY] == batch_id]
    assert len(extraction) == 1  # found by its metadata, not created again


def test_a_create_call_that_never_went_out_is_made_once(lane: Lane, provider: StubServer) -> None:
    run_id = lane.submit(make_items("never", 4))
    batch_id, _ = crash_state(lane, run_id)  # the worker died before the call left
    long_ago(lane, batch_id)
    view = lane.poll_until_ended(run_id)
    assert view["counts"]["succeeded"] == 4
    assert len(unique_custom_ids(provider)) == 8
    assert sum(b["metadata"][METADATA_KEY] == batch_id for b in provider.batches()) == 1


def test_answers_applied_before_a_crash_are_not_applied_again(
    lane: Lane, provider: StubServer
) -> None:
    run_id = lane.submit(make_items("again", 8))
    view = lane.poll_until_ended(run_id)
    items = lane.items(run_id)
    # the poll died after applying every answer, before it wrote that the batches were done
    lane.sql("UPDATE provider_batches SET state = 'submitted' WHERE run_id = :run", run=run_id)
    lane.sql("UPDATE runs SET status = 'running' WHERE id = :run", run=run_id)
    report = lane.lane.poll()
    assert report.batches_applied == 2 and report.results_applied == 0
    assert lane.items(run_id) == items
    again = lane.view(run_id)
    assert again["usage"] == view["usage"] and again["status"] == "completed"
    assert lane.sql(
        "SELECT count(*) FROM provider_batches WHERE run_id = :run AND state = 'done'", run=run_id
    ) == [(2,)]


def test_failed_lines_go_again_in_a_later_batch(lane: Lane, provider: StubServer) -> None:
    provider.configure(batch_line_fail_rate=0.3, seed=11)
    run_id = lane.submit(make_items("flaky", 40))
    view = lane.poll_until_ended(run_id)
    assert view["counts"]["succeeded"] == 40 and view["counts"]["failed"] == 0
    failed = view["batch"]["failed"]
    assert failed > 5  # the stub failed that many lines, each sent again
    sent = unique_custom_ids(provider)
    assert len(sent) == 80 + failed == view["batch"]["requests_submitted"]
    assert len(provider.batches()) > 2
    assert view["usage"]["llm_calls"] == 80 and view["usage"]["failed_calls"] == failed
    lines = lane.sql(
        "SELECT l.item_id, l.stage, l.batch_id, b.created_at FROM batch_lines l "
        "JOIN provider_batches b ON b.id = l.batch_id WHERE l.run_id = :run AND l.state = 'failed'",
        run=run_id,
    )
    for item_id, stage, batch_id, created in lines:  # each again in a later batch, answered
        later = lane.sql(
            "SELECT count(*) FROM batch_lines l JOIN provider_batches b ON b.id = l.batch_id "
            "WHERE l.item_id = :item AND l.stage = :stage AND l.state = 'answered' "
            "AND b.created_at > :created",
            item=item_id,
            stage=stage,
            created=created,
        )
        assert later == [(1,)], (item_id, stage, batch_id)


def test_past_the_retry_deadline_failed_lines_fail_their_items(
    lane: Lane, provider: StubServer
) -> None:
    provider.configure(batch_line_fail_rate=1.0)
    started = time.monotonic()
    run_id = lane.submit(make_items("doomed", 5), retry_deadline_s=2)
    view = lane.poll_until_ended(run_id, timeout=60)
    assert time.monotonic() - started < 30
    assert view["counts"]["failed"] == 5 and view["counts"]["succeeded"] == 0
    for item in lane.items(run_id).values():
        assert item["error"].startswith(
            "gave up after the run's retry deadline (2 s) passed: provider answered 500: "
        )
        assert item["llm_calls"] == 0 and item["failed_calls"] >= 2  # tried, then tried again
    assert len(provider.batches()) >= 2
    unique_custom_ids(provider)

    provider.configure(batch_line_fail_rate=0.0)  # the provider is well again: retry them
    assert lane.lane.runs.retry_failed(run_id, "default") == 5
    view = lane.poll_until_ended(run_id)
    assert view["counts"]["succeeded"] == 5 and view["counts"]["failed"] == 0
    unique_custom_ids(provider)


def test_cancel_cancels_the_provider_batch(lane: Lane, provider: StubServer) -> None:
    provider.configure(batch_delay_s=10)
    run_id = lane.submit(make_items("stop", 10))
    lane.lane.poll()
    time.sleep(2.5)  # a few lines are answered before the cancel: billed all the same
    assert lane.lane.runs.cancel(run_id, "default")  # what the API does: no provider call
    assert [b["status"] for b in provider.batches()] == ["in_progress"]
    lane.lane.poll()
    batch = provider.batches()[0]
    assert batch["status"] == "cancelled"
    lane.lane.poll()
    view = lane.view(run_id)
    assert view["status"] == "cancelled" and view["counts"]["cancelled"] == 10
    assert view["batch"]["batches_pending"] == 0
    answered = batch["request_counts"]["completed"]
    assert 0 < answered < 10 and view["usage"]["llm_calls"] == answered
    assert len(provider.batches()) == 1  # and nothing more is sent


def test_a_deleted_runs_batch_is_cancelled_at_the_provider(
    lane: Lane, provider: StubServer
) -> None:
    provider.configure(batch_delay_s=30)
    run_id = lane.submit(make_items("gone", 3))
    lane.lane.poll()
    lane.sql("DELETE FROM runs WHERE id = :run", run=run_id)
    lane.lane.poll()
    assert [b["status"] for b in provider.batches()] == ["cancelled"]
    lane.lane.poll()
    assert lane.sql("SELECT state, run_id FROM provider_batches WHERE run_id IS NULL") == [
        ("done", None)
    ]


def test_a_rejected_key_fails_the_items_without_showing_the_key(
    lane: Lane, provider: StubServer
) -> None:
    provider.configure(reject_keys=[KEY])
    run_id = lane.submit(make_items("locked", 3))
    view = lane.poll_until_ended(run_id, timeout=30)
    assert view["counts"]["failed"] == 3
    for item in lane.items(run_id).values():
        assert item["error"].startswith("AuthenticationError: ")
        assert KEY not in item["error"] and "[redacted]" in item["error"]
    assert provider.batches() == []


def test_only_one_worker_polls_at_a_time(lane: Lane) -> None:
    with lane.lane.store.exclusive() as first:
        assert first
        other = LaneStore(lane.database)
        with other.exclusive() as second:
            assert not second
        assert not lane.lane.poll().polled
    assert lane.lane.poll().polled


def test_judged_precision_in_the_lane_one_relevance_request_per_item_with_a_context(
    lane: Lane, provider: StubServer
) -> None:
    cache_before = lane.sql("SELECT count(*) FROM claim_cache")[0][0]
    run_id = lane.submit(precision_items("batch-judged"), precision="judged")
    view = lane.poll_until_ended(run_id)
    assert view["status"] == "completed" and view["precision"] == "judged"
    assert view["counts"]["succeeded"] == 8
    found = lane.items(run_id)
    check_precision(found)  # each item's context_precision: the average precision by hand
    assert found["first"]["passages"][0]["reason"] == "stub: states a fact"
    assert found["first"]["passages"][2]["reason"] == "stub: states none"
    assert provider.calls() == []  # not one online call
    unique_custom_ids(provider)
    batches = provider.stats()["batches"]
    # one per item with a context and a ground truth (7 items have a ground truth, 6 a context)
    assert batches["lines_by_schema"] == {
        "claim_extraction": 7,
        "claim_attribution": 6,
        "context_relevance": 6,
    }
    relevance, counted = view["usage"]["by_stage"]["relevance"], batches["usage_by_schema"]
    assert relevance["llm_calls"] == counted["context_relevance"]["calls"] == 6
    assert relevance["prompt_tokens"] == counted["context_relevance"]["prompt_tokens"]
    assert relevance["completion_tokens"] == counted["context_relevance"]["completion_tokens"]
    assert relevance["cost_usd"] == pytest.approx(
        (relevance["prompt_tokens"] * PRICE_IN + relevance["completion_tokens"] * PRICE_OUT) / 2,
        rel=1e-4,
    )
    stages = view["usage"]["by_stage"]
    for key in ("llm_calls", "prompt_tokens", "completion_tokens"):
        total = sum(stages[stage][key] for stage in ("extraction", "attribution", "relevance"))
        assert total == view["usage"][key], key
    assert view["batch"]["completed"] == view["usage"]["llm_calls"] == 19
    # the claim cache holds the one ground truth's claims, as any run's: relevance adds none
    assert lane.sql("SELECT count(*) FROM claim_cache")[0][0] == cache_before + 1


def test_judged_in_the_lane_asks_a_missing_passage_again_once_then_fails_naming_it(
    lane: Lane, provider: StubServer
) -> None:
    once = {"id": "once", "ground_truth": TRUTH, "context": [R1, "STUB_RELEVANCE_DROP_ONCE"]}
    always = {"id": "always", "ground_truth": TRUTH, "context": [R2, "STUB_RELEVANCE_DROP_ALWAYS"]}
    run_id = lane.submit([once, always], precision="judged")
    view = lane.poll_until_ended(run_id)
    found = lane.items(run_id)
    errors = {key: item["error"] for key, item in found.items()}
    assert view["counts"]["succeeded"] == 1 and view["counts"]["failed"] == 1, errors
    assert found["once"]["context_precision"] == 1.0
    assert [p["relevant"] for p in found["once"]["passages"]] == [True, False]
    assert found["always"]["error"] == (
        "the judge gave no relevance verdict for passage(s) 1, asked twice"
    )
    assert found["always"]["context_precision"] is None
    assert provider.stats()["batches"]["lines_by_schema"]["context_relevance"] == 4
    assert view["usage"]["by_stage"]["relevance"]["llm_calls"] == 4
    assert found["once"]["llm_calls"] == found["always"]["llm_calls"] == 4
    # batches: extraction, attribution, relevance, then the two re-asks of passage 1
    assert provider.calls() == [] and len(provider.batches()) == 4


def test_judged_in_the_lane_repairs_a_malformed_relevance_answer_keeping_the_verdicts(
    lane: Lane, provider: StubServer
) -> None:
    item = {
        "id": "broken",
        "ground_truth": TRUTH,
        "context": [J1, R1, "STUB_RELEVANCE_BROKEN_ONCE"],
    }
    run_id = lane.submit([item], precision="judged")
    view = lane.poll_until_ended(run_id)
    found = lane.items(run_id)["broken"]
    assert found["status"] == "succeeded", found["error"]
    assert found["context_precision"] == 0.5 and found["first_relevant_rank"] == 2
    assert [p["relevant"] for p in found["passages"]] == [False, True, False]
    # the attribution verdicts the relevance line carried survive its repair request
    assert [c["verdict"] for c in found["claims"]] == ["yes", "no"]
    assert found["passages"][1]["claims"] == [0] and found["score"] == 0.5
    assert provider.stats()["batches"]["lines_by_schema"]["context_relevance"] == 2
    assert view["usage"]["by_stage"]["relevance"]["llm_calls"] == 2
