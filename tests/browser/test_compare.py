"""The compare page against `recallq compare --json` for the same two runs, run as a user runs
it (a subprocess talking to the API with a key), and the side-by-side page of one item."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.browser.conftest import Stack, shoot, sign_in
from tests.integration.secured import recallq


def _cli_compare(stack: Stack, base: str, candidate: str) -> dict[str, Any]:
    done = recallq(stack.cli_env(stack.keys["alpha_read"]), "compare", base, candidate, "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_compare_page_says_what_recallq_compare_says(
    stack: Stack, context: Any, screenshots: Path
) -> None:
    base, candidate = stack.runs["retriever_a"], stack.runs["retriever_b"]
    cli = _cli_compare(stack, base, candidate)
    assert cli["matched"] > 0 and cli["mean_difference"] is not None
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    page.goto(f"{stack.url}/compare?base={base}&candidate={candidate}")

    shown = page.locator("[data-testid=mean-difference]").get_attribute("data-value")
    assert float(shown) == cli["mean_difference"]
    interval = page.locator("[data-testid=compare-interval]")
    assert [float(interval.get_attribute(f"data-{end}")) for end in ("low", "high")] == cli["ci95"]
    for outcome in ("improved", "regressed", "unchanged"):
        count = page.locator(f'[data-count="{outcome}"]').get_attribute("data-value")
        assert int(count) == cli[outcome], outcome
    assert page.locator("svg[data-testid=scatter] circle").count() == cli["matched"]

    # the page may list more of them than the command's ten: the same ones first
    rows = page.locator("table[data-testid=largest-changes] tr[data-item-id]")
    listed = [row.get_attribute("data-item-id") for row in rows.all()]
    assert listed[: len(cli["largest_changes"])] == [c["key"] for c in cli["largest_changes"]]
    shoot(page, screenshots, "compare")

    change = cli["largest_changes"][0]
    with page.expect_navigation():
        rows.first.locator("a[href*='/compare/items/']").first.click()
    assert f"/compare/items/{change['key']}?" in page.url
    base_item = page.locator("[data-testid=base-item]")
    candidate_item = page.locator("[data-testid=candidate-item]")
    assert base_item.count() == candidate_item.count() == 1
    flipped = page.locator("li[data-flipped]")
    flipped_texts = {" ".join(li.inner_text().split()) for li in flipped.all()}
    for flip in change["flipped"]:
        assert any(flip["claim"] in text for text in flipped_texts), flip
    # each flipped claim is marked in both columns
    assert flipped.count() == 2 * len(change["flipped"])
    assert base_item.locator("li[data-flipped]").count() == len(change["flipped"])
    shoot(page, screenshots, "compare-item")


def test_the_compare_page_without_runs_offers_a_choice(stack: Stack, context: Any) -> None:
    base, candidate = stack.runs["retriever_a"], stack.runs["retriever_b"]
    page = sign_in(context, stack.url, stack.keys["alpha_read"])
    response = page.goto(f"{stack.url}/compare")
    assert response is not None and response.status == 200
    form = page.locator("form:has([name=base]):has([name=candidate])")
    assert form.count() == 1
    for field, run_id in (("base", base), ("candidate", candidate)):
        chooser = form.locator(f"[name={field}]")
        if chooser.evaluate("e => e.tagName") == "SELECT":
            chooser.select_option(run_id)
        else:
            chooser.fill(run_id)
    with page.expect_navigation():
        form.evaluate("f => f.requestSubmit()")
    cli = _cli_compare(stack, base, candidate)
    shown = page.locator("[data-testid=mean-difference]").get_attribute("data-value")
    assert float(shown) == cli["mean_difference"]
