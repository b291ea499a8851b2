"""The labelling pages: `/runs/{id}/label` walks a drawn sample claim by claim, and the forms
that record a label (from that page and from the item page) or draw a sample.

    GET  /runs/{id}/label[?at=N&prev=M]   claim N of the sample (default: the first unlabelled)
    POST /runs/{id}/label                 a person's verdict on one claim (write key, CSRF)
    POST /runs/{id}/label/sample          draw a sample (write key, CSRF)

The judge's verdict and reason stay hidden until the person has answered: the page after an
answer shows them for the claim just answered (`prev`), and a claim already labelled shows
them beside the label. Sessions, CSRF and error pages are those of api.pages.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api import page_auth
from api.pages import (
    PAGE_HEADERS,
    PageError,
    SignInRequired,
    _bad_request,
    _can_write,
    _checked_post,
    _form,
    _found,
    _labels,
    _not_found,
    _project,
    _reader,
    _reads,
    _render,
)
from recallq.labels.store import MAX_SAMPLE, MAX_SEED, VERDICTS, LabelError
from recallq.state.apikeys import Principal
from recallq.state.runs import plausible_id

router = APIRouter(include_in_schema=False)
DEFAULT_SAMPLE = 200


def _run_url(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}"


def _whole(value: str, digits: int) -> bool:
    """A form or query field of at most `digits` ASCII digits (str.isdigit also takes "²",
    which int() refuses)."""
    return value.isascii() and value.isdigit() and len(value) <= digits


def _position(value: str | None, name: str, size: int) -> int | None:
    if value is None or value == "":
        return None
    if not _whole(value, 9) or int(value) >= max(size, 1):
        raise _bad_request(f"{name} must be a claim position from 0 to {max(size - 1, 0)}")
    return int(value)


@router.get("/runs/{run_id}/label", response_class=HTMLResponse)
def label_page(
    request: Request, run_id: str, at: str | None = None, prev: str | None = None
) -> Response:
    browser = _reader(request)
    reads, labels, project = _reads(request), _labels(request), _project(browser)
    context: dict[str, Any] = {"step": None, "previous": None, "steps": 0}
    with _found():
        run = reads.brief(run_id, project)
        drawn = labels.walk(run_id, project)
        if drawn is not None:
            steps = drawn.steps
            position = _position(at, "at", len(steps))
            previous = _position(prev, "prev", len(steps))
            if position is None:
                position = next((i for i, s in enumerate(steps) if s.label is None), None)
            done = sum(s.label is not None for s in steps)
            context |= {
                "steps": len(steps),
                "labelled": done,
                "items": len(drawn.item_keys),
                "seed": drawn.seed,
            }
            if position is not None and steps:
                step = steps[position]
                item = reads.item(run_id, project, step.item_key)
                assert item is not None  # the sample's items are the run's
                claim = next(c for c in item["claims"] if c["index"] == step.claim_index)
                context |= {
                    "position": position,
                    "step": step,
                    "item": item,
                    "claim": claim,
                    "label": labels.item_labels(run_id, project, step.item_key).get(
                        step.claim_index
                    ),
                    "items_done": len({s.item_key for s in steps[:position]}),
                }
            if previous is not None:
                before = steps[previous]
                item = reads.item(run_id, project, before.item_key, item_data=False)
                assert item is not None
                context["previous"] = {
                    "position": previous,
                    "item_id": before.item_key,
                    "claim": next(c for c in item["claims"] if c["index"] == before.claim_index),
                    "label": before.label,
                }
    return _render(
        request,
        browser,
        "label.html",
        run=run,
        sample=drawn is not None,
        can_write=_can_write(browser),
        default_size=DEFAULT_SAMPLE,
        run_url=_run_url(run["id"]),
        **context,
    )


async def _writer_form(request: Request, run_id: str) -> tuple[dict[str, str], Principal]:
    """A same-site form with the session's CSRF token from a write key: its fields and who
    sent it."""
    form = await _form(request)
    browser = await anyio.to_thread.run_sync(page_auth.browser, request)
    if not browser.signed_in:
        raise SignInRequired(_run_url(run_id) + "/label")
    _checked_post(request, browser, form)
    if not _can_write(browser):
        raise PageError(403, "Forbidden", "Your key may only read: labelling needs write.")
    assert browser.principal is not None
    return form, browser.principal


@router.post("/runs/{run_id}/label")
async def label_post(request: Request, run_id: str) -> Response:
    """Record a verdict, then on to the next unlabelled claim (or back to the item page)."""
    form, who = await _writer_form(request, run_id)
    item_id = form.get("item_id", "")
    index = form.get("claim_index", "")
    if not plausible_id(item_id) or not _whole(index, 9):
        raise _bad_request("the form names no claim")
    verdict = form.get("verdict", "")
    if verdict not in VERDICTS and verdict != "clear":
        raise _bad_request("the answer must be yes or no")
    labels = _labels(request)

    def store() -> None:
        with _found():
            try:
                if verdict == "clear":
                    labels.clear(run_id, who.project, item_id, int(index))
                else:
                    note = form.get("note") or None
                    labels.set(run_id, who.project, item_id, int(index), verdict, note, who.key_id)
            except LabelError as exc:
                if exc.status == 404:
                    raise _not_found("claim") from None
                raise _bad_request(exc.message) from None

    await anyio.to_thread.run_sync(store)
    found = run_id
    if form.get("back") == "item":
        target = f"{_run_url(found)}/items/{quote(item_id, safe='')}"
    else:
        at = form.get("at", "")
        target = f"{_run_url(found)}/label" + (
            "?" + urlencode({"prev": at}) if _whole(at, 9) else ""
        )
    return RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)


@router.post("/runs/{run_id}/label/sample")
async def sample_post(request: Request, run_id: str) -> Response:
    form, who = await _writer_form(request, run_id)
    size, seed = form.get("size", ""), form.get("seed", "0") or "0"
    if not _whole(size, 6) or not _whole(seed, 16) or int(seed) > MAX_SEED:
        raise _bad_request(f"the sample size must be 1 to {MAX_SAMPLE}, the seed 0 to {MAX_SEED}")
    labels = _labels(request)

    def draw() -> None:
        with _found():
            try:
                labels.draw_sample(run_id, who.project, int(size), int(seed), who.key_id)
            except LabelError as exc:
                raise _bad_request(exc.message) from None

    await anyio.to_thread.run_sync(draw)
    return RedirectResponse(f"{_run_url(run_id)}/label", status_code=303, headers=PAGE_HEADERS)
