"""HTTP routes: parse, check, store, queue. No scoring happens here.

Every /v1 route acts within the project of the caller's key (api.auth). Nothing a route does
waits on a client while it holds a thread, a transaction or a pooled connection: bodies are
received in the event loop and spooled first (api.body), results are read one page per short
transaction, and /healthz touches neither the database nor the thread pool.
"""

from __future__ import annotations

import base64
import logging
from typing import Annotated, Any, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator
from redis.exceptions import RedisError
from sqlalchemy import text
from starlette.convertors import Convertor, register_url_convertor

from api import schemas, streams
from api.auth import AdminProject, Caller, Project, WriteProject, Writer
from api.body import Pace, SpooledUpload, read_json_body, spool_ndjson
from api.errors import HttpError, not_found
from recallq.core import export, inputs, scoring
from recallq.core.status import PublicItemStatus, RunStatus
from recallq.execution.runtime import Runtime
from recallq.runs import comparisons, ingest, item_views, run_views
from recallq.runs.reads import RunReads
from recallq.runs.service import RUN_FIELDS, RunService
from recallq.state.apikeys import Principal
from recallq.state.runs import MAX_ID_LENGTH

log = logging.getLogger(__name__)
router = APIRouter()
NDJSON = "application/x-ndjson"
#: query parameters of POST /v1/runs that carry JSON: the run fields of the same names
JSON_QUERY_PARAMETERS = ("context", "context_extractor")
MAX_CURSOR_LENGTH = 64
ANONYMOUS = "auth-off"  # the rate-limit key of every caller when RECALLQ_AUTH=off
errors = schemas.error_responses


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _service(request: Request) -> RunService:
    return RunService(_runtime(request))


def _reads(request: Request) -> RunReads:
    return RunReads.of(_runtime(request))


Rt = Annotated[Runtime, Depends(_runtime)]
Runs = Annotated[RunService, Depends(_service)]
Reads = Annotated[RunReads, Depends(_reads)]


# --- submissions ----------------------------------------------------------------------------


def _json_param(name: str, raw: str | None, max_depth: int) -> Any:
    if raw is None:
        return None
    try:
        return inputs.loads(raw, max_depth, where=name)
    except inputs.UnsafeInput as exc:
        raise HttpError(422, "invalid_request", f"{exc} (query parameter)") from None


def _admit(service: RunService, principal: Principal, limiter: Any, dry_run: bool) -> None:
    """Before a byte of the body is read: the key's submission rate, then (for a real run)
    the project's cap on active runs. Runs in a worker thread (Redis, the database)."""
    if limiter is not None:
        try:
            wait = limiter.admit(principal.key_id or ANONYMOUS)
        except RedisError:
            # no way to count this key's submissions: refuse rather than let it through
            raise HttpError(
                503,
                "unavailable",
                "cannot check the submission rate now; retry",
                {"Retry-After": "10"},
            ) from None
        if wait is not None:
            raise HttpError(
                429,
                "rate_limited",
                f"too many submissions with this key; retry in {wait:g} s",
                {"Retry-After": str(int(wait))},
            )
    if not dry_run:
        service.admit(principal.project)


def _submit_json(
    service: RunService, body: bytes, principal: Principal, key: str | None, dry_run: bool
) -> tuple[dict[str, Any], bool]:
    try:
        payload = inputs.loads(body, service.settings.max_json_depth)
    except inputs.UnsafeInput as exc:
        raise HttpError(400, "invalid_json", str(exc)) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        raise HttpError(422, "invalid_request", 'body must be an object with an "items" list')
    items = payload.pop("items")
    spec = service.spec(payload, principal.project, key)
    if dry_run:
        return {"dry_run": True, **service.estimate(spec, items)}, False
    submitted = service.submit(spec, items)
    return submitted.view, submitted.created


def _submit_ndjson(
    service: RunService, spec: ingest.RunSpec, upload: SpooledUpload, dry_run: bool
) -> tuple[dict[str, Any], bool]:
    settings = service.settings
    lines = upload.lines_read()
    items = ingest.parse_ndjson_lines(lines, settings.max_item_bytes, settings.max_json_depth)
    if dry_run:
        return {"dry_run": True, **service.estimate(spec, items)}, False
    submitted = service.submit(spec, items)
    return submitted.view, submitted.created


SUBMISSION_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/RunSubmission"}},
        NDJSON: {
            "schema": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/SubmittedItem"},
                "description": "the items, one JSON object per line (run fields as query "
                "parameters)",
            },
            "example": [{"id": "q1", "ground_truth": "...", "context": ["..."]}],
        },
    },
}


