"""HTTP routes of human labels and judge agreement, over the label service (recallq.labels.service).

    PUT|DELETE /v1/runs/{id}/items/{item_id}/claims/{index}/label   one claim (write)
    GET        /v1/runs/{id}/labels[?format=jsonl|csv]               every label (read)
    POST       /v1/runs/{id}/labels                                  import a file (write)
    POST       /v1/runs/{id}/labels/sample                           draw a sample (write)
    GET        /v1/runs/{id}/labels/sample[?format=csv]              the sample (read)
    GET        /v1/runs/{id}/agreement?by=&against=                  statistics (read)

Every route looks the run up in the key's project (another project's run is a 404).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from api import schemas
from api.auth import Project, Writer
from api.body import Pace, paced_chunks, too_large
from api.errors import STATUS_CODES, HttpError
from api.routes import MetadataField, Rt
from recallq.execution.runtime import Runtime
from recallq.labels import files
from recallq.labels.service import LabelService
from recallq.labels.store import (
    MAX_IMPORT_BYTES,
    MAX_NOTE_CHARS,
    MAX_PROBLEMS,
    MAX_SAMPLE,
    MAX_SEED,
    LabelError,
)
from recallq.state.runs import plausible_id

router = APIRouter(tags=["labels"])
errors = schemas.error_responses
T = TypeVar("T")
LABEL_PAGE = 1_000  # labels of the export read at once
SAMPLE_PAGE_ITEMS = 10  # items of the sample file read at once (each up to ~1 MB of passages)
ClaimIndex = Annotated[int, Path(ge=0, le=2**31 - 1, description="the claim's index")]
IMPORT_FORMATS = {"text/csv": "csv", "application/x-ndjson": "jsonl"}  # Content-Type: format


def _plausible(value: str) -> str:
    if not plausible_id(value):
        raise ValueError("is not an id this API can hold")
    return value


RunId = Annotated[str, Path(description="a run of the key's project"), AfterValidator(_plausible)]


class LabelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Literal["yes", "no"] = Field(description="does the context support the claim?")
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS, json_schema_extra=schemas.NO_NUL)


class Label(schemas._Open):
    item_id: str
    claim_index: int
    claim: str
    judge_verdict: str | None = Field(description="the judge's verdict, unchanged by the label")
    verdict: Literal["yes", "no"]
    note: str | None
    labelled_by: str | None = Field(description="the id of the key that labelled it")
    labelled_at: str


class Problem(BaseModel):
    line: int
    problem: str


class ImportResult(BaseModel):
    stored: int
    skipped: int = Field(description="rows whose verdict is empty (left to fill in)")
    problems: list[Problem] = Field(description=f"the first {MAX_PROBLEMS}, by line")
    problems_total: int


class SampleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(ge=1, le=MAX_SAMPLE, description="items to draw")
    seed: int = Field(0, ge=0, le=MAX_SEED)


class Sample(BaseModel):
    seed: int
    item_ids: list[str] = Field(description="in the order drawn (the labelling page's order)")


class Confusion(BaseModel):
    judge_yes_human_yes: int
    judge_yes_human_no: int
    judge_no_human_yes: int
    judge_no_human_no: int


class CorrectedEstimate(schemas._Open):
    mean_score: float
    mean_score_ci95: list[float]
    claim_recall: float
    claim_recall_ci95: list[float]
    judge_mean_score: float
    judge_claim_recall: float
    labelled_items: int
    method: Literal["ppi"]


class Agreement(schemas._Open):
    labelled_items: int
    labelled_claims: int
    agreement: float | None
    kappa: float | None
    kappa_ci95: list[float] | None
    confusion: Confusion
    precision: float | None
    recall: float | None
    sample: Literal["random", "chosen"] | None = Field(
        None, description="random: labels on a drawn sample (corrected); chosen: hand-picked"
    )
    corrected: CorrectedEstimate | None = None


def _labels(request: Request) -> LabelService:
    runtime: Runtime = request.app.state.runtime
    return LabelService(runtime.database)


Labels = Annotated[LabelService, Depends(_labels)]


@contextmanager
def _answering() -> Iterator[None]:
    """A labels error as its status (RunNotFound is the app's 404, api.errors)."""
    try:
        yield
    except LabelError as exc:
        code = STATUS_CODES.get(exc.status, "invalid_request")
        raise HttpError(exc.status, code, exc.message) from None


LABEL_PATH = "/v1/runs/{run_id}/items/{item_id:path}/claims/{claim_index}/label"


@router.put(LABEL_PATH, response_model=Label, responses=errors(401, 403, 404, 422))
def put_label(
    run_id: RunId,
    item_id: str,
    claim_index: ClaimIndex,
    body: LabelBody,
    labels: Labels,
    principal: Writer,
) -> dict[str, Any]:
    """Record a person's verdict on one claim (replacing an earlier label of it). The judge's
    verdict is kept as it is."""
    with _answering():
        return labels.set(
            run_id,
            principal.project,
            item_id,
            claim_index,
            body.verdict,
            body.note,
            principal.key_id,
        )


@router.delete(LABEL_PATH, status_code=204, responses=errors(401, 403, 404, 422))
def delete_label(
    run_id: RunId, item_id: str, claim_index: ClaimIndex, labels: Labels, principal: Writer
) -> Response:
    """Clear a claim's label (nothing happens when it has none)."""
    with _answering():
        labels.clear(run_id, principal.project, item_id, claim_index)
    return Response(status_code=204)


@router.get(
    "/v1/runs/{run_id}/labels",
    response_model=None,
    responses={
        200: {
            "description": '`{"labels": [...]}`, or the labels as JSONL or CSV',
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/x-ndjson": {"schema": {"type": "string"}},
                "text/csv": {"schema": {"type": "string"}},
            },
        },
        **errors(401, 404, 422),
    },
)
def get_labels(
    run_id: RunId,
    labels: Labels,
    project: Project,
    format: Literal["json", "jsonl", "csv"] = "json",
) -> Any:
    """Every label of the run, in item then claim order."""
    found = labels.check(run_id, project)
    media = {"json": "application/json", "csv": "text/csv", "jsonl": "application/x-ndjson"}
    return StreamingResponse(_label_pages(labels, found, format), media_type=media[format])


