"""The web pages: runs, a run, its items, an item, two runs compared; sign-in; cancel and retry.

HTML over the same reads as the JSON API (recallq.runs.reads, recallq.labels.service), rendered
with the viewer's
templates (recallq.viewer), in the same process and project scoping as /v1: another project's
run is the same 404 page as an unknown one. Who the browser is and the CSRF tokens of its
forms: api.page_auth. Every query parameter is bounded and checked here; a bad one is a 400
page. Not in the OpenAPI document.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, urlencode

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from redis.exceptions import RedisError

from api import page_auth
from api.body import Pace, paced_chunks
from api.page_auth import Browser
from recallq import viewer
from recallq.core import compare as ab
from recallq.core import inputs
from recallq.core.groups import UnknownField
from recallq.core.status import RUN_ACTIVE, PublicItemStatus, RunStatus
from recallq.execution.runtime import Runtime
from recallq.labels.service import LabelService
from recallq.runs import comparisons, item_views, run_views
from recallq.runs.reads import RunReads
from recallq.runs.service import RunConflict, RunService
from recallq.state.runs import RunNotFound
from recallq.viewer.figures import MAX_SCATTER_POINTS

log = logging.getLogger(__name__)
_Cursor = TypeVar("_Cursor")
router = APIRouter(include_in_schema=False)
STATIC_URL = "/ui-static"
RUNS_PAGE = 25
ITEMS_PAGE = 50
COMPARE_TOP = 20
COMPARE_CHOICES = 100
MAX_PARAM = 200  # characters of any query parameter (ids, names, text, cursors)
MAX_FORM_BYTES = 4096
RUN_STATUSES = tuple(RunStatus)
ITEM_STATUSES = tuple(PublicItemStatus)
REFRESH_SECONDS = 5
# Pages load only this origin's stylesheet and script, post forms only here, and are never
# framed: the CSP the templates are written for (no inline script or style).
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}


class PageError(Exception):
    """A page that answers with an error page (400, 403, 404, 409, 413, 503)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


