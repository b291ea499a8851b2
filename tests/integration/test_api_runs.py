"""The API for issue 12 against real Postgres: items as tools write them (aliases, passage
objects, metadata) in JSON and NDJSON bodies, results with item data and per claim, the runs
list, comparisons and slices. No worker runs here: scored runs are scored in this process
with the engine, on the same database."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from recallq.runs.local import local_runtime
from recallq.settings import Settings
from tests.services import start_api

RAGAS = {
    "user_input": "Who wrote Pride and Prejudice?",
    "retrieved_contexts": [{"page_content": "Pride and Prejudice is a novel by Jane Austen."}],
    "response": "Jane Austen.",
    "reference": "Pride and Prejudice was written by Jane Austen.",
    "category": "books",
}
DEEPEVAL = {
    "input": "Where is the Eiffel Tower?",
    "actual_output": "Paris.",
    "expected_output": "The Eiffel Tower is in Paris.",
    "retrieval_context": ["The Eiffel Tower stands in Paris."],
    "context": None,
    "additional_metadata": {"source": "wiki"},
}


@pytest.fixture(scope="module")
def api(service_env: dict[str, str]) -> Iterator[str]:
    process, url = start_api(service_env)
    yield url
    process.stop()


@pytest.fixture(scope="module")
def score(pg_database: str):
    """Score a stored run in this process (the engine of local mode, on the API's database)."""

    def run(run_id: str) -> None:
        runtime, runner = local_runtime(Settings(database_url=pg_database), concurrency=2)
        try:
            runner.send_dispatch(run_id)  # busy from here until its last item ended
            deadline = time.monotonic() + 60
            while not runner.idle:
                time.sleep(0.05)
                assert time.monotonic() < deadline
        finally:
            runner.stop()
            runtime.close()

    return run


def _error(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    return response.status_code, body["error"]["code"]


def _submit(api: str, items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    response = httpx.post(f"{api}/v1/runs", json={"items": items, **fields}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()


def test_ragas_and_deepeval_items_in_json_and_ndjson_bodies(api: str, score) -> None:
    run = _submit(api, [{"id": "r", **RAGAS}, {"id": "d", **DEEPEVAL}], name="tools")
    lines = "".join(json.dumps(item) + "\n" for item in ({"id": "r", **RAGAS}, DEEPEVAL))
    streamed = httpx.post(
        f"{api}/v1/runs",
        content=lines.encode(),
        headers={"content-type": "application/x-ndjson"},
        timeout=30,
    )
    assert streamed.status_code == 202, streamed.text
    for run_id in (run["id"], streamed.json()["id"]):
        score(run_id)
        view = httpx.get(f"{api}/v1/runs/{run_id}").json()
        assert view["status"] == "completed" and view["counts"]["succeeded"] == 2
        assert view["summary"]["mean_score"] == 1.0
        item = httpx.get(f"{api}/v1/runs/{run_id}/items/r").json()
        assert item["input"] == RAGAS["user_input"] and item["output"] == "Jane Austen."
        assert item["context"] == ["Pride and Prejudice is a novel by Jane Austen."]
        assert item["metadata"] == {"category": "books"}
    deepeval = httpx.get(f"{api}/v1/runs/{run['id']}/items/d").json()
    assert deepeval["metadata"] == {"additional_metadata": {"source": "wiki"}}
    assert deepeval["ground_truth"] == "The Eiffel Tower is in Paris."


def test_errors_about_fields_name_the_item_and_the_field(api: str) -> None:
    typo = httpx.post(
        f"{api}/v1/runs", json={"items": [{"id": "q", "groundtruth": "x", "context": ["c"]}]}
    )
    assert _error(typo) == (422, "invalid_request")
    assert (
        "item 0 (q): unknown field 'groundtruth'; did you mean" in typo.json()["error"]["message"]
    )
    passage = httpx.post(
        f"{api}/v1/runs", json={"items": [{"id": "q", "context": [{"url": "x", "score": 1}]}]}
    )
    message = passage.json()["error"]["message"]
    assert "item 0 (q): context passage 0 has no 'text', 'page_content' or 'content'" in message
    assert "(its keys: 'score', 'url')" in message
    too_big = httpx.post(
        f"{api}/v1/runs", json={"items": [{"id": "q", "context": ["c"], "blob": "x" * 20_000}]}
    )
    assert _error(too_big) == (422, "invalid_request")
    assert "above the 16 KiB limit" in too_big.json()["error"]["message"]


def test_results_with_and_without_item_data_and_per_claim(api: str, score) -> None:
    items: list[dict[str, Any]] = [
        {
            "id": "a",
            "reference": "Oslo is in Norway. Lima is in Peru.",
            "contexts": ["Oslo is in Norway."],
            "tag": 1,
        },
        {"id": "b", "reference": "Rome is in Italy.", "contexts": ["Rome is in Italy."]},
    ]
    run_id = _submit(api, items)["id"]
    score(run_id)
    full = [
        json.loads(line) for line in httpx.get(f"{api}/v1/runs/{run_id}/results").text.splitlines()
    ]
    assert full[0]["metadata"] == {"tag": 1} and full[0]["ground_truth"].startswith("Oslo")
    assert full[1]["metadata"] is None and full[1]["context"] == ["Rome is in Italy."]
    lean = httpx.get(f"{api}/v1/runs/{run_id}/results", params={"item_data": "false"}).text
    assert "ground_truth" not in json.loads(lean.splitlines()[0])
    page = httpx.get(f"{api}/v1/runs/{run_id}/items", params={"item_data": "false"}).json()
    assert "input" not in page["items"][0] and page["items"][0]["claims_total"] == 2
    rows = list(
        csv.DictReader(
            io.StringIO(
                httpx.get(f"{api}/v1/runs/{run_id}/results", params={"format": "claims.csv"}).text
            )
        )
    )
    assert [(r["id"], r["claim_index"], r["verdict"]) for r in rows] == [
        ("a", "0", "yes"),
        ("a", "1", "no"),
        ("b", "0", "yes"),
    ]
    assert rows[0]["context_indices"] == "[0]"
    item_rows = list(
        csv.DictReader(
            io.StringIO(httpx.get(f"{api}/v1/runs/{run_id}/results", params={"format": "csv"}).text)
        )
    )
    assert json.loads(item_rows[0]["metadata"]) == {"tag": 1} and item_rows[1]["metadata"] == ""
    # and a column per metadata field (issue 28.7), as the local export and to_pandas() have
    assert [row["metadata.tag"] for row in item_rows] == ["1", ""]
    view = httpx.get(f"{api}/v1/runs/{run_id}", params={"by": "tag"}).json()
    # each item's one passage supports a claim it scored: precision 1 in both slices
    precision = {"mean_context_precision": 1.0, "context_precision_ci95": [1.0, 1.0]}
    assert view["by_group"] == {
        "(missing)": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 1.0, **precision},
        "1": {"items": 1, "scored_items": 1, "failed": 0, "mean_score": 0.5, **precision},
    }
    assert view["summary"]["histogram"]["counts"] == [0, 0, 1, 0, 1]
    assert view["failures"] == [] and view["summary"]["no_ground_truth"] == 0


def test_no_ground_truth_is_counted_apart(api: str, score) -> None:
    items: list[dict[str, Any]] = [
        {"id": "x", "ground_truth": None, "context": ["c"]},
        {"id": "y", "ground_truth": "  ", "context": ["c"]},
        {"id": "z", "ground_truth": "Cats purr.", "context": ["Cats purr."]},
    ]
    run_id = _submit(api, items)["id"]
    score(run_id)
    summary = httpx.get(f"{api}/v1/runs/{run_id}").json()["summary"]
    assert summary["no_ground_truth"] == 2 and summary["scored_items"] == 3


def test_no_context_is_counted_apart(api: str, score) -> None:
    items: list[dict[str, Any]] = [
        {"id": "empty", "ground_truth": "Cats purr.", "context": []},
        {"id": "neither", "ground_truth": None, "context": []},  # counted as no ground truth
        {"id": "fine", "ground_truth": "Cats purr.", "context": ["Cats purr."]},
    ]
    run_id = _submit(api, items)["id"]
    score(run_id)
    summary = httpx.get(f"{api}/v1/runs/{run_id}").json()["summary"]
    assert summary["no_context"] == 1 and summary["no_ground_truth"] == 1
    assert summary["scored_items"] == 3


def test_an_item_without_a_context_of_its_own_is_no_context_unless_the_run_has_one(
    api: str, score
) -> None:
    """A dropped context field (missing or null) is the pipeline bug no_context is there to
    catch: counted when the run has no static context, and not when the item takes the run's."""
    items: list[dict[str, Any]] = [
        {"id": "missing", "ground_truth": "Cats purr."},
        {"id": "null", "ground_truth": "Cats purr.", "context": None},
        {"id": "blank", "ground_truth": "Cats purr.", "context": [""]},
        {"id": "fine", "ground_truth": "Cats purr.", "context": ["Cats purr."]},
    ]
    alone = _submit(api, items)["id"]
    score(alone)
    view = httpx.get(f"{api}/v1/runs/{alone}").json()
    assert view["summary"]["no_context"] == 3, view["summary"]
    assert view["summary"]["mean_score"] == 0.25
    shared = httpx.post(f"{api}/v1/runs", json={"items": items, "context": ["Cats purr."]})
    assert shared.status_code == 202, shared.text
    score(shared.json()["id"])
    summary = httpx.get(f"{api}/v1/runs/{shared.json()['id']}").json()["summary"]
    assert summary["no_context"] == 1 and summary["mean_score"] == 0.75, summary  # blank only
    listed = httpx.get(f"{api}/v1/runs", params={"limit": 100}).json()["runs"]
    by_id = {run["id"]: run["summary"]["no_context"] for run in listed}
    assert by_id[alone] == 3 and by_id[shared.json()["id"]] == 1  # the grouped read too


def test_runs_newest_first_paged_and_filtered(api: str) -> None:
    name = f"paging-{time.time_ns()}"
    made = [_submit(api, [{"id": "a", "context": ["c"]}], name=name)["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"name": name, "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = httpx.get(f"{api}/v1/runs", params=params).json()
        assert len(page["runs"]) <= 2
        seen += [run["id"] for run in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1]
    first = httpx.get(f"{api}/v1/runs", params={"name": name, "limit": 1}).json()["runs"][0]
    assert set(first) >= {"id", "status", "counts", "summary", "usage", "created_at"}
    assert first["counts"]["total"] == 1
    httpx.post(f"{api}/v1/runs/{made[0]}/cancel")
    cancelled = httpx.get(f"{api}/v1/runs", params={"name": name, "status": "cancelled"}).json()
    assert [run["id"] for run in cancelled["runs"]] == [made[0]]
    assert _error(httpx.get(f"{api}/v1/runs", params={"cursor": "nope"})) == (422, "invalid_cursor")
    assert _error(httpx.get(f"{api}/v1/runs", params={"status": "odd"}))[0] == 422
    assert _error(httpx.get(f"{api}/v1/runs", params={"limit": 1000}))[0] == 422


def test_compare_two_runs_of_the_same_items(api: str, score) -> None:
    """40 items of 2 claims; the candidate finds both facts for every fourth item, so the
    mean difference is exactly 0.125."""
    base_items, candidate_items = [], []
    for n in range(40):
        first, second = (
            f"Lake {n} is {n + 3} metres deep",
            f"Lake {n} freezes in month {n % 12 + 1}",
        )
        truth = f"{first}. {second}."
        base_items.append(
            {"id": f"l{n}", "reference": truth, "contexts": [first + "."], "zone": n % 2}
        )
        found = [first + ".", second + "."] if n % 4 == 0 else [first + "."]
        candidate_items.append({"id": f"l{n}", "reference": truth, "contexts": found})
    base = _submit(api, base_items)["id"]
    candidate = _submit(api, candidate_items)["id"]
    score(base)
    score(candidate)
    result = httpx.get(
        f"{api}/v1/compare", params={"base": base, "candidate": candidate, "by": "zone"}
    )
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["matched"] == 40 and body["mean_difference"] == 0.125
    assert body["ci95"][0] <= 0.125 <= body["ci95"][1]
    assert (body["improved"], body["regressed"], body["unchanged"]) == (10, 0, 30)
    assert body["unmatched"] == {"base_only": 0, "candidate_only": 0, "unscored": 0}
    assert len(body["largest_changes"]) == 10 and body["largest_changes"][0]["difference"] == 0.5
    assert body["claims_flipped"] == {"no_to_yes": 10, "yes_to_no": 0}
    assert set(body["by_group"]) == {"0", "1"}
    assert body["base_run"]["id"] == base and body["candidate_run"]["id"] == candidate

    assert _error(httpx.get(f"{api}/v1/compare", params={"base": base, "candidate": "nope"})) == (
        404,
        "not_found",
    )
    assert _error(httpx.get(f"{api}/v1/compare", params={"base": base}))[0] == 422
    other_scale = _submit(api, [{"id": "l0", "context": ["c"]}], scale=10)["id"]
    different = httpx.get(f"{api}/v1/compare", params={"base": base, "candidate": other_scale})
    assert _error(different) == (400, "incomparable_runs")
