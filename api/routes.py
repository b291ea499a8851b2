"""HTTP routes: parse, check, store, queue. No scoring happens here."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy import text
from sqlalchemy.orm import Session

from api.auth import current_project
from api.body import blocking_lines, read_body
from api.errors import ApiError, not_found
from recallq import export, ingest, model_registry, queries
from recallq.models import Run
from recallq.runtime import Runtime
from recallq.store import RunCancelledError, RunNotFound

log = logging.getLogger(__name__)
router = APIRouter()
Project = Annotated[str, Depends(current_project)]
NDJSON = "application/x-ndjson"
RUN_FIELDS = {
    "name",
    "model",
    "scale",
    "mode",
    "context",
    "context_extractor",
    "retry_deadline_s",
    "items",
}


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


Rt = Annotated[Runtime, Depends(_runtime)]


def queue_run(runtime: Runtime, run_id: str) -> None:
    """Hand the run to the workers. If the broker is down the run stays queued, and a
    worker's reaper dispatches it later."""
    try:
        runtime.queue.send_dispatch(run_id)
    except Exception:  # noqa: BLE001  (broker errors vary by transport)
        log.warning("could not queue run %s now; the reaper will", run_id, exc_info=True)


def _run_or_404(session: Session, run_id: str, project: str) -> Run:
    run = session.get(Run, run_id)
    if run is None or run.project != project:
        raise not_found(f"run {run_id}")
    return run