@router.post(
    "/v1/runs",
    status_code=202,
    summary="Submit a run (JSON, or NDJSON with run fields as query parameters)",
    response_model=None,
    responses={
        200: {"model": schemas.Estimate, "description": "dry_run=true: what it would take"},
        202: {"model": schemas.RunView, "description": "The run (or the one this key made)"},
        **errors(400, 401, 403, 408, 409, 413, 415, 422, 429, 503),
    },
    openapi_extra={"requestBody": SUBMISSION_BODY},
)
async def create_run(
    request: Request,
    service: Runs,
    principal: Writer,
    idempotency_key: Annotated[
        str | None, Header(max_length=200, description="a retried submission returns its run")
    ] = None,
    dry_run: Annotated[bool, Query(description="estimate only: nothing is created")] = False,
    name: Annotated[str | None, Query(max_length=200, json_schema_extra=schemas.NO_NUL)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    scale: Annotated[float, Query(ge=scoring.MIN_SCALE, le=scoring.MAX_SCALE)] = 1,
    # JSON (the document says so: api.app, JSON_QUERY_PARAMETERS)
    context: Annotated[
        str | None,
        Query(
            max_length=2000,
            description="JSON: the static context passages (at most 2,000 characters: it "
            "travels in the URL; send a long one in a JSON body)",
        ),
    ] = None,
    context_extractor: Annotated[
        str | None,
        Query(max_length=2000, description="JSON: the extractor (at most 2,000 characters)"),
    ] = None,
    retry_deadline_s: Annotated[float | None, Query(gt=0, le=ingest.MAX_RETRY_DEADLINE)] = None,
    budget_usd: Annotated[float | None, Query(gt=0, le=ingest.MAX_BUDGET_USD)] = None,
    budget_tokens: Annotated[int | None, Query(gt=0, le=ingest.MAX_BUDGET_TOKENS)] = None,
    claims_from: Annotated[
        str | None,
        Query(max_length=200, description="an earlier run whose items' claims to attribute"),
    ] = None,
    mode: Annotated[
        Literal["online", "batch"] | None,
        Query(description="batch: through the provider's Batch API (a model marked batch)"),
    ] = None,
    precision: Annotated[
        str | None,
        Query(
            max_length=16,
            description='context precision: "cited" (default), "judged" or "off" (else a 422)',
        ),
    ] = None,
) -> JSONResponse:
    """Run fields come from the JSON body, or from the query for an NDJSON body (one item a
    line). With `dry_run=true` nothing is created: the answer (200) is an estimate."""
    settings = service.settings
    key = idempotency_key.strip() if idempotency_key else None
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in (NDJSON, "application/json"):  # none: a Blob from another site
        raise HttpError(415, "unsupported_media_type", f"use application/json or {NDJSON}")
    in_query = sorted(set(request.query_params) & set(RUN_FIELDS))
    if content_type != NDJSON and in_query:  # else ignored: a budget the client set, not kept
        raise HttpError(
            422,
            "invalid_request",
            f"run fields go in the JSON body; query parameters ({', '.join(in_query)}) are "
            "for an NDJSON body",
        )
    limiter = getattr(request.app.state, "submissions", None)
    await anyio.to_thread.run_sync(_admit, service, principal, limiter, dry_run)
    if content_type == NDJSON:
        fields = {
            "model": model,
            "name": name,
            "scale": scale,
            "context": _json_param("context", context, settings.max_json_depth),
            "context_extractor": _json_param(
                "context_extractor", context_extractor, settings.max_json_depth
            ),
            "retry_deadline_s": retry_deadline_s,
            "budget_usd": budget_usd,
            "budget_tokens": budget_tokens,
            "mode": mode,
            "claims_from": claims_from,
            "precision": precision,
        }
        spec = service.spec(fields, principal.project, key)
        upload = await spool_ndjson(request, settings, request.app.state.spool_budget)
        try:
            view, created = await anyio.to_thread.run_sync(
                _submit_ndjson, service, spec, upload, dry_run
            )
        finally:
            upload.close()
    else:
        body = await read_json_body(request, settings.max_json_body_bytes, Pace.of(settings))
        view, created = await anyio.to_thread.run_sync(
            _submit_json, service, body, principal, key or None, dry_run
        )
    if dry_run:
        return JSONResponse(view, status_code=200)
    return JSONResponse(view, status_code=202)


# --- reads ----------------------------------------------------------------------------------


ItemData = Annotated[
    bool,
    Query(description="with each item's input, output, ground_truth, context and metadata"),
]


def _plain_text(value: str | None) -> str | None:
    """A parameter the database will compare as text: no NUL, no lone surrogate (a 422)."""
    if value is not None and (problem := inputs.text_problem(value)) is not None:
        raise ValueError(f"contains {problem}")
    return value


MetadataField = Annotated[
    str | None,
    Query(
        max_length=200,
        description="a metadata field: results per its value",
        json_schema_extra=schemas.NO_NUL,
    ),
    AfterValidator(_plain_text),
]


@router.get(
    "/v1/runs",
    response_model=None,
    responses={200: {"model": schemas.RunsPage}, **errors(401, 422)},
)
def list_runs(
    reads: Reads,
    project: Project,
    status: RunStatus | None = None,
    name: Annotated[str | None, Query(max_length=200, description="exact run name")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[
        str | None,
        Query(max_length=200, json_schema_extra={"pattern": run_views.RUN_CURSOR_PATTERN}),
    ] = None,
) -> dict[str, Any]:
    """The project's runs, newest first: `{"runs": [run objects], "next_cursor": ...}`."""
    after = None
    if cursor is not None:  # an empty one too: a cursor is only what this API returned
        try:
            after = run_views.decode_run_cursor(cursor)
        except ValueError:
            raise HttpError(422, "invalid_cursor", "cursor is not one this API returned") from None
    views, next_cursor = reads.list_runs(
        project, status=status, name=name, limit=limit, after=after
    )
    return {"runs": views, "next_cursor": run_views.encode_run_cursor(next_cursor)}


@router.get(
    "/v1/runs/{run_id}",
    response_model=None,
    responses={200: {"model": schemas.RunView}, **errors(401, 404, 422)},
)
def get_run(
    run_id: str, reads: Reads, project: Project, by: MetadataField = None
) -> dict[str, Any]:
    return reads.view(run_id, project, by=by)


@router.get(
    "/v1/compare",
    response_model=None,
    responses={200: {"model": schemas.Comparison}, **errors(400, 401, 404, 422)},
)
def compare_runs(
    reads: Reads,
    project: Project,
    base: Annotated[str, Query(max_length=MAX_ID_LENGTH, description="run compared against")],
    candidate: Annotated[str, Query(max_length=MAX_ID_LENGTH, description="the run compared")],
    by: MetadataField = None,
    top: Annotated[int, Query(ge=0, le=100)] = 10,
) -> dict[str, Any]:
    """`candidate` against `base`, items paired by id: matched and unmatched items, both
    means, the mean difference with a 95% confidence interval (seeded paired bootstrap),
    improved / regressed / unchanged counts, the largest changes with the claims whose
    verdict flipped. 404 when a run is not the caller's; 400 when the runs have different
    scales."""
    try:
        return reads.compare(base, candidate, project, by=by, top=top)
    except comparisons.IncomparableRuns as exc:
        raise HttpError(400, "incomparable_runs", str(exc)) from None


def _decode_cursor(cursor: str | None) -> int | None:
    if cursor is None:  # an empty one is no cursor this API returned: a 422
        return None
    index = -1
    if len(cursor) <= MAX_CURSOR_LENGTH and cursor.isascii():
        try:
            decoded = base64.urlsafe_b64decode(cursor.encode() + b"==").decode()
            if decoded.isascii() and decoded.isdigit() and len(decoded) <= 10:
                index = int(decoded)
        except ValueError:
            pass
    if not 0 <= index <= item_views.MAX_INDEX:
        raise HttpError(422, "invalid_cursor", "cursor is not one this API returned")
    return index


def _encode_cursor(index: int | None) -> str | None:
    return None if index is None else base64.urlsafe_b64encode(str(index).encode()).decode()


# The cursors _encode_cursor makes (base64url of 1 to 9 digits), exactly: a cursor is opaque,
# and the spec says which strings are one, so that a fuzzer of the spec sends only those as
# valid (any other string is a 422 invalid_cursor).
_DIGITS3 = "(?:[MN][DTjz]|O[DT])[AEIMQUYcgk][w-z0-5]"
_DIGITS2 = "(?:[MN][DTjz]|O[DT])[AEIMQUYcgk]="
_DIGITS1 = "(?:[MN][AQgw]|O[AQ])=="
CURSOR_PATTERN = f"^(?:{_DIGITS3}){{0,2}}(?:{_DIGITS3}|{_DIGITS2}|{_DIGITS1})$"
Cursor = Annotated[
    str | None,
    Query(max_length=MAX_CURSOR_LENGTH, json_schema_extra={"pattern": CURSOR_PATTERN}),
]


@router.get(
    "/v1/runs/{run_id}/items",
    response_model=None,
    responses={200: {"model": schemas.ItemsPage}, **errors(401, 404, 422)},
)
def list_items(
    run_id: str,
    reads: Reads,
    project: Project,
    status: PublicItemStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
    item_data: ItemData = True,
) -> dict[str, Any]:
    after = _decode_cursor(cursor)
    items, next_index = reads.items(
        run_id, project, status=status, limit=limit, after=after, item_data=item_data
    )
    return {"items": items, "next_cursor": _encode_cursor(next_index)}


class ItemIdPath(Convertor[str]):
    """An item id in a path: it may contain `/` (as itself or as %2F: the path is matched
    decoded), but it does not end in `/claims/{index}/label`. That path is a claim's label
    (PUT, DELETE: api.label_routes), so a GET of it is a 405 naming those, not the item
    "{id}/claims/{index}/label" (such an item is read from the items list)."""

    regex = r"(?!.+/claims/[^/]+/label$).+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("item_id", ItemIdPath())


@router.get(
    "/v1/runs/{run_id}/items/{item_id:item_id}",
    response_model=None,
    responses={200: {"model": schemas.ItemView}, **errors(401, 404, 422)},
)
def get_item(
    run_id: str, item_id: str, reads: Reads, project: Project, item_data: ItemData = True
) -> dict[str, Any]:
    item = reads.item(run_id, project, item_id, item_data)
    if item is None:
        raise not_found(f"item {item_id[:80]}")
    return item


def _results_page(
    reads: RunReads, run_id: str, format: str, item_data: bool, fields: list[str]
) -> streams.RenderPage:
    """The pages of a result stream, each read in its own short transaction and rendered, in
    a worker thread (rendering a page is CPU work the event loop should not do). `fields`:
    the run's metadata fields, a CSV column each."""

    def render(after: int | None, limit: int, first: bool) -> tuple[bytes, int, int | None]:
        page, after = reads.results(run_id, after, limit, item_data)
        text = "".join(export.lines(page, format, header=first, metadata_fields=fields))
        return text.encode(), len(page), after

    return render


RESULTS_CONTENT = {
    NDJSON: {"schema": {"type": "string", "description": "one item (with claims) per line"}},
    "text/csv": {"schema": {"type": "string", "description": "a row per item or per claim"}},
}


@router.get(
    "/v1/runs/{run_id}/results",
    response_class=StreamingResponse,
    responses={
        200: {"content": RESULTS_CONTENT, "description": "Every item with its claims"},
        **errors(401, 404, 422, 429),
    },
)
async def results(
    request: Request,
    run_id: str,
    runtime: Rt,
    principal: Caller,
    format: Literal["jsonl", "csv", "claims.csv", "passages.csv"] = "jsonl",
    item_data: ItemData = True,
) -> StreamingResponse:
    """Every item with its claims: JSONL, CSV (a row per item) or claims.csv (a row per
    claim). Streamed a page at a time, each read in its own short transaction and cut by
    bytes (api.streams): a reader that stalls holds no transaction, no pooled connection, no
    thread and about half a megabyte while it stalls. A key has a few streams at once (429
    beyond, `RECALLQ_MAX_RESULT_STREAMS_PER_KEY`)."""
    reads = RunReads.of(runtime)
    await anyio.to_thread.run_sync(reads.run, run_id, principal.project)
    fields: list[str] = []
    if format == "csv" and item_data:  # a column per metadata field: the CSV's header needs all
        fields = await anyio.to_thread.run_sync(
            reads.metadata_fields, run_id, principal.project, True
        )
    slots: streams.StreamSlots = request.app.state.result_streams
    key = principal.key_id or ANONYMOUS
    slots.take(key)
    media = export.MEDIA_TYPES[format]
    headers = {"Content-Disposition": f'attachment; filename="{run_id}.{format}"'}
    pages = streams.paged_bytes(_results_page(reads, run_id, format, item_data, fields))
    stall = runtime.settings.results_stall_timeout
    return streams.SlottedStream(slots, key, stall, pages, media_type=media, headers=headers)


# --- actions --------------------------------------------------------------------------------


@router.post(
    "/v1/runs/{run_id}/cancel",
    response_model=None,
    responses={200: {"model": schemas.CancelledRun}, **errors(401, 403, 404, 422)},
)
def cancel_run(run_id: str, service: Runs, project: WriteProject) -> JSONResponse:
    """Stop a run. When this returns, no judge call for it is in flight and none will start;
    with Redis unreachable the run is cancelled all the same (no item starts another stage)
    and the answer carries `calls_stopped: false`: calls already under way may still end."""
    cancelled = service.cancel(run_id, project)
    return JSONResponse({**cancelled.view, "calls_stopped": cancelled.calls_stopped})


@router.post(
    "/v1/runs/{run_id}/retry",
    status_code=202,
    response_model=None,
    responses={202: {"model": schemas.RetriedRun}, **errors(401, 403, 404, 409, 422)},
)
def retry_run(run_id: str, service: Runs, project: WriteProject) -> JSONResponse:
    retried = service.retry(run_id, project)
    return JSONResponse({**service.reads.view(run_id, project), "retried_items": retried}, 202)


RESUME_BODY = {
    "required": False,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ResumeRequest"}}},
}


@router.post(
    "/v1/runs/{run_id}/resume",
    status_code=202,
    response_model=None,
    responses={
        202: {"model": schemas.ResumedRun},
        **errors(400, 401, 403, 404, 409, 413, 422, 503),
    },
    openapi_extra={"requestBody": RESUME_BODY},
)
async def resume_run(
    run_id: str, request: Request, service: Runs, project: WriteProject
) -> JSONResponse:
    """Continue a cancelled run: its cancelled, unscored items are queued again. A run
    cancelled at its budget needs a higher one: `{"budget_usd": ...}` or `budget_tokens`
    (else a 409 `budget_spent`)."""
    body = await read_json_body(request, RESUME_MAX_BYTES, Pace.of(service.settings))
    fields: Any = {}
    if body.strip(b" \t\r\n"):  # JSON's whitespace: any other byte is a body, and parsed
        try:
            fields = inputs.loads(body, service.settings.max_json_depth)
        except inputs.UnsafeInput as exc:
            raise HttpError(400, "invalid_json", str(exc)) from None
    if not isinstance(fields, dict) or set(fields) - {"budget_usd", "budget_tokens"}:
        raise HttpError(
            422, "invalid_request", "the body may hold budget_usd and budget_tokens only"
        )

    def resume() -> dict[str, Any]:
        try:
            resumed = service.resume(
                run_id, project, fields.get("budget_usd"), fields.get("budget_tokens")
            )
        except RedisError:
            raise HttpError(
                503,
                "unavailable",
                "the run is running again, but Redis cannot be reached to let its judge calls "
                "through; retry the resume",
                {"Retry-After": "10"},
            ) from None
        return {**service.reads.view(run_id, project), "resumed_items": resumed}

    return JSONResponse(await anyio.to_thread.run_sync(resume), 202)


RESUME_MAX_BYTES = 4096


@router.delete(
    "/v1/runs/{run_id}",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Deleted"}, **errors(401, 403, 404, 409, 422)},
)
def delete_run(run_id: str, service: Runs, project: AdminProject) -> Response:
    """Remove an ended run with its items and claims (admin keys only). A queued or running
    run is a 409: cancel it first."""
    service.delete(run_id, project)
    return Response(status_code=204)


# --- health ---------------------------------------------------------------------------------


@router.get("/healthz", response_model=schemas.Health)
async def healthz() -> dict[str, str]:
    """The process answers. Async on purpose: it needs no thread, no database and no Redis,
    so it answers while every one of those is busy."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=None,
    responses={
        200: {"model": schemas.Readiness, "description": "Ready"},
        503: {"model": schemas.Readiness, "description": "Database, Redis or workers missing"},
        **errors(422),
    },
)
def readyz(
    runtime: Rt,
    exclude: Annotated[
        list[schemas.ReadinessCheck],
        Query(description="checks reported but left out of the status (repeatable)"),
    ] = [],  # noqa: B006  (FastAPI copies a default; it is never mutated)
) -> JSONResponse:
    """Ready while the database and Redis answer and a worker is alive. `?exclude=workers`
    leaves the workers out of the status (still reported), as Kubernetes' own
    `/readyz?exclude=`: the readiness probe of an API whose workers scale to zero, which
    must take the run that makes the autoscaler start one (deploy/kubernetes)."""
    checks: dict[str, str] = {}
    try:
        with runtime.database.session() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    alive = 0
    try:
        assert runtime.redis is not None and runtime.heartbeat is not None
        runtime.redis.ping()
        checks["redis"] = "ok"
        alive = runtime.heartbeat.live_workers()
        # runs are taken but nothing scores them: say so rather than "ok"
        checks["workers"] = "ok" if alive else "none alive"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for name, v in checks.items() if name not in exclude)
    return JSONResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks, "workers_alive": alive},
        status_code=200 if ready else 503,
    )
