"""The shapes the HTTP API sends and takes, for its OpenAPI document.

They document; they do not filter: routes return the read models of recallq.runs.reads as they
are, and these models allow extra fields, so a field added there is never dropped on the way
out (the spec only promises the fields listed here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeAliasType

from recallq.core import scoring
from recallq.core.context import AGENT_INPUT_KEYS
from recallq.core.status import PublicItemStatus, RunStatus
from recallq.runs import ingest


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    code: str = Field(description="stable, machine-readable: `not_found`, `unauthenticated`, ...")
    message: str = Field(description="for people; may change")


class ErrorResponse(BaseModel):
    """Every 4xx (and a 500, should one happen) has this shape."""

    error: ErrorDetail


class Counts(_Open):
    total: int
    pending: int
    running: int
    succeeded: int
    failed: int
    cancelled: int


class Summary(_Open):
    mean_score: float | None
    mean_ci95: list[float] | None = Field(
        None, description="95% interval [low, high] of mean_score (normal approximation)"
    )
    scored_items: int
    claims_total: int
    claims_attributed: int
    no_ground_truth: int = Field(description="scored 0: nothing to check, not a retrieval miss")
    no_context: int = Field(
        0, description="scored 0: no passage was retrieved for it (usually a pipeline bug)"
    )
    mean_context_precision: float | None = Field(
        None, description="mean context precision of the items with a context and ground truth"
    )
    context_precision_ci95: list[float] | None = Field(
        None, description="95% interval [low, high] of mean_context_precision"
    )
    precision_items: int = Field(0, description="items with a context precision")
    mean_id_precision: float | None = None
    mean_id_recall: float | None = None


class Spent(_Open):
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class RunUsage(_Open):
    llm_calls: int = Field(description="calls the provider answered (what is billed)")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    claim_cache_hits: int | None = None
    by_stage: dict[Literal["extraction", "attribution", "relevance"], Spent] | None = None
    by_lane: dict[Literal["online", "batch"], Spent] | None = None
    call_attempts: int | None = Field(None, description="requests sent, failed ones included")
    failed_calls: int | None = Field(None, description="answered with an error, or not at all")
    deferrals: int | None = Field(None, description="times items waited for a provider")


class BatchProgress(_Open):
    requests_submitted: int
    completed: int
    failed: int
    batches_pending: int


class Waiting(_Open):
    model: str | None
    reason: str
    since: str | None
    next_probe_at: str | None


class RunView(_Open):
    id: str
    name: str | None
    status: RunStatus
    model: str
    mode: Literal["online", "batch"] = "online"
    precision: Literal["cited", "judged", "off"] = "cited"
    scale: float
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    retry_deadline_s: float | None = None
    counts: Counts
    summary: Summary
    usage: RunUsage
    waiting: Waiting | None = None
    waiting_unknown: bool = Field(
        False, description="Redis could not be asked why the run waits: `waiting` is unknown"
    )
    batch: BatchProgress | None = None
    cancel_reason: Literal["user", "budget"] | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None


class RunsPage(_Open):
    runs: list[RunView]
    next_cursor: str | None


class Comparison(_Open):
    """Two runs of the same items, paired by item id."""

    matched: int
    unmatched: dict[str, int]
    base_mean: float | None
    candidate_mean: float | None
    mean_difference: float | None
    ci95: list[float] | None
    improved: int
    regressed: int
    unchanged: int
    largest_changes: list[dict[str, Any]]
    corrected: dict[str, Any] | None = Field(
        None,
        description="when both runs have labels of random samples: the mean difference "
        "corrected by them (ppi), `{judge_mean_difference, mean_difference, ci95, "
        "labelled_items{base, candidate}, method}`",
    )


class RetriedRun(RunView):
    retried_items: int


class CancelledRun(RunView):
    calls_stopped: bool = Field(
        description="false when Redis could not be reached: the run is cancelled (no item "
        "starts another stage) but judge calls already under way may still end"
    )


class ResumeRequest(BaseModel):
    """Optional: a run cancelled at its budget resumes only with a higher one."""

    model_config = ConfigDict(extra="forbid")
    budget_usd: float | None = Field(None, gt=0, le=1_000_000)
    budget_tokens: int | None = Field(None, gt=0, le=10**12)


class ResumedRun(RunView):
    resumed_items: int


class ClaimView(_Open):
    index: int
    text: str
    verdict: Literal["yes", "no"] | None
    context_indices: list[int]
    reason: str | None


class PassageView(_Open):
    index: int
    relevant: bool
    claims: list[int] = Field(description="the claims (judged yes) that cite this passage")
    reason: str | None = Field(None, description="the judge's reason (precision judged)")


class ItemView(_Open):
    id: str
    index: int
    status: PublicItemStatus
    score: float | None
    reason: str | None
    error: str | None
    attempts: int
    deferrals: int | None = None
    claims_total: int | None
    claims_attributed: int | None
    claims: list[ClaimView]
    context_precision: float | None = Field(
        None,
        description="average precision of the passages' order; null: no context or no "
        "ground truth, or precision off",
    )
    first_relevant_rank: int | None = None
    passages: list[PassageView] | None = None
    id_precision: float | None = None
    id_recall: float | None = None


class ItemsPage(_Open):
    items: list[ItemView]
    next_cursor: str | None


class Estimate(_Open):
    """What a run would take (`dry_run=true`): nothing is created."""

    dry_run: Literal[True]
    model: str
    mode: Literal["online", "batch"]
    items: int
    calls: int = Field(
        description="judge calls: claim-cache hits subtracted, extractions packed as the "
        "workers pack them (online), one request per item and stage (batch)"
    )
    extraction_calls: int
    attribution_calls: int
    cache_hits: int
    prompt_tokens: int
    completion_tokens: int
    tokens: int
    cost_usd: float | None = Field(
        description="at the batch price for a batch run; null when the model has no known price"
    )
    priced: bool


class Health(BaseModel):
    status: Literal["ok"]


#: what GET /readyz checks (each may be left out of its status with ?exclude=)
ReadinessCheck = Literal["database", "redis", "workers"]


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str]
    workers_alive: int


# --- what POST /v1/runs takes -------------------------------------------------------------

#: what the served schema says of text the server refuses with a NUL in it (checked there)
NO_NUL: dict[str, Any] = {"pattern": "^[^\\u0000]*$"}
PlainText = Annotated[str, Field(pattern=NO_NUL["pattern"])]
# an object's keys: without NUL (`patternProperties`, and no other key)
_KEYS_WITHOUT_NUL = Field(json_schema_extra={"additionalProperties": False})
#: Any JSON value a submission carries (an input, an output, a metadata value): the server
#: refuses a NUL in any of its strings, an object's keys included (recallq.core.inputs).
if TYPE_CHECKING:  # a recursive alias with Annotated parts is beyond mypy: Any to it
    JsonValue: TypeAlias = Any
else:
    JsonValue = TypeAliasType(
        "JsonValue",
        # `|` cannot join the string forward references of a recursive alias
        Union[  # noqa: UP007
            None,
            bool,
            int,
            float,
            PlainText,
            list["JsonValue"],
            Annotated[dict[PlainText, "JsonValue"], _KEYS_WITHOUT_NUL],
        ],
    )
JsonObject = Annotated[dict[PlainText, JsonValue], _KEYS_WITHOUT_NUL]


class ToolResultsExtractor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_results"]
    tools: list[Annotated[str, Field(pattern=r"\S")]] | None = Field(
        None, min_length=1, description="tool names (not blank); none: every tool's results"
    )


class JmespathExtractor(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["jmespath"]
    expression: str = Field(min_length=1, max_length=1000)


class SubmittedItem(BaseModel):
    """One item. `context` may be left out when the run has a static context, or when the
    item is agent-shaped and the run names a context_extractor."""

    # unknown fields are kept (they go to metadata): any JSON value, under a name without NUL
    model_config = ConfigDict(extra="allow", json_schema_extra={"propertyNames": NO_NUL})
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)
    id: PlainText | int | None = Field(None, description="unique within the run; default: index")
    input: JsonValue = None
    output: JsonValue = None
    ground_truth: JsonValue = Field(None, description="a non-string one is scored as its JSON text")
    context: list[JsonValue] | PlainText | None = None
    metadata: JsonObject | None = Field(
        None, description="kept with the item; other unknown fields go here too"
    )


_AGENT_INPUT = {
    "anyOf": [
        {"type": "null"},
        {"type": "object", "anyOf": [{"required": [key]} for key in AGENT_INPUT_KEYS]},
    ]
}
_AGENT_OUTPUT = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"type": "string"}},
    },
}
_NON_BLANK = {"type": "string", "pattern": r"\S"}
#: A run is refused (422 no_context) when no item can resolve a context; the served schema
#: says which bodies can: an item with its own context, a static context with a passage, or
#: a context_extractor and an agent-shaped item (recallq.core.context.can_resolve_any).
CONTEXT_SOURCES: Any = {
    "anyOf": [
        {
            "properties": {
                "items": {
                    "contains": {
                        "type": "object",
                        "required": ["context"],
                        "properties": {"context": {"type": ["array", "string"]}},
                    }
                }
            }
        },
        {
            "required": ["context"],
            "properties": {
                "context": {"anyOf": [_NON_BLANK, {"type": "array", "contains": _NON_BLANK}]}
            },
        },
        {
            "required": ["context_extractor"],
            "properties": {
                "context_extractor": {"type": "object"},
                "items": {
                    "contains": {
                        "type": "object",
                        "required": ["output"],
                        "properties": {"input": _AGENT_INPUT, "output": _AGENT_OUTPUT},
                    }
                },
            },
        },
    ]
}


class RunSubmission(BaseModel):
    """A JSON submission (at most `RECALLQ_MAX_JSON_BODY_BYTES`; large runs use NDJSON)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=CONTEXT_SOURCES)
    name: PlainText | None = Field(None, max_length=200)
    model: str | None = Field(None, description="a name from the models file")
    mode: Literal["online", "batch"] | None = Field(
        "online",
        description="batch: through the provider's Batch API (a model marked batch); null: online",
    )
    scale: float | None = Field(
        1,
        ge=scoring.MIN_SCALE,
        le=scoring.MAX_SCALE,
        description="scores run from 0 to this (reported to 2 decimals); null: 1",
    )
    context: list[JsonValue] | PlainText | None = Field(
        None, description="static context for every item"
    )
    context_extractor: ToolResultsExtractor | JmespathExtractor | None = None
    retry_deadline_s: float | None = Field(None, gt=0, le=ingest.MAX_RETRY_DEADLINE)
    budget_usd: float | None = Field(None, gt=0, le=1_000_000)
    budget_tokens: int | None = Field(None, gt=0, le=10**12)
    claims_from: str | None = Field(
        None,
        max_length=200,
        description="an earlier run of the project: each item takes the claims of its item of "
        "the same id and ground truth, and is only attributed (no extraction call); other "
        "items are extracted as usual. An unknown run (or another project's) is a 422",
    )
    precision: Literal["cited", "judged", "off"] | None = Field(
        None,
        description="context precision: cited (default; from attribution's citations, no extra "
        "call), judged (one context_relevance call per item with a context; online only) or off",
    )
    items: list[SubmittedItem] = Field(min_length=1)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses for these error statuses, each with the error shape."""
    return {
        status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
        for status in statuses
    }


_DESCRIPTIONS = {
    400: "Malformed body or parameters",
    401: "Missing, unknown or revoked API key (`unauthenticated`)",
    403: "The key's role may not do this (`forbidden`)",
    404: "No such run in the key's project (another project's run is not found either)",
    405: "Method not allowed (the `Allow` header lists those that are)",
    408: "The request body arrived too slowly",
    409: "The run is in a state that does not allow this",
    413: "Body, line or item count over a limit",
    415: "Unsupported Content-Type",
    422: "The request is well-formed but not acceptable (the message says why)",
    429: "Too many submissions or open result streams for this key, or the project holds as "
    "much as it may (`Retry-After` says when to retry)",
    503: "The server is busy receiving other uploads; retry",
}
