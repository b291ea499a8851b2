"""`claims_from` on the service: a rejudge through the API (`recallq rejudge RUN --api`) makes
no extraction call and attributes the same claims; `agreement --against` measures the judge
against itself with the stub's flip modes; another project's run is not a source. A real API
(keys required), a real Celery worker, Postgres, Redis, and litellm to the stub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, delete

from recallq.state.claim_cache import ClaimCache
from recallq.state.tables import ClaimCache as CachedClaims
from tests.integration.secured import (
    api_and_worker,
    bearer,
    completed_run,
    error_of,
    make_key,
    recallq,
    secured_env,
    submit,
)

N_ITEMS = 60  # three claims each: 180 claims


def _items(tag: str) -> list[dict[str, Any]]:
    """Items of three claims each, about one in two supported by the context."""
    items = []
    for i in range(N_ITEMS):
        claims = [f"Station {tag}{i} reported {word} rainfall" for word in ("heavy", "light", "no")]
        context = [f"Station {tag}{i} reported heavy rainfall.", "Unrelated passage."]
        if i % 2:
            context.append(f"Station {tag}{i} reported light rainfall.")
        items.append(
            {"id": f"doc/{i}", "ground_truth": ". ".join(claims) + ".", "context": context}
        )
    return items


@pytest.fixture(scope="module")
def env(service_env: dict[str, str]) -> dict[str, str]:
    return secured_env(service_env, submissions_per_minute=0, max_active_runs_per_project=1000)


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        "write": make_key(env, "judges", "write", label="judges-writer"),
        "other": make_key(env, "elsewhere-cf", "admin", label="cf-outsider"),
    }


@pytest.fixture(scope="module")
def api(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    with api_and_worker(env) as url:
        yield url


def _scored_run(api: str, key: str, tag: str) -> str:
    run = completed_run(api, key, {"items": _items(tag), "model": "stub-judge"})
    assert run["counts"]["succeeded"] == N_ITEMS, run
    return str(run["id"])


def _results(api: str, key: str, run_id: str) -> list[dict[str, Any]]:
    lines = httpx.get(
        f"{api}/v1/runs/{run_id}/results", params={"format": "jsonl"}, headers=bearer(key)
    ).text.splitlines()
    return [json.loads(line) for line in lines]


def _claims(api: str, key: str, run_id: str) -> dict[str, list[tuple[str, str]]]:
    items = _results(api, key, run_id)
    return {i["id"]: [(c["text"], c["verdict"]) for c in i["claims"]] for i in items}


def _rejudge(api: str, env: dict[str, str], key: str, run_id: str) -> str:
    cli = {**env, "RECALLQ_API_URL": api, "RECALLQ_API_KEY": key}
    done = recallq(cli, "rejudge", run_id, "--model", "stub-judge", "--quiet", timeout=240)
    assert done.returncode == 0, done.stderr
    (run_id_line,) = [line for line in done.stderr.splitlines() if line.startswith("recallq: run ")]
    new = run_id_line.removeprefix("recallq: run ").strip()
    assert "recallq rejudge" in done.stdout and new in done.stdout  # the summary, as submit --wait
    view = httpx.get(f"{api}/v1/runs/{new}", headers=bearer(key)).json()
    assert view["counts"]["succeeded"] == N_ITEMS and view["name"].startswith("rejudge of")
    return new


def _against(api: str, key: str, run_id: str, other: str) -> dict[str, Any]:
    response = httpx.get(
        f"{api}/v1/runs/{run_id}/agreement", params={"against": other}, headers=bearer(key)
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_rejudge_through_the_api_extracts_nothing_and_judges_the_same_claims(
    api: str, env: dict[str, str], keys: dict[str, str], clean_stub: Any
) -> None:
    clean_stub.configure(flip_rate=0.3, flip_per_call=False, flip_seed=5)
    source = _scored_run(api, keys["write"], "d")
    clean_stub.reset()
    again = _rejudge(api, env, keys["write"], source)
    schemas = clean_stub.stats()["by_schema"]
    assert schemas.get("claim_attribution", 0) >= N_ITEMS
    assert not schemas.get("claim_extraction") and not schemas.get("claim_extraction_packed")

    first, second = _claims(api, keys["write"], source), _claims(api, keys["write"], again)
    assert first == second  # the same claims, and deterministic flips give the same verdicts
    assert sum(len(claims) for claims in first.values()) == 3 * N_ITEMS
    reasons = [c["reason"] for i in _results(api, keys["write"], again) for c in i["claims"]]
    assert 20 <= reasons.count("stub: flipped") <= 90  # the judge did err, the same way twice
    body = _against(api, keys["write"], again, source)
    assert body["labelled_claims"] == 3 * N_ITEMS
    assert body["flip_rate"] == 0.0 and body["flipped"] == [] and body["kappa"] == 1.0
    shown = recallq(
        {**env, "RECALLQ_API_URL": api, "RECALLQ_API_KEY": keys["write"]},
        "agreement",
        again,
        "--against",
        source,
    )
    assert shown.returncode == 0 and "verdicts flipped: 0" in shown.stdout, shown.stderr


def test_the_same_judge_with_random_flips_disagrees_with_itself_at_2p_1_minus_p(
    api: str, env: dict[str, str], keys: dict[str, str], clean_stub: Any
) -> None:
    p = 0.2
    clean_stub.configure(flip_rate=p, flip_per_call=True, flip_seed=11)
    try:
        source = _scored_run(api, keys["write"], "r")
        again = _rejudge(api, env, keys["write"], source)
    finally:
        clean_stub.configure(flip_rate=0.0, flip_per_call=False)
    body = _against(api, keys["write"], again, source)
    assert body["labelled_claims"] == 3 * N_ITEMS
    expected = 2 * p * (1 - p)  # 0.32: one of the two verdicts flipped, not both
    low, high = body["flip_rate_ci95"]
    # 180 claims: a standard error of about 0.035; the band is about 3 of them
    assert abs(body["flip_rate"] - expected) <= 0.1, body["flip_rate"]
    assert low < body["flip_rate"] < high
    assert len(body["flipped"]) == round(body["flip_rate"] * 3 * N_ITEMS)


def test_claims_from_names_a_run_of_the_same_project_only(
    api: str, keys: dict[str, str], clean_stub: Any
) -> None:
    clean_stub.configure(flip_rate=0.0)
    body = {"items": _items("o")[:3], "model": "stub-judge"}
    outsider = completed_run(api, keys["other"], body)["id"]

    answers = {}
    for source in (outsider, "00000000-0000-0000-0000-000000000000"):
        body = {"items": _items("o")[:3], "model": "stub-judge", "claims_from": source}
        refused = submit(api, keys["write"], body)
        assert error_of(refused) == (422, "claims_from_not_found")
        answers[source] = refused.json()["error"]["message"].replace(source, "RUN")
        ndjson = httpx.post(
            f"{api}/v1/runs",
            params={"model": "stub-judge", "claims_from": source},
            content="".join(json.dumps(item) + "\n" for item in _items("o")[:3]),
            headers={**bearer(keys["write"]), "Content-Type": "application/x-ndjson"},
        )
        assert error_of(ndjson) == (422, "claims_from_not_found")
    assert len(set(answers.values())) == 1  # another project's run reads as a missing one
    bad = submit(api, keys["write"], {"items": _items("o")[:3], "claims_from": 7})
    assert error_of(bad)[0] == 422
    against = httpx.get(f"{api}/v1/runs/{outsider}/agreement", headers=bearer(keys["write"]))
    assert error_of(against)[0] == 404


def test_an_item_the_source_run_has_no_claims_for_is_extracted_as_usual(
    api: str, keys: dict[str, str], clean_stub: Any
) -> None:
    clean_stub.configure(flip_rate=0.0)
    source = _scored_run(api, keys["write"], "x")
    items = _items("x")[:4]
    items[1]["id"] = "doc/new"  # not in the source run
    items[2]["ground_truth"] = "Station x2 reported hail."  # another ground truth
    clean_stub.reset()
    run = completed_run(
        api, keys["write"], {"items": items, "model": "stub-judge", "claims_from": source}
    )
    assert run["counts"]["succeeded"] == 4
    schemas = clean_stub.stats()["by_schema"]
    # the unmatched items are extracted as usual: doc/new's ground truth is in the claim cache
    # (the source run extracted it), doc/2's new one takes the one extraction call
    extracted = schemas.get("claim_extraction", 0) + schemas.get("claim_extraction_packed", 0)
    assert extracted == 1
    claims = _claims(api, keys["write"], run["id"])
    assert [text for text, _ in claims["doc/2"]] == ["Station x2 reported hail"]
    assert len(claims["doc/new"]) == 3 and len(claims["doc/0"]) == 3


def test_an_estimate_counts_no_extraction_for_the_claims_a_run_takes(
    api: str, env: dict[str, str], keys: dict[str, str], clean_stub: Any
) -> None:
    """A dry run with `claims_from` makes the submission's checks (a missing source is the
    same 422) and prices the extraction the run will not make at nothing, as for a rejudge
    with another model, whose claim cache holds nothing yet."""
    clean_stub.configure(flip_rate=0.0)
    items = _items("e")[:6]
    source = completed_run(api, keys["write"], {"items": items, "model": "stub-judge"})["id"]
    engine = create_engine(env["RECALLQ_DATABASE_URL"])
    cached = [ClaimCache.key(i["ground_truth"], "stub-judge", project="judges") for i in items]
    with engine.begin() as conn:
        assert conn.execute(delete(CachedClaims).where(CachedClaims.key.in_(cached))).rowcount == 6
    engine.dispose()

    def estimate(**fields: Any) -> httpx.Response:
        body = {"items": items, "model": "stub-judge", **fields}
        return submit(api, keys["write"], body, params={"dry_run": "true"})

    plain, taken = estimate().json(), estimate(claims_from=source).json()
    assert plain["extraction_calls"] >= 1 and plain["cache_hits"] == 0
    assert taken["extraction_calls"] == 0 and taken["cache_hits"] == 0
    assert taken["attribution_calls"] == plain["attribution_calls"] == 6
    assert taken["prompt_tokens"] < plain["prompt_tokens"]
    missing = estimate(claims_from="00000000-0000-0000-0000-000000000000")
    assert error_of(missing) == (422, "claims_from_not_found")


def _label_by_the_rule(api: str, key: str, run_id: str) -> None:
    """Draw every item as the random sample and label each claim with the stub's own rule:
    a flipped verdict's opposite (the person is right where the judge erred)."""
    drawn = httpx.post(
        f"{api}/v1/runs/{run_id}/labels/sample",
        json={"size": N_ITEMS, "seed": 3},
        headers=bearer(key),
    )
    assert drawn.status_code in (200, 201), drawn.text
    rows = []
    for item in _results(api, key, run_id):
        for claim in item["claims"]:
            right = claim["verdict"]
            if claim["reason"] == "stub: flipped":
                right = "no" if right == "yes" else "yes"
            rows.append({"item_id": item["id"], "claim_index": claim["index"], "verdict": right})
    stored = httpx.post(
        f"{api}/v1/runs/{run_id}/labels",
        content="".join(json.dumps(row) + "\n" for row in rows),
        headers={**bearer(key), "Content-Type": "application/x-ndjson"},
    )
    assert stored.status_code == 200 and stored.json()["stored"] == len(rows), stored.text