def _label_pages(labels: LabelService, run_id: str, format: str) -> Iterator[str]:
    """The labels, LABEL_PAGE of them per short transaction, as fast as the client reads
    (a run's labels carry notes of up to 2,000 characters each: held at once, a large run's
    were hundreds of megabytes per request)."""
    after: tuple[int, int] | None = None
    first = True
    if format == "json":
        yield '{"labels": ['
    while True:
        page, after = labels.label_page(run_id, after, LABEL_PAGE)
        if format == "json":
            for label in page:
                yield ("" if first else ",") + json.dumps(label, ensure_ascii=False)
                first = False
        else:
            yield from labels.export_lines(page, format, header=first)
            first = False
        if len(page) < LABEL_PAGE:
            break
    if format == "json":
        yield "]}"


@router.post(
    "/v1/runs/{run_id}/labels",
    response_model=ImportResult,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "a CSV or JSONL file of labels: `item_id` and `claim_index`, or "
            "`claim` (its text), with `verdict` (or `human_verdict`) `yes`|`no` and an optional "
            "`note`. Its first row says it is one: a CSV header naming a verdict column, a "
            "first JSONL object with a verdict field (else a 422); every other row is stored, "
            "skipped (verdict empty) or answered as a problem of its line",
            "content": {
                "text/csv": {
                    "schema": {"type": "string", "pattern": files.CSV_HEADER_PATTERN},
                    "example": "item_id,claim_index,verdict,note\nq1,0,yes,\n",
                },
                "application/x-ndjson": {
                    "schema": {
                        "type": "array",
                        "description": "one JSON object per line",
                        "minItems": 1,
                        "prefixItems": [files.FIRST_JSONL_ROW],
                    },
                    "example": [{"item_id": "q1", "claim_index": 0, "verdict": "yes"}],
                },
            },
        }
    },
    responses=errors(401, 403, 404, 408, 413, 415, 422),
)
async def import_labels(
    run_id: RunId, request: Request, runtime: Rt, labels: Labels, principal: Writer
) -> dict[str, Any]:
    """Store the good rows of a labels file and answer each other row's problem by line
    (unknown ids, bad verdicts, duplicate rows). Rows with an empty verdict are skipped."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    format = IMPORT_FORMATS.get(kind)
    if format is None:  # e.g. application/json, which the guards let through for other routes
        raise HttpError(
            415, "unsupported_media_type", "a labels file is text/csv or application/x-ndjson"
        )
    limit = MAX_IMPORT_BYTES
    chunks, size = [], 0
    async for chunk in paced_chunks(request, Pace.of(runtime.settings)):
        size += len(chunk)
        if size > limit:
            raise too_large(limit, "a labels file is")
        chunks.append(chunk)
    data = b"".join(chunks)

    def store() -> dict[str, Any]:
        with _answering():
            return labels.import_file(run_id, principal.project, data, format, principal.key_id)

    return await anyio.to_thread.run_sync(store)


@router.post(
    "/v1/runs/{run_id}/labels/sample",
    response_model=Sample,
    responses=errors(401, 403, 404, 409, 422),
)
def draw_sample(
    run_id: RunId, body: SampleBody, labels: Labels, principal: Writer
) -> dict[str, Any]:
    """Draw `size` items at random (seeded) among the run's scored items with claims, to be
    labelled (a 409 while it has none). The draw is kept: labels on its items correct the mean
    (`corrected`). A new draw replaces the old one."""
    with _answering():
        keys = labels.draw_sample(run_id, principal.project, body.size, body.seed, principal.key_id)
    return {"seed": body.seed, "item_ids": keys}


@router.get(
    "/v1/runs/{run_id}/labels/sample",
    response_model=None,
    responses={
        200: {
            "description": "the sample (`seed`, `item_ids`), or with `format=csv` every claim "
            "of its items as rows to fill in",
            "content": {
                "application/json": {"schema": Sample.model_json_schema()},
                "text/csv": {"schema": {"type": "string"}},
            },
        },
        **errors(401, 404, 422),
    },
)
def get_sample(
    run_id: RunId, labels: Labels, project: Project, format: Literal["json", "csv"] = "json"
) -> Any:
    """The run's drawn sample; 404 when none was drawn."""
    with _answering():
        seed, keys = labels.sample(run_id, project)
    if format == "json":
        return {"seed": seed, "item_ids": keys}
    return StreamingResponse(_sample_csv(labels, run_id, keys), media_type="text/csv")


