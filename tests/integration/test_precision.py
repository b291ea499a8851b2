"""Context precision through the API and a real Celery worker calling the stub over HTTP
through litellm: `cited` from attribution's citations (no extra call) and `judged` (one
context_relevance call per item with a context), both equal to the average precision computed
by hand; ids without a call; the item object's passages; the summary; compare; exports."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.services import Process, start_api, start_worker, wait_for_run

R1 = "Marie Curie discovered polonium in 1898."
R2 = "Marie Curie discovered radium with Pierre."
J1 = "Lighthouses guide ships along rocky coasts."
J2 = "Volcanoes erupt molten basalt rock."
TRUTH = "Marie Curie discovered polonium. Marie Curie discovered radium."

#: id -> (passages, whether each is relevant: it states a fact of the ground truth)
CASES: dict[str, list[str]] = {
    "first": [R1, R2, J1, J2],
    "last": [J1, J2, R1],
    "interleaved": [J1, R1, J2, R2],
    "absent": [J1, J2],
    "duplicated": [R1, J1, R1],
}


def by_hand(passages: list[str]) -> float:
    hits, total = 0, 0.0
    for k, passage in enumerate(passages, start=1):
        if passage in (R1, R2):
            hits += 1
            total += hits / k
    return round(total / hits, 4) if hits else 0.0


def items(tag: str, reverse: bool = False) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = [
        {
            "id": key,
            "ground_truth": f"{TRUTH} {tag}.",
            "context": list(reversed(passages)) if reverse else passages,
        }
        for key, passages in CASES.items()
    ]
    made += [
        {"id": "no-context", "ground_truth": f"{TRUTH} {tag}.", "context": []},
        {"id": "no-ground-truth", "ground_truth": None, "context": [R1]},
        {
            "id": "ids",
            "ground_truth": f"{TRUTH} {tag}.",
            "context": [J1, R1],
            "retrieved_context_ids": ["j1", "r1", "r2"],
            "reference_context_ids": ["r1", "r2", "r9"],
        },
    ]
    return made


@pytest.fixture(scope="module")
def api(service_env: dict[str, str]) -> Iterator[str]:
    worker: Process = start_worker(service_env)
    process, url = start_api(service_env)
    yield url
    process.stop()
    worker.stop()


def submit(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/runs", json={"model": "stub-judge", **body}, timeout=30)
    assert response.status_code == 202, response.text
    return wait_for_run(url, response.json()["id"])


def item_views(url: str, run_id: str) -> dict[str, dict[str, Any]]:
    page = httpx.get(f"{url}/v1/runs/{run_id}/items", params={"limit": 100}, timeout=30).json()
    return {item["id"]: item for item in page["items"]}


def calls(stub) -> Counter:
    return Counter(c["schema"] for c in stub.calls() if c["status"] == 200)


def check_precision(found: dict[str, dict[str, Any]], reverse: bool = False) -> None:
    for key, passages in CASES.items():
        shown = list(reversed(passages)) if reverse else passages
        item = found[key]
        assert item["context_precision"] == by_hand(shown), key
        relevant = [p in (R1, R2) for p in shown]
        assert [p["relevant"] for p in item["passages"]] == relevant, key
        assert [p["index"] for p in item["passages"]] == list(range(len(shown)))
        first = next((k for k, r in enumerate(relevant, start=1) if r), None)
        assert item["first_relevant_rank"] == first, key
        for passage in item["passages"]:  # the claims that cite it
            cited = [c["index"] for c in item["claims"] if passage["index"] in c["context_indices"]]
            assert passage["claims"] == (cited if passage["relevant"] else []), key
    perfect = "last" if reverse else "first"
    assert found[perfect]["context_precision"] == 1.0  # exactly, no epsilon
    assert found["absent"]["context_precision"] == 0.0
    for key in ("no-context", "no-ground-truth"):
        assert found[key]["context_precision"] is None and found[key]["passages"] is None
    ids = found["ids"]
    assert ids["context_precision"] == 0.5  # [J1, R1], never reversed
    assert ids["id_precision"] == round((1 / 2 + 2 / 3) / 2, 4)
    assert ids["id_recall"] == round(2 / 3, 4)
    assert found["first"]["id_precision"] is None and found["first"]["id_recall"] is None


def test_cited_precision_adds_no_call(api, clean_stub) -> None:
    run = submit(api, {"name": "cited", "items": items("cited")})
    assert run["status"] == "completed" and run["counts"]["succeeded"] == 8
    assert run["precision"] == "cited"
    found = item_views(api, run["id"])
    check_precision(found)
    assert all(p["reason"] is None for p in found["first"]["passages"])
    made = calls(clean_stub)
    assert made["context_relevance"] == 0
    assert made["claim_attribution"] == 6  # one per item with a context and a ground truth
    summary = run["summary"]
    expected = [by_hand(p) for p in CASES.values()] + [found["ids"]["context_precision"]]
    assert summary["precision_items"] == 6
    assert summary["mean_context_precision"] == pytest.approx(sum(expected) / 6, abs=1e-4)
    low, high = summary["context_precision_ci95"]
    assert low <= summary["mean_context_precision"] <= high
    assert summary["no_context"] == 1 and summary["no_ground_truth"] == 1
    assert summary["mean_id_precision"] == found["ids"]["id_precision"]
    assert summary["precision_histogram"]["counts"] == [1, 1, 2, 0, 2]
    assert sum(summary["precision_histogram"]["counts"]) == 6
    assert summary["first_relevant_rank"]["1"] == 2  # first, duplicated
    assert "relevance" not in run["usage"]["by_stage"]  # no such stage in a cited run


def test_judged_precision_one_call_per_item_with_context(api, clean_stub) -> None:
    run = submit(api, {"name": "judged", "precision": "judged", "items": items("judged")})
    assert run["status"] == "completed" and run["counts"]["succeeded"] == 8
    assert run["precision"] == "judged"
    found = item_views(api, run["id"])
    check_precision(found)
    assert found["first"]["passages"][0]["reason"] == "stub: states a fact"
    assert found["first"]["passages"][2]["reason"] == "stub: states none"
    made = calls(clean_stub)
    assert made["context_relevance"] == 6
    assert made["claim_attribution"] == 6
    counted = clean_stub.stats()["usage_by_schema"]["context_relevance"]
    relevance = run["usage"]["by_stage"]["relevance"]
    assert relevance["llm_calls"] == counted["calls"] == 6
    assert relevance["prompt_tokens"] == counted["prompt_tokens"]
    assert relevance["completion_tokens"] == counted["completion_tokens"]
    stages = run["usage"]["by_stage"]
    for key in ("llm_calls", "prompt_tokens", "completion_tokens"):
        total = sum(stages[stage][key] for stage in ("extraction", "attribution", "relevance"))
        assert total == run["usage"][key], key


def test_judged_asks_a_missing_passage_again_once_then_fails_naming_it(api, clean_stub) -> None:
    once = {"id": "once", "ground_truth": TRUTH, "context": [R1, "STUB_RELEVANCE_DROP_ONCE"]}
    always = {"id": "always", "ground_truth": TRUTH, "context": [R2, "STUB_RELEVANCE_DROP_ALWAYS"]}
    run = submit(api, {"precision": "judged", "items": [once, always]})
    found = item_views(api, run["id"])
    errors = {key: item["error"] for key, item in found.items()}
    assert run["counts"]["succeeded"] == 1 and run["counts"]["failed"] == 1, errors
    assert found["once"]["context_precision"] == 1.0
    assert [p["relevant"] for p in found["once"]["passages"]] == [True, False]
    assert found["always"]["error"] == (
        "the judge gave no relevance verdict for passage(s) 1, asked twice"
    )
    assert calls(clean_stub)["context_relevance"] == 4


def test_compare_a_retriever_with_its_passages_reversed(api) -> None:
    base = submit(api, {"name": "forward", "items": items("compare")})
    candidate = submit(api, {"name": "reversed", "items": items("compare", reverse=True)})
    check_precision(item_views(api, candidate["id"]), reverse=True)
    result = httpx.get(
        f"{api}/v1/compare", params={"base": base["id"], "candidate": candidate["id"]}
    ).json()
    precision = result["precision"]
    forward = {k: by_hand(p) for k, p in CASES.items()}
    backward = {k: by_hand(list(reversed(p))) for k, p in CASES.items()}
    differences = [backward[k] - forward[k] for k in CASES] + [0.0]  # the ids item
    assert precision["paired"] == 6
    assert precision["mean_difference"] == pytest.approx(sum(differences) / 6, abs=1e-4)
    low, high = precision["ci95"]
    assert low <= precision["mean_difference"] <= high
    largest = precision["largest_changes"][0]
    assert largest["id"] == "last" and largest["difference"] == pytest.approx(1 - 1 / 3, abs=1e-4)


def test_exports_carry_the_passages(api) -> None:
    run = submit(api, {"name": "exports", "items": items("exports")})
    url = f"{api}/v1/runs/{run['id']}/results"
    rows = list(csv.DictReader(io.StringIO(httpx.get(url, params={"format": "passages.csv"}).text)))
    first = [r for r in rows if r["id"] == "first"]
    assert [(r["passage_index"], r["relevant"]) for r in first] == [
        ("0", "True"),
        ("1", "True"),
        ("2", "False"),
        ("3", "False"),
    ]
    assert first[0]["claims"] == "[0]"
    items_csv = list(csv.DictReader(io.StringIO(httpx.get(url, params={"format": "csv"}).text)))
    assert {r["id"]: r["context_precision"] for r in items_csv}["last"] == "0.3333"


@pytest.mark.parametrize(
    "body",
    [
        {"precision": "ranked"},
        {"precision": 1},
    ],
)
def test_a_bad_precision_is_a_422_with_the_one_message(api, body) -> None:
    item = {"id": "x", "ground_truth": "x", "context": ["x"]}
    response = httpx.post(f"{api}/v1/runs", json={**body, "items": [item]}, timeout=30)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"] == 'precision must be "cited", "judged" or "off"'
    ndjson = httpx.post(
        f"{api}/v1/runs",
        params={"precision": "ranked"},
        content=b'{"id": "x", "ground_truth": "x", "context": ["x"]}\n',
        headers={"Content-Type": "application/x-ndjson"},
        timeout=30,
    )
    assert ndjson.status_code == 422
    assert ndjson.json()["error"]["message"] == 'precision must be "cited", "judged" or "off"'


def test_precision_off_stores_none(api) -> None:
    run = submit(api, {"precision": "off", "items": items("off")[:2]})
    assert run["summary"]["mean_context_precision"] is None
    assert all(i["passages"] is None for i in item_views(api, run["id"]).values())