def test_compare_corrects_the_difference_when_both_runs_have_sampled_labels(
    api: str, env: dict[str, str], keys: dict[str, str], clean_stub: Any
) -> None:
    clean_stub.configure(flip_rate=0.3, flip_per_call=False, flip_seed=8)
    try:
        base = _scored_run(api, keys["write"], "c")
    finally:
        clean_stub.configure(flip_rate=0.0)
    candidate = _scored_run(api, keys["write"], "c")  # the same items, a judge that does not err
    params = {"base": base, "candidate": candidate}
    plain = httpx.get(f"{api}/v1/compare", params=params, headers=bearer(keys["write"])).json()
    assert plain["corrected"] is None and plain["mean_difference"] != 0  # the judges differ
    _label_by_the_rule(api, keys["write"], base)
    _label_by_the_rule(api, keys["write"], candidate)
    body = httpx.get(f"{api}/v1/compare", params=params, headers=bearer(keys["write"])).json()
    corrected = body["corrected"]
    assert corrected["labelled_items"] == {"base": N_ITEMS, "candidate": N_ITEMS}
    assert corrected["judge_mean_difference"] == body["mean_difference"]
    # every item labelled by the truth, which is the same for both: no true difference (up
    # to the stored scores' rounding to 2 decimals: 1/3 is kept as 0.33)
    assert abs(corrected["mean_difference"]) < 0.01 < abs(body["mean_difference"])
    low, high = corrected["ci95"]
    assert low <= 0 <= high
    shown = recallq(
        {**env, "RECALLQ_API_URL": api, "RECALLQ_API_KEY": keys["write"]},
        "compare",
        base,
        candidate,
    )
    assert shown.returncode == 0 and "corrected_difference" in shown.stdout, shown.stderr
    with httpx.Client(base_url=api, timeout=60) as browser:
        signed_in = browser.post("/signin", data={"key": keys["write"], "next": "/"})
        assert signed_in.status_code == 303, signed_in.text
        page = browser.get("/compare", params=params)
    assert page.status_code == 200 and 'data-testid="corrected-difference"' in page.text
