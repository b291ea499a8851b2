"""Context precision on the pages in chromium: the run page's mean precision and its
histogram beside recall's, and the item page's passages, each marked relevant or not with its
rank, the claims it supports and the judge's reason (precision judged); checked against the
JSON API for the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from tests.browser.conftest import MODEL, Stack, shoot, sign_in
from tests.integration.secured import submit

R1 = "Marie Curie discovered polonium in 1898, with Pierre Curie."
R2 = "Marie Curie discovered radium in the same year."
J1 = "Lighthouses guide ships along rocky coasts at night."
J2 = "Volcanoes erupt molten basalt rock."
TRUTH = "Marie Curie discovered polonium. Marie Curie discovered radium."
ITEMS = [
    {"id": "interleaved", "ground_truth": TRUTH, "context": [J1, R1, J2, R2]},
    {"id": "first", "ground_truth": TRUTH, "context": [R1, R2, J1]},
    {"id": "absent", "ground_truth": TRUTH, "context": [J1, J2]},
]


def test_the_pages_show_context_precision(stack: Stack, context: Any, screenshots: Path) -> None:
    body = {"name": "precision-judged", "model": MODEL, "precision": "judged", "items": ITEMS}
    response = submit(stack.url, stack.keys["alpha_write"], body)
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    run = stack.wait(run_id)
    assert run["status"] == "completed" and run["counts"]["succeeded"] == 3
    page = sign_in(context, stack.url, stack.keys["alpha_read"])

    page.goto(f"{stack.url}/runs/{run_id}")
    mean = page.locator("[data-testid=mean-precision]")
    assert (
        float(mean.get_attribute("data-value") or "nan") == run["summary"]["mean_context_precision"]
    )
    expect(page.locator("[data-testid=precision-histogram]")).to_have_count(1)
    expect(page.locator("[data-testid=histogram]")).to_have_count(1)
    bars = page.locator("[data-testid=precision-histogram] rect.bar").all()
    counts = [int(bar.get_attribute("data-count") or -1) for bar in bars]
    assert counts == run["summary"]["precision_histogram"]["counts"]
    assert (
        "first relevant passage at rank 1: 1, 2: 1, none: 1"
        in page.locator("[data-testid=first-relevant]").inner_text()
    )
    shoot(page, screenshots, "precision-run")

    item = stack.get(f"/v1/runs/{run_id}/items/interleaved")
    assert item["context_precision"] == 0.5  # (1/2 + 2/4) / 2
    page.goto(f"{stack.url}/runs/{run_id}/items/interleaved")
    pill = page.locator("[data-testid=item-precision]")
    assert float(pill.get_attribute("data-value") or "nan") == 0.5
    shown = page.locator(".passage[data-passage-index]").all()
    assert [p.get_attribute("data-relevant") for p in shown] == ["no", "yes", "no", "yes"]
    for passage, stored in zip(shown, item["passages"], strict=True):
        text = " ".join(passage.locator("[data-field=relevance]").inner_text().split())
        verdict = "relevant" if stored["relevant"] else "not relevant"
        assert text.startswith(f"rank {stored['index'] + 1} · {verdict}"), text
        assert stored["reason"] in text
        if stored["claims"]:
            assert f"supports claim {', '.join(map(str, stored['claims']))}" in text
    shoot(page, screenshots, "precision-item", readme=True)