def _json_param(name: str, raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ApiError(422, "invalid_request", f"{name} must be JSON: {exc.msg}") from exc


def _store(runtime: Runtime, spec: ingest.RunSpec, items: Any) -> tuple[dict[str, Any], bool]:
    """Write the run (or find the one this idempotency key made). Runs in a worker thread."""
    with runtime.database.session() as session:
        existing = ingest.find_by_idempotency_key(session, spec)
        if existing is not None:
            ingest.check_same_submission(existing, spec, items)
            return runtime.run_view(session, existing), False
        run = ingest.create_run(session, runtime.runs, spec, items, runtime.settings)
        session.flush()
        view = runtime.run_view(session, run)
    return view, True


@router.post("/v1/runs", status_code=202)
async def create_run(
    request: Request,
    runtime: Rt,
    project: Project,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    name: str | None = None,
    model: str | None = None,
    scale: float = 1,
    context: str | None = Query(None, description="JSON list of static context passages"),
    context_extractor: str | None = Query(None, description="JSON extractor spec"),
    retry_deadline_s: float | None = None,
    mode: Literal["online", "batch"] | None = None,
) -> JSONResponse:
    settings = runtime.settings
    known = runtime.models
    batch_models = model_registry.batch_models(known)
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type == NDJSON:
        spec = ingest.build_spec(
            model=model,
            default_model=settings.default_model,
            known_models=known,
            name=name,
            scale=scale,
            context=_json_param("context", context),
            context_extractor=_json_param("context_extractor", context_extractor),
            project=project,
            idempotency_key=idempotency_key,
            retry_deadline_s=retry_deadline_s,
            default_retry_deadline=settings.retry_deadline,
            mode=mode,
            batch_models=batch_models,
        )
        lines = blocking_lines(request.stream(), settings.max_body_bytes, settings.max_item_bytes)
        items: Any = ingest.parse_ndjson_lines(lines, settings.max_item_bytes)
    elif content_type in ("application/json", ""):
        body = await read_body(request, settings.max_body_bytes)
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from exc
        if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
            raise ApiError(422, "invalid_request", 'body must be an object with an "items" list')
        unknown = set(payload) - RUN_FIELDS
        if unknown:
            raise ApiError(
                422, "invalid_request", f"unknown field(s): {', '.join(sorted(unknown))}"
            )
        spec = ingest.build_spec(
            model=payload.get("model"),
            default_model=settings.default_model,
            known_models=known,
            name=payload.get("name"),
            scale=payload.get("scale", 1),
            context=payload.get("context"),
            context_extractor=payload.get("context_extractor"),
            project=project,
            idempotency_key=idempotency_key,
            retry_deadline_s=payload.get("retry_deadline_s"),
            default_retry_deadline=settings.retry_deadline,
            mode=payload.get("mode"),
            batch_models=batch_models,
        )
        items = payload["items"]
        if len(body) > settings.max_item_bytes:  # else no item can be over the limit
            items = _within_item_limit(items, settings.max_item_bytes)
    else:
        raise ApiError(415, "unsupported_media_type", f"use application/json or {NDJSON}")
    view, created = await anyio.to_thread.run_sync(_store, runtime, spec, items)
    if created:
        queue_run(runtime, view["id"])
    return JSONResponse(view, status_code=202)


def _within_item_limit(items: list[Any], max_bytes: int) -> Iterator[Any]:
    """A JSON body's items under the same per-item limit as NDJSON lines."""
    for index, item in enumerate(items):
        if len(json.dumps(item, ensure_ascii=False).encode()) > max_bytes:
            raise ingest.SubmissionError(
                f"item {index}: larger than {max_bytes} bytes", code="item_too_large", status=413
            )
        yield item


RunStatusParam = Literal["queued", "running", "completed", "cancelled"]
ItemData = Annotated[
    bool,
    Query(description="with each item's input, output, ground_truth, context and metadata"),
]


@router.get("/v1/runs")
def list_runs(
    runtime: Rt,
    project: Project,
    status: RunStatusParam | None = None,
    name: Annotated[str | None, Query(max_length=200, description="exact run name")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: str | None = None,
) -> dict[str, Any]:
    """The project's runs, newest first: `{"runs": [run objects], "next_cursor": ...}`."""
    after = None
    if cursor:
        try:
            after = queries.decode_run_cursor(cursor)
        except ValueError:
            raise ApiError(422, "invalid_cursor", "cursor is not one this API returned") from None
    with runtime.database.session() as session:
        views, next_cursor = queries.list_runs(
            session, project, status=status, name=name, limit=limit, after=after
        )
    return {"runs": views, "next_cursor": queries.encode_run_cursor(next_cursor)}


@router.get("/v1/runs/{run_id}")
def get_run(
    run_id: str,
    runtime: Rt,
    project: Project,
    by: Annotated[
        str | None, Query(max_length=200, description="add `by_group`: per metadata value")
    ] = None,
) -> dict[str, Any]:
    with runtime.database.session() as session:
        view = runtime.run_view(session, _run_or_404(session, run_id, project))
        if by is not None:
            view["by_group"] = queries.group_summary(session, run_id, by)
    return view


@router.get("/v1/compare")
def compare_runs(
    runtime: Rt,
    project: Project,
    base: Annotated[str, Query(description="the run compared against")],
    candidate: Annotated[str, Query(description="the run compared")],
    by: Annotated[str | None, Query(max_length=200, description="metadata field")] = None,
    top: Annotated[int, Query(ge=0, le=100)] = 10,
) -> dict[str, Any]:
    """`candidate` against `base`, items paired by id: matched and unmatched items, both
    means, the mean difference with a 95% confidence interval (seeded paired bootstrap),
    improved / regressed / unchanged counts, the largest changes with the claims whose
    verdict flipped. 404 when a run is not the caller's; 400 when the runs have different
    scales."""
    with runtime.database.session() as session:
        base_run = _run_or_404(session, base, project)
        candidate_run = _run_or_404(session, candidate, project)
        try:
            return queries.compare_runs(session, base_run, candidate_run, by=by, top=top)
        except queries.IncomparableRuns as exc:
            raise ApiError(400, "incomparable_runs", str(exc)) from None


def _decode_cursor(cursor: str | None) -> int | None:
    if not cursor:
        return None
    try:
        index = int(base64.urlsafe_b64decode(cursor.encode() + b"==").decode())
    except ValueError:
        index = -1
    if index < 0:
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned")
    return index


def _encode_cursor(index: int | None) -> str | None:
    return None if index is None else base64.urlsafe_b64encode(str(index).encode()).decode()


ItemStatusParam = Literal["pending", "running", "succeeded", "failed", "cancelled"]


@router.get("/v1/runs/{run_id}/items")
def list_items(
    run_id: str,
    runtime: Rt,
    project: Project,
    status: ItemStatusParam | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
    item_data: ItemData = True,
) -> dict[str, Any]:
    after = _decode_cursor(cursor)
    with runtime.database.session() as session:
        _run_or_404(session, run_id, project)
        items, next_index = queries.items_page(session, run_id, status, limit, after, item_data)
    return {"items": items, "next_cursor": _encode_cursor(next_index)}


@router.get("/v1/runs/{run_id}/items/{item_id}")
def get_item(
    run_id: str, item_id: str, runtime: Rt, project: Project, item_data: ItemData = True
) -> dict[str, Any]:
    with runtime.database.session() as session:
        _run_or_404(session, run_id, project)
        item = queries.get_item(session, run_id, item_id, item_data)
    if item is None:
        raise not_found(f"item {item_id}")
    return item


@router.get("/v1/runs/{run_id}/results")
def results(
    run_id: str,
    runtime: Rt,
    project: Project,
    format: Literal["jsonl", "csv", "claims.csv"] = "jsonl",
    item_data: ItemData = True,
) -> StreamingResponse:
    """Every item with its claims: JSONL, CSV (a row per item) or claims.csv (a row per
    claim)."""
    with runtime.database.session() as session:
        _run_or_404(session, run_id, project)

    def stream() -> Iterator[str]:
        with runtime.database.session() as session:
            rows = queries.iter_results(session, run_id, item_data=item_data)
            yield from export.lines(rows, format)

    filename = f"{run_id}.{format}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(stream(), media_type=export.MEDIA_TYPES[format], headers=headers)


@router.post("/v1/runs/{run_id}/cancel")
def cancel_run(run_id: str, runtime: Rt, project: Project) -> dict[str, Any]:
    """Stop a run. When this returns, no judge call for it is in flight and none will start."""
    try:
        cancelled = runtime.runs.cancel(run_id, project)
    except RunNotFound:
        raise not_found(f"run {run_id}") from None
    # Workers see the cancel in the database before their next stage; the gate stops the
    # calls of stages already past that check, and waits for the calls already sent.
    if cancelled:
        runtime.gate.close(run_id)
        still_open = runtime.gate.wait_idle(run_id, runtime.settings.cancel_wait)
        if still_open:
            log.warning("run %s cancelled with %d call(s) still in flight", run_id, still_open)
    return get_run(run_id, runtime, project)


@router.post("/v1/runs/{run_id}/retry", status_code=202)
def retry_run(run_id: str, runtime: Rt, project: Project) -> JSONResponse:
    try:
        retried = runtime.runs.retry_failed(run_id, project)
    except RunNotFound:
        raise not_found(f"run {run_id}") from None
    except RunCancelledError:
        raise ApiError(409, "run_cancelled", "a cancelled run cannot be retried") from None
    if retried:
        queue_run(runtime, run_id)
    return JSONResponse({**get_run(run_id, runtime, project), "retried_items": retried}, 202)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(runtime: Rt) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        with runtime.database.session() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["database"] = f"error: {type(exc).__name__}"
    alive = 0
    try:
        assert runtime.redis is not None and runtime.heartbeat is not None
        runtime.redis.ping()
        checks["redis"] = "ok"
        alive = runtime.heartbeat.live_workers()
        # runs are taken but nothing scores them: say so rather than "ok"
        checks["workers"] = "ok" if alive else "none alive"
    except Exception as exc:  # noqa: BLE001
        checks["redis"] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks, "workers_alive": alive},
        status_code=200 if ready else 503,
    )
