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
from sqlalchemy.orm import Session

from api import page_auth
from api.pages import (
    PAGE_HEADERS,
    PageError,
    SignInRequired,
    _bad_request,
    _can_write,
    _checked_post,
    _form,
    _not_found,
    _reader,
    _render,
    _run_brief,
    _run_or_404,
    _runtime,
)
from recallq import labels, queries
from recallq.apikeys import Principal
from recallq.runs import find_run, plausible_id
from recallq.tables import Run

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
    runtime = _runtime(request)
    context: dict[str, Any] = {"step": None, "previous": None, "steps": 0}
    with runtime.database.session() as session:
        run = _run_or_404(session, browser, run_id)
        drawn = labels.sample_of(session, run.id)
        if drawn is not None:
            steps = labels.walk(session, run, drawn.item_keys)
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
                item = queries.get_item(session, run.id, step.item_key)
                assert item is not None  # the sample's items are the run's
                claim = next(c for c in item["claims"] if c["index"] == step.claim_index)
                context |= {
                    "position": position,
                    "step": step,
                    "item": item,
                    "claim": claim,
                    "label": labels.item_labels(session, run.id, step.item_key).get(
                        step.claim_index
                    ),
                    "items_done": len({s.item_key for s in steps[:position]}),
                }
            if previous is not None:
                before = steps[previous]
                item = queries.get_item(session, run.id, before.item_key, item_data=False)
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
        run=_run_brief(run),
        sample=drawn is not None,
        can_write=_can_write(browser),
        default_size=DEFAULT_SAMPLE,
        run_url=_run_url(run.id),
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
    if verdict not in labels.VERDICTS and verdict != "clear":
        raise _bad_request("the answer must be yes or no")
    runtime = _runtime(request)

    def store() -> str:
        with runtime.database.session() as session:
            run = _run(session, who.project, run_id)
            try:
                if verdict == "clear":
                    labels.clear_label(session, run.id, item_id, int(index))
                else:
                    labels.set_label(
                        session,
                        run.id,
                        item_id,
                        int(index),
                        verdict,
                        form.get("note") or None,
                        who.key_id,
                    )
            except labels.LabelError as exc:
                if exc.status == 404:
                    raise _not_found("claim") from None
                raise _bad_request(exc.message) from None
            return run.id

    found = await anyio.to_thread.run_sync(store)
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
    if not _whole(size, 6) or not _whole(seed, 16) or int(seed) > labels.MAX_SEED:
        raise _bad_request(
            f"the sample size must be 1 to {labels.MAX_SAMPLE}, the seed 0 to {labels.MAX_SEED}"
        )
    runtime = _runtime(request)

    def draw() -> str:
        with runtime.database.session() as session:
            run = _run(session, who.project, run_id)
            try:
                labels.draw_sample(session, run, int(size), int(seed), who.key_id)
            except labels.LabelError as exc:
                raise _bad_request(exc.message) from None
            return run.id

    found = await anyio.to_thread.run_sync(draw)
    return RedirectResponse(f"{_run_url(found)}/label", status_code=303, headers=PAGE_HEADERS)


def _run(session: Session, project: str, run_id: str) -> Run:
    run = find_run(session, run_id, project)
    if run is None:
        raise _not_found()
    return run