class SignInRequired(Exception):
    """No valid session while keys are required: to the sign-in page, then back."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def install(app: FastAPI) -> None:
    """The pages, their static files and their error pages."""
    app.include_router(router)
    static = viewer.static_directory()
    app.mount(STATIC_URL, StaticFiles(directory=static), name="viewer-static")

    @app.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> Response:
        # in a worker thread: the page says who is signed in, which reads the database
        return await anyio.to_thread.run_sync(
            _error_page, request, exc.status, exc.title, exc.message
        )

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        target = "/signin?" + urlencode({"next": exc.next_path})
        return RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)


# --- rendering ---------------------------------------------------------------------------


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _reads(request: Request) -> RunReads:
    return RunReads.of(_runtime(request))


def _labels(request: Request) -> LabelService:
    return LabelService(_runtime(request).database)


def _render(
    request: Request, browser: Browser, template: str, http_status: int = 200, **context: Any
) -> HTMLResponse:
    fresh_cookie = None
    if page_auth.auth_off(_runtime(request)) and browser.cookie is None:
        # keys off: the browser still needs a cookie for its forms' CSRF tokens to bind to
        fresh_cookie = page_auth.new_anonymous_cookie()
        browser = replace(browser, cookie=fresh_cookie)
    html = (
        viewer.environment()
        .get_template(template)
        .render(
            browser=browser,
            csrf_token=browser.csrf_token(),
            auth_on=not page_auth.auth_off(_runtime(request)),
            static_url=STATIC_URL,
            **{"refresh_seconds": None, **context},
        )
    )
    response = HTMLResponse(html, status_code=http_status, headers=PAGE_HEADERS)
    if fresh_cookie is not None:
        page_auth.set_cookie(request, response, fresh_cookie)
    return response


def _error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    try:
        browser = page_auth.browser(request)
    except Exception:  # an error page must render even when the database is down
        browser = Browser(None, None, b"")
    return _render(
        request, browser, "error.html", status, status=status, title=title, message=message
    )


def _not_found(what: str = "run") -> PageError:
    return PageError(404, "Not found", f"No such {what} in your project.")


def _bad_request(message: str) -> PageError:
    return PageError(400, "Bad request", message)


# --- who is asking -----------------------------------------------------------------------


def _reader(request: Request) -> Browser:
    """The signed-in browser (any role), or a redirect to the sign-in page."""
    browser = page_auth.browser(request)
    if not browser.signed_in:
        path = request.url.path
        if request.url.query and len(request.url.query) <= 1000:
            path += "?" + request.url.query
        raise SignInRequired(path)
    return browser


def _project(browser: Browser) -> str:
    assert browser.principal is not None  # _reader's browsers are signed in
    return browser.principal.project


def _can_write(browser: Browser) -> bool:
    return browser.principal is not None and browser.principal.may("write")


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form's fields (the first value of each); no fields for any other
    body (which then lacks the CSRF token every form here has)."""
    runtime = _runtime(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in paced_chunks(request, Pace.of(runtime.settings)):
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PageError(413, "Too large", "That form is larger than any of these pages send.")
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        raise _bad_request("the form could not be read") from None
    return {name: values[0] for name, values in fields.items() if values}


def _checked_post(request: Request, browser: Browser, form: Mapping[str, str]) -> None:
    """A POST that changes something: from this site, with the session's CSRF token."""
    if not page_auth.same_origin(request) or not browser.csrf_valid(form.get("csrf_token", "")):
        raise PageError(
            403, "Forbidden", "This form was not sent from this site's page (reload and retry)."
        )


# --- parameters --------------------------------------------------------------------------


def _text(value: str | None, name: str) -> str | None:
    """A bounded, storable text parameter; None when empty."""
    if value is None or value == "":
        return None
    if len(value) > MAX_PARAM or inputs.text_problem(value) is not None:
        raise _bad_request(f"{name} must be at most {MAX_PARAM} characters of plain text")
    return value


def _choice(value: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    if value is None or value == "":
        return None
    if value not in allowed:
        raise _bad_request(f"{name} must be one of {', '.join(allowed)}")
    return value


def _cursor(value: str | None, decode: Callable[[str], _Cursor]) -> _Cursor | None:
    """A page link's cursor, decoded; None for the first page."""
    text = _text(value, "cursor")
    if text is None:
        return None
    try:
        return decode(text)
    except ValueError:
        raise _bad_request("that page link is not one this site made") from None


def _score_bound(value: str | None, name: str, scale: float) -> float | None:
    if value is None or value.strip() == "":
        return None
    try:
        number = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not 0 <= number <= scale:
        raise _bad_request(f"{name} must be a number from 0 to {scale:g}")
    return number


def _local_path(value: str | None) -> str:
    """Where to go after signing in: a path of this site, else the runs page."""
    if (
        not value
        or len(value) > 1000
        or not value.startswith("/")
        or value.startswith("//")
        or "\\" in value
        or not value.isprintable()
        or value.startswith("/signin")
    ):
        return "/"
    return value


def _item_href(run_id: str) -> Callable[[str], str]:
    return lambda key: f"/runs/{quote(run_id, safe='')}/items/{quote(key, safe='')}"


#: What a run page says when Redis, which says why an active run waits, cannot be asked.
REDIS_UNKNOWN = "Redis cannot be reached now: whether this run waits on its provider is unknown."


# --- sign-in -----------------------------------------------------------------------------


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str | None = None) -> Response:
    browser = page_auth.browser(request)
    if browser.signed_in and page_auth.auth_off(_runtime(request)):
        return RedirectResponse(_local_path(next), status_code=303, headers=PAGE_HEADERS)
    return _render(
        request,
        browser,
        "signin.html",
        next=_local_path(next),
        failed=False,
        session_hours=page_auth.SESSION_SECONDS // 3600,
    )


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request) -> Response:
    if not page_auth.same_origin(request):
        raise PageError(403, "Forbidden", "Sign in from this site's sign-in page.")
    form = await _form(request)
    target = _local_path(form.get("next"))
    runtime = _runtime(request)
    if page_auth.auth_off(runtime):
        return RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)
    cookie = await anyio.to_thread.run_sync(page_auth.sign_in, request, form.get("key", ""))
    if cookie is None:
        log.info("page sign-in refused: unknown or revoked key")
        return _render(
            request,
            Browser(None, None, b""),
            "signin.html",
            401,
            next=target,
            failed=True,
            session_hours=page_auth.SESSION_SECONDS // 3600,
        )
    response = RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)
    page_auth.set_cookie(request, response, cookie)
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    form = await _form(request)
    browser = await anyio.to_thread.run_sync(page_auth.browser, request)
    _checked_post(request, browser, form)
    response = RedirectResponse("/signin", status_code=303, headers=PAGE_HEADERS)
    page_auth.clear_cookie(response)
    return response