def _sample_csv(labels: LabelService, run_id: str, keys: list[str]) -> Iterator[str]:
    """The sample file, read a few items at a time in short transactions. Every claim's row
    repeats its item's passages (up to a megabyte), so the whole file of a large sample is
    gigabytes: held at once, a few requests would exhaust the API's memory. (Starlette
    iterates this in its thread pool, and only as fast as the client reads.)"""
    yield from labels.sample_lines(())
    for start in range(0, len(keys), SAMPLE_PAGE_ITEMS):
        rows = labels.sample_rows(run_id, keys[start : start + SAMPLE_PAGE_ITEMS])
        if not rows:  # deleted while it was read
            return
        yield from labels.sample_lines(rows, header=False)


@router.get(
    "/v1/runs/{run_id}/agreement",
    response_model=Agreement,
    responses=errors(401, 404, 422),
)
def get_agreement(
    run_id: RunId,
    labels: Labels,
    project: Project,
    by: MetadataField = None,
    against: Annotated[
        str | None,
        Query(
            max_length=200,
            description="another run of the same claims: judge vs judge",
            json_schema_extra=schemas.NO_NUL,
        ),
        AfterValidator(lambda v: v if v is None else _plausible(v)),
    ] = None,
) -> JSONResponse:
    """How far the judge agrees with the labels: counts, raw agreement, Cohen's kappa with a
    95% interval, the confusion matrix, the judge's precision and recall on "yes", the
    claims they disagree on, and for a drawn sample the corrected mean score and claim
    recall (prediction-powered, 95% intervals). With `against`, the other run's verdicts on
    the same claims take the labels' place (`flip_rate`, `flipped`)."""

    with _answering():
        return JSONResponse(labels.agreement(run_id, project, by, against))
