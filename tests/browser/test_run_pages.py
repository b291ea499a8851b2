"""The runs, run, items and item pages in chromium, each number checked against the JSON API
for the same run (GET /v1/runs/{id}, its items and one item)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.browser import evalsets
from tests.browser.conftest import FAILING, ITEMS, MODEL, Stack, shoot, sign_in


def _text(locator: Any) -> str:
    return " ".join(locator.inner_text().split())


def _ids(page: Any, selector: str) -> list[str]:
    return [row.get_attribute("data-item-id") for row in page.locator(selector).all()]


def test_a_submitted_run_is_on_the_runs_page(stack: Stack, context: Any, screenshots: Path) -> None:
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    run_a, run_b = stack.runs["retriever_a"], stack.runs["retriever_b"]
    run = stack.get(f"/v1/runs/{run_a}")
    page.goto(f"{stack.url}/")
    row = page.locator(f'tr[data-run-id="{run_a}"]')
    expect(row).to_have_count(1)
    assert _text(row.locator("td[data-field=name]")) == "retriever-a"
    assert _text(row.locator("td[data-field=status]")) == run["status"]
    assert MODEL in _text(row.locator("td[data-field=model]"))
    assert str(run["counts"]["total"]) in _text(row.locator("td[data-field=items]"))
    shoot(page, screenshots, "runs")

    listed = [r.get_attribute("data-run-id") for r in page.locator("tr[data-run-id]").all()]
    newest_first = [r["id"] for r in stack.get("/v1/runs", limit=100)["runs"]]
    assert listed == newest_first[: len(listed)]

    page.fill("form#run-filter input[name=name]", "retriever-b")
    with page.expect_navigation():
        page.press("form#run-filter input[name=name]", "Enter")
    listed = [r.get_attribute("data-run-id") for r in page.locator("tr[data-run-id]").all()]
    assert listed == [run_b]

    page.goto(f"{stack.url}/")
    page.select_option("form#run-filter select[name=status]", "cancelled")
    page.wait_for_load_state()
    if "status=cancelled" not in page.url:  # a form without a script submits on Enter
        with page.expect_navigation():
            page.press("form#run-filter input[name=name]", "Enter")
    statuses = {_text(cell) for cell in page.locator("td[data-field=status]").all()}
    assert statuses <= {"cancelled"} and page.locator(f'tr[data-run-id="{run_a}"]').count() == 0


def test_the_run_page_shows_the_runs_numbers(stack: Stack, context: Any, screenshots: Path) -> None:
    run_id = stack.runs["retriever_a"]
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    page.goto(f"{stack.url}/runs/{run_id}")
    run = stack.get(f"/v1/runs/{run_id}")
    summary = run["summary"]

    assert _text(page.locator("[data-testid=run-status]")) == run["status"] == "completed"
    counts = {
        cell.get_attribute("data-count"): int(cell.get_attribute("data-value"))
        for cell in page.locator("[data-testid=counts] [data-count]").all()
    }
    assert counts == run["counts"]
    assert counts["failed"] == len(FAILING) and counts["succeeded"] == ITEMS - len(FAILING)
    mean = page.locator("[data-testid=mean-score]").get_attribute("data-value")
    assert float(mean) == summary["mean_score"]
    interval = page.locator("[data-testid=mean-interval]")
    low, high = (float(interval.get_attribute(f"data-{end}")) for end in ("low", "high"))
    assert low <= summary["mean_score"] <= high
    if "mean_ci95" in summary:
        assert [low, high] == summary["mean_ci95"]

    bars = page.locator("svg[data-testid=histogram] rect[data-count]").all()
    assert sum(int(bar.get_attribute("data-count")) for bar in bars) == summary["scored_items"]
    assert [int(bar.get_attribute("data-count")) for bar in bars] == summary["histogram"]["counts"]
    edges = summary["histogram"]["edges"]
    assert [
        (float(bar.get_attribute("data-low")), float(bar.get_attribute("data-high")))
        for bar in bars
    ] == list(zip(edges, edges[1:], strict=False))

    usage = _text(page.locator("[data-testid=usage]"))
    assert f"{run['usage']['llm_calls']:,}" in usage or str(run["usage"]["llm_calls"]) in usage
    assert page.locator("[data-testid=waiting]").count() == 0
    groups = page.locator("[data-testid=failures] [data-error-group]").all()
    assert len(groups) == len(run["failures"]) == 1
    assert sum(int(group.get_attribute("data-count")) for group in groups) == len(FAILING)
    assert "STUB_HTTP_400" in _text(page.locator("[data-testid=failures]"))

    fields = page.locator("select[name=by] option").all_inner_texts()
    assert {"category", "source"} <= {field.strip() for field in fields}
    table = page.locator("table[data-testid=by-metadata]")
    by = table.get_attribute("data-by")
    groups = stack.get(f"/v1/runs/{run_id}", by=by)["by_group"]
    shown = {
        row.get_attribute("data-group"): row.locator("[data-value]").get_attribute("data-value")
        for row in table.locator("tr[data-group]").all()
    }
    assert {group: float(mean) for group, mean in shown.items()} == {
        group: values["mean_score"] for group, values in groups.items()
    }
    if by == "category":
        assert set(shown) == set(evalsets.CATEGORIES)
    shoot(page, screenshots, "run-page", readme=True)


def test_the_items_page_filters_sorts_and_pages(stack: Stack, context: Any) -> None:
    run_id = stack.runs["retriever_a"]
    base = f"{stack.url}/runs/{run_id}/items"
    items = stack.get(f"/v1/runs/{run_id}/items", limit=1000)["items"]
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    rows = "table[data-testid=items] tr[data-item-id]"

    page.goto(base)
    seen = _ids(page, rows)
    while page.locator("a[data-testid=next-page]").count():
        page.click("a[data-testid=next-page]")
        seen += _ids(page, rows)
    assert sorted(seen) == sorted(item["id"] for item in items)

    page.goto(f"{base}?status=failed")
    assert sorted(_ids(page, rows)) == [f"q{i}" for i in FAILING]
    assert {row.get_attribute("data-status") for row in page.locator(rows).all()} == {"failed"}

    page.goto(f"{base}?min_score=0.5&max_score=1&sort=score")
    in_range = [i for i in items if i["score"] is not None and 0.5 <= i["score"] <= 1]
    assert sorted(_ids(page, rows)) == sorted(i["id"] for i in in_range)
    scores = [float(row.get_attribute("data-score")) for row in page.locator(rows).all()]
    assert scores == sorted(scores) and all(0.5 <= s <= 1 for s in scores)

    page.goto(f"{base}?sort=-score&status=succeeded")
    scores = [float(row.get_attribute("data-score")) for row in page.locator(rows).all()]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0

    page.goto(f"{base}?q=Lovelace")
    expected = [i["id"] for i in items if "Lovelace" in i["ground_truth"]]
    assert expected and sorted(_ids(page, rows)) == sorted(expected)

    # bad filters are a clear 4xx, never a 500
    for query in ("min_score=abc", "sort=drop", "cursor=%00%ff", "q=" + "x" * 5000):
        response = page.goto(f"{base}?{query}")
        assert response is not None and 400 <= response.status < 500, query


def test_the_items_page_says_how_many_items_a_text_matches(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    run_id = stack.runs["retriever_a"]
    base = f"{stack.url}/runs/{run_id}/items"
    items = stack.get(f"/v1/runs/{run_id}/items", limit=1000)["items"]
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    count = page.locator("[data-testid=match-count]")

    for text in ("Lovelace", "q1", "nothing-has-this"):
        page.goto(f"{base}?q={text}")
        expected = [i for i in items if text.lower() in (i["id"] + " " + i["ground_truth"]).lower()]
        # a 24-item run is well inside the scan bound: the count is exact, not a lower bound
        noun = "item matches" if len(expected) == 1 else "items match"
        expect(count).to_have_text(f"{len(expected)} {noun}.")
        assert count.get_attribute("data-exact") == "true"
    shoot(page, screenshots, "items-match-count")

    page.goto(f"{base}?q=Lovelace&status=failed")
    failed = [i for i in items if i["status"] == "failed" and "Lovelace" in i["ground_truth"]]
    assert count.get_attribute("data-matched") == str(len(failed))

    page.goto(base)  # no text filter: nothing to count
    assert page.locator("[data-testid=match-count]").count() == 0


def test_a_model_without_a_price_reads_not_priced_rather_than_free(
    stack: Stack, context: Any
) -> None:
    # the stub judge has no price in the models file: its calls cost $0 because nobody knows
    run_id = stack.runs["retriever_a"]
    usage = stack.get(f"/v1/runs/{run_id}")["usage"]
    assert usage["llm_calls"] > 0 and usage["cost_usd"] == 0
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    row = page.locator(f'tr[data-run-id="{run_id}"]')
    assert _text(row.locator("td[data-field=cost]")) == "not priced"
    page.goto(f"{stack.url}/runs/{run_id}")
    usage_table = page.locator("[data-testid=usage]")
    assert _text(usage_table.locator("td[data-field=cost]")) == "not priced"
    stages = [_text(cell) for cell in usage_table.locator("tr.stage td").all()]
    spent = [s for s in usage["by_stage"].values() if s["llm_calls"]]
    assert len([s for s in stages if s.endswith("· not priced")]) == len(spent)
    assert "$0.0000" not in _text(usage_table)


def test_an_item_page_shows_each_claim_as_stored(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    run_id = stack.runs["retriever_a"]
    item = stack.get(f"/v1/runs/{run_id}/items/q2")  # two facts of three found
    assert {c["verdict"] for c in item["claims"]} == {"yes", "no"}
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    page.goto(f"{stack.url}/runs/{run_id}/items/q2")

    assert " ".join(item["ground_truth"].split()) in _text(
        page.locator("[data-testid=ground-truth]")
    )
    supporting: dict[int, set[int]] = {}
    for claim in item["claims"]:
        li = page.locator(f'li[data-claim-index="{claim["index"]}"]')
        expect(li).to_have_count(1)
        verdict = "supported" if claim["verdict"] == "yes" else "missing"
        assert li.get_attribute("data-verdict") == verdict
        assert _text(li.locator("[data-field=claim]")) == claim["text"]
        assert _text(li.locator("[data-field=reason]")) == claim["reason"]
        assert ("found in no passage" in _text(li)) == (verdict == "missing")
        for j in claim["context_indices"]:
            supporting.setdefault(j, set()).add(claim["index"])
    assert supporting, "no claim of q2 names a passage"

    passages = page.locator("[data-passage-index]")
    expect(passages).to_have_count(len(item["context"]))
    for j, text in enumerate(item["context"]):
        passage = page.locator(f'[data-passage-index="{j}"]')
        classes = (passage.get_attribute("class") or "").split()
        assert ("supports" in classes) == (j in supporting), (j, classes)
        for claim_index in supporting.get(j, ()):
            assert passage.locator(f'mark[data-claim="{claim_index}"]').count() >= 1
        if j not in supporting:
            assert passage.locator("mark[data-claim]").count() == 0
        # the marks wrap parts of the passage: its words are all still there, in order
        assert _text(passage).find(" ".join(text.split()[:3])) >= 0
    shoot(page, screenshots, "item-page", readme=True)

    failed = stack.get(f"/v1/runs/{run_id}/items/q{FAILING[0]}")
    page.goto(f"{stack.url}/runs/{run_id}/items/q{FAILING[0]}")
    assert failed["error"] and "STUB_HTTP_400" in _text(page.locator("body"))
    shoot(page, screenshots, "item-page-failed")


def test_the_run_page_follows_a_run_until_it_ends(stack: Stack, context: Any) -> None:
    stack.stub.configure(latency_ms=400)
    try:
        run_id = stack.submit(evalsets.plain(40, "live"), "live")
        page = sign_in(context, stack.url, stack.keys["alpha_read"])
        page.goto(f"{stack.url}/runs/{run_id}")
        assert _text(page.locator("[data-testid=run-status]")) in ("queued", "running")
        # no reload here: the page refreshes itself while the run is active
        expect(page.locator("[data-testid=run-status]")).to_have_text(
            re.compile(r"\s*completed\s*"), timeout=90_000
        )
    finally:
        stack.stub.configure(latency_ms=0)
    run = stack.get(f"/v1/runs/{run_id}")
    page.wait_for_load_state()
    succeeded = page.locator('[data-testid=counts] [data-count="succeeded"]')
    assert int(succeeded.get_attribute("data-value")) == run["counts"]["succeeded"] == 40