# --- runs --------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def runs_page(
    request: Request,
    status: str | None = None,
    name: str | None = None,
    cursor: str | None = None,
) -> Response:
    browser = _reader(request)
    status = _choice(status, "status", RUN_STATUSES)
    name = _text(name, "name")
    after = _cursor(cursor, run_views.decode_run_cursor)
    runs, next_cursor = _reads(request).list_runs(
        _project(browser), status=status, name=name, limit=RUNS_PAGE, after=after
    )
    next_url = None
    if next_cursor is not None:
        query = {"status": status or "", "name": name or ""}
        query["cursor"] = run_views.encode_run_cursor(next_cursor) or ""
        next_url = "/?" + urlencode({k: v for k, v in query.items() if v})
    return _render(
        request,
        browser,
        "runs.html",
        runs=runs,
        status=status,
        name=name,
        statuses=RUN_STATUSES,
        next_url=next_url,
    )


# The run object and the by-metadata table each read all of a run's items (about 110 ms
# apiece for 100k items on Postgres): a run page reads them at once, on two connections.
_SCANS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="run-page-scan")


def _group_summary(
    reads: RunReads, run_id: str, project: str, by: str
) -> dict[str, dict[str, Any]] | str:
    """The summary by `by`, or the line saying no item has that field."""
    try:
        return reads.group_summary(run_id, project, by)
    except UnknownField as exc:
        return str(exc)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str, by: str | None = None) -> Response:
    browser = _reader(request)
    by = _text(by, "by")
    reads, project = _reads(request), _project(browser)
    groups: Future[dict[str, dict[str, Any]] | str] | None = None
    with _found():
        fields = reads.metadata_fields(run_id, project)
        if by is None and fields:
            by = fields[0]
        if fields and by:
            groups = _SCANS.submit(_group_summary, reads, run_id, project, by)
        view = reads.view(run_id, project)
        agreement = _labels(request).agreement_if_labelled(run_id, project)
    notice = REDIS_UNKNOWN if view["waiting_unknown"] else None
    if by is not None and by not in fields:
        fields = [*fields, by]
    active = view["status"] in RUN_ACTIVE
    return _render(
        request,
        browser,
        "run.html",
        run=view,
        notice=notice,
        message=_message(request),
        active=active,
        # a budget-cancelled run needs a higher budget: the API's resume takes one
        resumable=bool(view["counts"]["cancelled"]) and view.get("cancel_reason") != "budget",
        can_write=_can_write(browser),
        metadata_fields=fields,
        by=by,
        groups=None if groups is None else groups.result(),  # a str: no item has `by`
        refresh_seconds=REFRESH_SECONDS if active else None,
        agreement=agreement,
        item_url=_item_href(view["id"]),
    )


_MESSAGES = {
    "cancelled": "Run cancelled: no judge call for it is in flight, and none will start.",
    "cancelled-without-gate": "Run cancelled: no item starts another stage. Redis cannot be "
    "reached now, so judge calls already under way were not stopped; they may still finish.",
    "retried": "Failed items queued again.",
    "resumed": "Run resumed: its cancelled items are queued again.",
    "nothing-to-retry": "No failed item to retry.",
}


