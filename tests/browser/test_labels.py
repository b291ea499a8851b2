"""Labelling in Chromium: the labelling page records clicked and typed answers (`y`/`n`), hides
the judge's verdict until the answer, the item page shows and changes labels, the run page
shows the agreement; a read key cannot label and a forged post is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from tests.browser import evalsets
from tests.browser.conftest import Stack, shoot, sign_in
from tests.services import REPO


@pytest.fixture(scope="module")
def run_id(stack: Stack) -> str:
    made = stack.submit(evalsets.retriever_b(12), "to-label")
    assert stack.wait(made)["status"] == "completed"
    return made


def _labels(stack: Stack, run_id: str) -> dict[tuple[str, int], str]:
    body = stack.get(f"/v1/runs/{run_id}/labels")
    return {(x["item_id"], x["claim_index"]): x["verdict"] for x in body["labels"]}


def _card(page: Any) -> tuple[str, int]:
    card = page.locator("[data-testid=label-card]")
    return str(card.get_attribute("data-item-id")), int(card.get_attribute("data-claim-index"))


def test_labelling_page_records_clicks_and_keys_and_reveals_the_judge_after(
    stack: Stack, context: Any, screenshots: Path, run_id: str
) -> None:
    page = sign_in(context, stack.url, stack.keys["alpha_write"])
    page.goto(f"{stack.url}/runs/{run_id}/label")
    form = page.locator("form[data-testid=draw-sample]")
    form.locator("input[name=size]").fill("5")
    form.locator("input[name=seed]").fill("2")
    with page.expect_navigation():
        form.locator("button").click()
    assert "item 1 of 5" in page.locator("[data-testid=label-progress]").inner_text()
    sample = stack.get(f"/v1/runs/{run_id}/labels/sample")["item_ids"]
    assert len(sample) == 5

    first = _card(page)
    assert first[0] == sample[0]
    judged = {
        c["index"]: c
        for c in stack.get(f"/v1/runs/{run_id}/items/{quote(first[0], safe='')}")["claims"]
    }
    # before the answer: no judge verdict nor reason anywhere on the page
    assert page.locator("[data-testid=reveal]").count() == 0
    assert judged[first[1]]["reason"] not in page.content()
    shoot(page, screenshots, "label-page", readme=True)

    with page.expect_navigation():
        page.locator("form[data-testid=answer] button[value=yes]").click()
    reveal = page.locator("[data-testid=reveal]")
    assert reveal.locator("[data-testid=reveal-human]").inner_text() == "yes"
    assert reveal.locator("[data-testid=reveal-judge]").inner_text() == judged[first[1]]["verdict"]
    second = _card(page)
    assert second != first

    with page.expect_navigation():
        page.keyboard.press("n")  # the shortcut answers as the button does
    assert page.locator("[data-testid=reveal-human]").inner_text() == "no"
    third = _card(page)
    note = page.locator("form[data-testid=answer] input[name=note]")
    note.press("y")  # a key typed into the note stays in the note
    note.press("n")
    assert note.input_value() == "yn" and _card(page) == third
    assert len(_labels(stack, run_id)) == 2
    with page.expect_navigation():
        page.locator("form[data-testid=answer] button[value=yes]").click()
    assert _labels(stack, run_id) == {first: "yes", second: "no", third: "yes"}
    assert "3 of" in page.locator("[data-testid=label-progress]").inner_text()

    # the item page shows them, and changes one
    page.goto(f"{stack.url}/runs/{run_id}/items/{quote(first[0], safe='')}")
    row = page.locator(f"[data-testid=human-labels] tr[data-claim-index='{first[1]}']")
    assert row.locator("[data-field=human-label]").get_attribute("data-value") == "yes"
    with page.expect_navigation():
        row.locator("button[value=no]").click()
    assert urlsplit(page.url).path == f"/runs/{run_id}/items/{quote(first[0], safe='')}"
    row = page.locator(f"[data-testid=human-labels] tr[data-claim-index='{first[1]}']")
    assert row.locator("[data-field=human-label]").get_attribute("data-value") == "no"
    assert _labels(stack, run_id)[first] == "no"

    # the run page: three labels of one item are too few to correct the mean
    page.goto(f"{stack.url}/runs/{run_id}")
    panel = page.locator("[data-testid=agreement]")
    assert "3 claims of 1 item" in panel.locator("[data-testid=labelled]").inner_text()
    assert "at least 5" in panel.locator("[data-testid=corrected-mean]").inner_text()
    # the rest of the sample labelled by file (the person disagrees on every claim 1)
    rows = ["item_id,claim_index,verdict"]
    for item_id in sample[1:]:
        item = stack.get(f"/v1/runs/{run_id}/items/{quote(item_id, safe='')}")
        for claim in item["claims"]:
            verdict = claim["verdict"]
            if claim["index"] == 1:
                verdict = "no" if verdict == "yes" else "yes"
            rows.append(f"{item_id},{claim['index']},{verdict}")
    imported = context.request.post(
        f"{stack.url}/v1/runs/{run_id}/labels",
        data="\n".join(rows),
        headers={
            "Authorization": f"Bearer {stack.keys['alpha_write']}",
            "Content-Type": "text/csv",
        },
    )
    assert imported.status == 200 and imported.json()["problems"] == []
    page.reload()
    panel = page.locator("[data-testid=agreement]")
    assert "of 5 items" in panel.locator("[data-testid=labelled]").inner_text()
    assert panel.locator("[data-testid=corrected-interval]").count() == 1
    agreement = stack.get(f"/v1/runs/{run_id}/agreement")
    cells = {
        cell: int(panel.locator(f"[data-cell={cell}]").inner_text())
        for cell in ("yy", "yn", "ny", "nn")
    }
    c = agreement["confusion"]
    assert cells == {
        "yy": c["judge_yes_human_yes"],
        "yn": c["judge_yes_human_no"],
        "ny": c["judge_no_human_yes"],
        "nn": c["judge_no_human_no"],
    }
    shoot(page, screenshots, "run-agreement")
    target = os.environ.get("RECALLQ_SCREENSHOTS")
    if target:
        panel.screenshot(path=str(REPO / target / "agreement-panel.png"))


def test_a_read_key_cannot_label_and_a_forged_post_is_refused(
    stack: Stack, browser: Any, context: Any, run_id: str
) -> None:
    item = stack.get(f"/v1/runs/{run_id}/items")["items"][0]["id"]
    before = _labels(stack, run_id)
    reader = browser.new_context()
    try:
        page = sign_in(reader, stack.url, stack.keys["alpha_read"])
        page.goto(f"{stack.url}/runs/{run_id}/items/{quote(item, safe='')}")
        buttons = page.locator("[data-testid=human-labels] button")
        assert buttons.count() > 0 and all(
            buttons.nth(i).is_disabled() for i in range(buttons.count())
        )
        token = page.locator("[data-testid=human-labels] input[name=csrf_token]").first
        refused = reader.request.post(
            f"{stack.url}/runs/{run_id}/label",
            form={
                "csrf_token": token.input_value(),
                "item_id": item,
                "claim_index": "0",
                "verdict": "yes",
            },
            max_redirects=0,
        )
        assert refused.status == 403
        page.goto(f"{stack.url}/runs/{run_id}/label")
        assert page.locator("form[data-testid=answer]").count() == 0
    finally:
        reader.close()

    writer = sign_in(context, stack.url, stack.keys["alpha_write"])
    writer.goto(f"{stack.url}/runs/{run_id}/items/{quote(item, safe='')}")
    token = writer.locator("[data-testid=human-labels] input[name=csrf_token]").first.input_value()
    for forged in ({}, {"csrf_token": "forged" + token[6:]}):
        answer = context.request.post(
            f"{stack.url}/runs/{run_id}/label",
            form={**forged, "item_id": item, "claim_index": "0", "verdict": "yes"},
            max_redirects=0,
        )
        assert answer.status == 403, forged
    other = context.request.post(
        f"{stack.url}/runs/{run_id}/label/sample",
        form={"size": "3", "seed": "1"},
        max_redirects=0,
    )
    assert other.status == 403
    assert _labels(stack, run_id) == before

    outsider = browser.new_context()
    try:
        page = sign_in(outsider, stack.url, stack.keys["beta_write"])
        assert page.goto(f"{stack.url}/runs/{run_id}/label").status == 404
        token = page.locator("input[name=csrf_token]").first.input_value()
        theirs = outsider.request.post(
            f"{stack.url}/runs/{run_id}/label",
            form={"csrf_token": token, "item_id": item, "claim_index": "0", "verdict": "no"},
            max_redirects=0,
        )
        assert theirs.status == 404  # another project's run, with a valid session and token
    finally:
        outsider.close()
    assert _labels(stack, run_id) == before
