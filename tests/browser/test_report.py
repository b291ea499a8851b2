"""`recallq report` writes one HTML file that opens from disk in chromium with every network
request refused, and shows the histogram, the lowest-scoring items and the comparison."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.browser.conftest import Stack, shoot
from tests.integration.secured import recallq

EXTERNAL = re.compile(
    r"""(?:\b(?:src|href|action)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//)"""
    r"""|url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:)?//|@import""",
    re.IGNORECASE,
)


def _report(stack: Stack, out: Path, *args: str) -> str:
    done = recallq(stack.cli_env(stack.keys["alpha_read"]), "report", *args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.IGNORECASE)
    assert not EXTERNAL.search(html), EXTERNAL.search(html)
    assert stack.keys["alpha_read"] not in html
    return html


def _offline_page(context: Any) -> tuple[Any, list[str]]:
    """A page on which every request that is not for a file is aborted, and recorded."""
    attempted: list[str] = []

    def only_files(route: Any) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    page = context.new_page()
    page.on("request", lambda r: None if r.url.startswith("file:") else attempted.append(r.url))
    return page, attempted


def test_the_report_opens_from_disk_without_a_network(
    stack: Stack, context: Any, tmp_path: Path, screenshots: Path
) -> None:
    run_id = stack.runs["retriever_a"]
    out = tmp_path / "report.html"
    _report(stack, out, run_id, "--lowest", "8")
    run = stack.get(f"/v1/runs/{run_id}")
    items = {i["id"]: i for i in stack.get(f"/v1/runs/{run_id}/items", limit=1000)["items"]}

    page, attempted = _offline_page(context)
    page.goto(out.as_uri())
    page.wait_for_load_state("load")

    bars = page.locator("svg[data-testid=histogram] rect[data-count]").all()
    assert [int(bar.get_attribute("data-count")) for bar in bars] == run["summary"]["histogram"][
        "counts"
    ]
    assert (
        sum(int(bar.get_attribute("data-count")) for bar in bars) == run["summary"]["scored_items"]
    )
    assert (
        float(page.locator("[data-testid=mean-score]").get_attribute("data-value"))
        == run["summary"]["mean_score"]
    )
    counts = {
        cell.get_attribute("data-count"): int(cell.get_attribute("data-value"))
        for cell in page.locator("[data-testid=counts] [data-count]").all()
    }
    assert counts == run["counts"]

    lowest = page.locator("section[data-testid=lowest-items] [data-item-id]").all()
    shown = [block.get_attribute("data-item-id") for block in lowest]
    assert len(shown) == 8 and len(set(shown)) == len(shown)
    scored = {key: i["score"] for key, i in items.items() if i["score"] is not None}
    assert set(shown) <= set(scored)
    rest = [score for key, score in scored.items() if key not in shown]
    assert not rest or max(scored[key] for key in shown) <= min(rest)
    for block, key in zip(lowest, shown, strict=True):
        claims = block.locator("li[data-claim-index]")
        assert claims.count() == len(items[key]["claims"]), key
        for claim in items[key]["claims"]:
            assert claim["text"] in " ".join(block.inner_text().split())
    shoot(page, screenshots, "report")
    assert attempted == []


def test_the_report_with_a_comparison(
    stack: Stack, context: Any, tmp_path: Path, screenshots: Path
) -> None:
    base, candidate = stack.runs["retriever_a"], stack.runs["retriever_b"]
    out = tmp_path / "compare.html"
    _report(stack, out, candidate, "--compare", base)  # RUN is the candidate
    done = recallq(stack.cli_env(), "compare", base, candidate, "--json")
    assert done.returncode == 0, done.stderr
    expected = json.loads(done.stdout)

    page, attempted = _offline_page(context)
    page.goto(out.as_uri())
    section = page.locator("section[data-testid=compare]")
    shown = section.locator("[data-testid=mean-difference]").get_attribute("data-value")
    assert float(shown) == expected["mean_difference"]
    assert page.locator("svg[data-testid=histogram] rect[data-count]").count() > 0
    # what --compare asked for comes first, not below every lowest-scoring item
    compare_top = section.bounding_box()["y"]
    assert compare_top < page.locator("section[data-testid=lowest-items]").bounding_box()["y"]
    shoot(page, screenshots, "report-compare")
    assert attempted == []