def _message(request: Request) -> str | None:
    return _MESSAGES.get(request.query_params.get("done", ""))


async def _action(request: Request, run_id: str, act: Callable[[RunService, str], str]) -> Response:
    """A button on the run page: a same-site form with the CSRF token, by a write key. Then
    back to the run page (303), which says what happened."""
    form = await _form(request)
    browser = await anyio.to_thread.run_sync(page_auth.browser, request)
    if not browser.signed_in:
        raise SignInRequired(f"/runs/{quote(run_id, safe='')}")
    _checked_post(request, browser, form)
    if not _can_write(browser):
        raise PageError(
            403, "Forbidden", "Your key may only read: cancel, retry and resume need write."
        )
    project = _project(browser)
    runtime = _runtime(request)
    try:
        done = await anyio.to_thread.run_sync(act, RunService(runtime), project)
    except RunNotFound:
        raise _not_found() from None
    except RunConflict as exc:
        raise PageError(409, "Conflict", exc.message[:1].upper() + exc.message[1:] + ".") from None
    except RedisError:
        raise PageError(503, "Unavailable", "Redis cannot be reached now; retry soon.") from None
    target = f"/runs/{quote(run_id, safe='')}?done={done}"
    return RedirectResponse(target, status_code=303, headers=PAGE_HEADERS)


@router.post("/runs/{run_id}/cancel")
async def cancel_page(request: Request, run_id: str) -> Response:
    def act(service: RunService, project: str) -> str:
        cancelled = service.cancel(run_id, project)
        return "cancelled" if cancelled.calls_stopped else "cancelled-without-gate"

    return await _action(request, run_id, act)


@router.post("/runs/{run_id}/retry")
async def retry_page(request: Request, run_id: str) -> Response:
    def act(service: RunService, project: str) -> str:
        return "retried" if service.retry(run_id, project) else "nothing-to-retry"

    return await _action(request, run_id, act)


@router.post("/runs/{run_id}/resume")
async def resume_page(request: Request, run_id: str) -> Response:
    def act(service: RunService, project: str) -> str:
        service.resume(run_id, project)
        return "resumed"

    return await _action(request, run_id, act)


# --- items -------------------------------------------------------------------------------


@router.get("/runs/{run_id}/items", response_class=HTMLResponse)
def items_page(
    request: Request,
    run_id: str,
    status: str | None = None,
    min_score: str | None = None,
    max_score: str | None = None,
    q: str | None = None,
    sort: str | None = None,
    cursor: str | None = None,
) -> Response:
    browser = _reader(request)
    reads, project = _reads(request), _project(browser)
    with _found():
        run = reads.brief(run_id, project)
    where = item_views.ItemFilter(
        status=_choice(status, "status", ITEM_STATUSES),
        min_score=_score_bound(min_score, "min_score", run["scale"]),
        max_score=_score_bound(max_score, "max_score", run["scale"]),
        text=_text(q, "q"),
        sort=_choice(sort, "sort", ("score", "-score")),
    )
    after = _cursor(
        cursor, functools.partial(item_views.decode_items_cursor, by_score=where.by_score)
    )
    with _found():
        table = reads.items_table(run_id, project, where, ITEMS_PAGE, after)
    base = f"/runs/{quote(run['id'], safe='')}/items"
    query = {
        "status": where.status,
        "min_score": min_score if where.min_score is not None else None,
        "max_score": max_score if where.max_score is not None else None,
        "q": where.text,
        "sort": where.sort,
    }
    kept = {name: value for name, value in query.items() if value}
    next_url = None
    if table.cursor is not None:
        cursor_text = item_views.encode_items_cursor(table.cursor) or ""
        next_url = base + "?" + urlencode({**kept, "cursor": cursor_text})
    first_url = (base + ("?" + urlencode(kept) if kept else "")) if after is not None else None
    return _render(
        request,
        browser,
        "items.html",
        run=run,
        items=table.rows,
        searched_to=table.searched_to,
        matched=table.matched,
        searched=table.searched,
        searched_all=table.searched_all,
        from_start=after is None,
        filters=where,
        statuses=ITEM_STATUSES,
        max_text=MAX_PARAM,
        item_url=_item_href(run["id"]),
        next_url=next_url,
        first_url=first_url,
    )


@router.get("/runs/{run_id}/items/{item_id:path}", response_class=HTMLResponse)
def item_page(request: Request, run_id: str, item_id: str) -> Response:
    browser = _reader(request)
    reads, project = _reads(request), _project(browser)
    with _found():
        run = reads.brief(run_id, project)
        item = reads.item(run_id, project, item_id)
        if item is None:
            raise _not_found("item")
        human_labels = _labels(request).item_labels(run_id, project, item_id)
    return _render(
        request,
        browser,
        "item.html",
        run=run,
        item=item,
        human_labels=human_labels,
        can_write=_can_write(browser),
    )


# --- comparing ---------------------------------------------------------------------------


@contextmanager
def _found() -> Iterator[None]:
    """Another project's run is the same 404 page as an unknown one."""
    try:
        yield
    except RunNotFound:
        raise _not_found() from None


def _two_runs(
    reads: RunReads, project: str, base: str | None, candidate: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    with _found():
        return (
            reads.brief(_text(base, "base") or "", project),
            reads.brief(_text(candidate, "candidate") or "", project),
        )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, base: str | None = None, candidate: str | None = None
) -> Response:
    browser = _reader(request)
    project = _project(browser)
    reads = _reads(request)
    result = None
    scale = None
    choices = reads.choices(project, COMPARE_CHOICES)
    if base and candidate:
        base_run, candidate_run = _two_runs(reads, project, base, candidate)
        try:
            result = reads.compare(
                base_run["id"],
                candidate_run["id"],
                project,
                top=COMPARE_TOP,
                pairs=MAX_SCATTER_POINTS,
            )
        except comparisons.IncomparableRuns as exc:
            raise _bad_request(str(exc)) from None
        scale = base_run["scale"]
    chosen = {run["id"] for run in choices}
    if result is not None:
        # runs older than the newest COMPARE_CHOICES stay selectable when compared
        for brief in (result["base_run"], result["candidate_run"]):
            if brief["id"] not in chosen:
                choices.append({"id": brief["id"], "name": brief["name"], "created_at": None})
                chosen.add(brief["id"])

    def item_url(key: str) -> str:
        return f"/compare/items/{quote(key, safe='')}?" + urlencode(
            {"base": base or "", "candidate": candidate or ""}
        )

    return _render(
        request,
        browser,
        "compare.html",
        choices=choices,
        # by default the newest run against the one before it
        base_id=base or (choices[1]["id"] if len(choices) > 1 else None),
        candidate_id=candidate or (choices[0]["id"] if choices else None),
        result=result,
        scale=scale,
        item_url=item_url,
    )


def _verdicts(item: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["text"], c["verdict"]) for c in item["claims"] if c["verdict"] is not None]


@router.get("/compare/items/{item_id:path}", response_class=HTMLResponse)
def compare_item_page(
    request: Request, item_id: str, base: str | None = None, candidate: str | None = None
) -> Response:
    browser = _reader(request)
    reads, project = _reads(request), _project(browser)
    base_view, candidate_view = _two_runs(reads, project, base, candidate)
    with _found():
        base_item = reads.item(base_view["id"], project, item_id)
        candidate_item = reads.item(candidate_view["id"], project, item_id)
    if base_item is None and candidate_item is None:
        raise _not_found("item")
    flipped: set[str] = set()
    if base_item is not None and candidate_item is not None:
        flips = ab.flipped_claims(_verdicts(base_item), _verdicts(candidate_item))
        flipped = {flip["claim"] for flip in flips}
    return _render(
        request,
        browser,
        "compare_item.html",
        item_id=item_id,
        flipped=flipped,
        sides=[("base", base_view, base_item), ("candidate", candidate_view, candidate_item)],
        compare_url="/compare?"
        + urlencode({"base": base_view["id"], "candidate": candidate_view["id"]}),
    )
