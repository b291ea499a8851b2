"""Validating a submission and writing a run with its items in bulk.

Shared by the API (JSON and NDJSON bodies) and local mode. Items stream through in batches,
so memory stays flat in the number of items; the whole run is one transaction, so a rejected
submission leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from recallq import pipeline
from recallq.core import context as ctx
from recallq.core import inputs, scoring
from recallq.core import precision as precision_rules
from recallq.judge.models import LEXICAL, ModelConfig
from recallq.runs import dataset, estimate
from recallq.settings import DEFAULT_RETRY_DEADLINE, Settings
from recallq.state.claim_cache import ClaimCache
from recallq.state.runs import RunStore
from recallq.state.tables import Run, RunMode

MAX_RETRY_DEADLINE = 30 * 86400
MAX_BUDGET_USD = 1_000_000.0
MAX_BUDGET_TOKENS = 10**12
#: the default depth limit of JSON values in a submission (the API passes its setting)
MAX_JSON_DEPTH = 64

#: An earlier run's item for `claims_from`: its ground truth and its claims.
EarlierClaims = tuple[str | None, list[str]]


class SubmissionError(ValueError):
    """A client error; `status` is the HTTP status it maps to."""

    def __init__(self, message: str, code: str = "invalid_request", status: int = 422) -> None:
        super().__init__(message)
        self.message, self.code, self.status = message, code, status


class IdempotencyRace(Exception):
    """Another request with the same Idempotency-Key stored its run first (the caller reads
    that run and returns it)."""


@dataclass
class RunSpec:
    model: str
    name: str | None = None
    scale: float = 1.0
    context: list[str] | None = None
    context_extractor: dict[str, Any] | None = None
    project: str = "default"
    idempotency_key: str | None = None
    retry_deadline_s: float = DEFAULT_RETRY_DEADLINE
    mode: str = RunMode.ONLINE
    budget_usd: float | None = None
    budget_tokens: int | None = None
    limits: ctx.ContextLimits = ctx.DEFAULT_LIMITS
    #: the earlier run of the project whose items' claims the run's items take (by item id)
    claims_from: str | None = None
    #: how its items' passages are known relevant (recallq.core.precision.PrecisionMode)
    precision: str = precision_rules.DEFAULT_MODE


def require_known_model(model: Any, known_models: Iterable[str]) -> str:
    known = set(known_models)
    if not isinstance(model, str) or model not in known:
        shown = ctx._clip(model)
        if known <= {LEXICAL}:  # no models file was read where this runs
            hint = (
                f"no models file is loaded, so only {LEXICAL} is known: set "
                "RECALLQ_MODELS_FILE (e.g. examples/models.yaml) where the runs are scored "
                "(for a service, in the API's and the workers' environment)"
            )
        else:
            hint = (
                f"known models: {', '.join(sorted(known))} "
                "(more come from the models file named by RECALLQ_MODELS_FILE)"
            )
        raise SubmissionError(f"unknown model {shown}; {hint}", code="unknown_model")
    return model


def limits_of(settings: Settings) -> ctx.ContextLimits:
    """The context limits the settings give."""
    return ctx.ContextLimits(
        max_bytes=settings.max_context_bytes,
        max_passages=settings.max_context_passages,
        jmespath_timeout=settings.jmespath_timeout,
    )


def build_spec(
    *,
    model: str | None,
    known_models: Iterable[str],
    default_model: str = LEXICAL,
    name: str | None = None,
    scale: Any = 1,
    context: Any = None,
    context_extractor: Any = None,
    project: str = "default",
    idempotency_key: str | None = None,
    retry_deadline_s: Any = None,
    default_retry_deadline: float = DEFAULT_RETRY_DEADLINE,
    mode: Any = None,
    batch_models: Iterable[str] = (),
    budget_usd: Any = None,
    budget_tokens: Any = None,
    limits: ctx.ContextLimits = ctx.DEFAULT_LIMITS,
    claims_from: Any = None,
    precision: Any = None,
) -> RunSpec:
    """A checked run spec. `batch_models` are the models whose provider Batch API may be
    used: a batch-mode run of another model is refused."""
    # none or "" is the default model; anything else must name one ({} is no model)
    model = require_known_model(default_model if model in (None, "") else model, known_models)
    run_mode = _mode(mode, model, batch_models)
    precision_mode = _precision(precision)
    try:
        scale = scoring.submitted_scale(scale)
        extractor = ctx.validate_extractor(context_extractor)
        deadline = _retry_deadline(retry_deadline_s, default_retry_deadline)
        usd = _budget(budget_usd, "budget_usd", MAX_BUDGET_USD, integral=False)
        tokens = _budget(budget_tokens, "budget_tokens", MAX_BUDGET_TOKENS, integral=True)
        if name is not None:
            if not isinstance(name, str) or len(name) > 200:
                raise ValueError("name must be a string of at most 200 characters")
            inputs.check_text(name, "name")
        if idempotency_key is not None:
            inputs.check_text(idempotency_key, "Idempotency-Key")
        if claims_from is not None and not isinstance(claims_from, str):
            raise ValueError("claims_from must be a run id")
        if context is not None and not isinstance(context, list | str):
            raise ValueError("context must be a list of strings")
        static = ctx.to_passages(context, limits) if context is not None else None
        if static is not None:
            ctx.check_passages(static, limits, "the run's static context")
    except ValueError as exc:
        raise SubmissionError(str(exc)) from exc
    return RunSpec(
        model=model,
        name=name,
        scale=scale,
        context=static,
        context_extractor=extractor,
        project=project,
        idempotency_key=idempotency_key or None,
        retry_deadline_s=deadline,
        mode=run_mode,
        budget_usd=usd,
        budget_tokens=None if tokens is None else int(tokens),
        limits=limits,
        claims_from=claims_from,
        precision=precision_mode,
    )


def _precision(value: Any) -> precision_rules.PrecisionMode:
    """`cited` (default), `judged` or `off`, in either mode (the provider batch lane makes
    `judged`'s context_relevance requests as the online engine makes its calls)."""
    try:
        return precision_rules.validate_mode(value)
    except ValueError as exc:
        raise SubmissionError(str(exc)) from exc


def _mode(value: Any, model: str, batch_models: Iterable[str]) -> RunMode:
    """`online` (default) or `batch`; batch only for a model the models file marks `batch:
    true` (its provider's Batch API is what the lane calls)."""
    if value is None:
        return RunMode.ONLINE
    if value not in tuple(RunMode):
        raise SubmissionError('mode must be "online" or "batch"')
    if value == RunMode.BATCH and model not in set(batch_models):
        capable = ", ".join(sorted(batch_models)) or "none"
        raise SubmissionError(
            f"model {model!r} cannot run in batch mode: the models file does not mark it "
            f"`batch: true` (models that can: {capable})",
            code="batch_not_supported",
        )
    return RunMode(value)


def check_budget(budget_usd: Any, budget_tokens: Any) -> tuple[float | None, int | None]:
    """A run's budget fields, checked (ValueError naming the field)."""
    usd = _budget(budget_usd, "budget_usd", MAX_BUDGET_USD, integral=False)
    tokens = _budget(budget_tokens, "budget_tokens", MAX_BUDGET_TOKENS, integral=True)
    return usd, None if tokens is None else int(tokens)


def _budget(value: Any, name: str, most: float, integral: bool) -> float | None:
    """A run's spending limit: None, or a positive finite number (a whole one for tokens)."""
    if value is None:
        return None
    kind = "a whole number" if integral else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be {kind}")
    if integral and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be {kind}")
    if not (math.isfinite(value) and 0 < value <= most):
        raise ValueError(f"{name} must be more than 0 and at most {most:g}")
    return float(value)


def _retry_deadline(value: Any, default: float) -> float:
    """Seconds an item may wait out a provider incident: a positive number, at most 30 days."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("retry_deadline_s must be a number of seconds")
    if not (math.isfinite(value) and 0 < value <= MAX_RETRY_DEADLINE):
        raise ValueError(f"retry_deadline_s must be more than 0 and at most {MAX_RETRY_DEADLINE}")
    return float(value)


def item_row(raw: Any, index: int, spec: RunSpec) -> tuple[dict[str, Any], bool]:
    """The row for one submitted item, and whether any context source applies to it.

    The item goes through recallq.runs.dataset.normalise, the one place field aliases apply
    (`reference`, `retrieved_contexts`, ...): files, frames and API bodies are read alike, and
    fields that are not item fields become its metadata.
    An item that takes the run's static context stores none of its own (None): the run holds
    it once, and the attribution stage reads it from there."""
    if not isinstance(raw, dict):
        raise SubmissionError(f"item {index}: must be a JSON object")
    try:
        item = dataset.normalise(raw, index)
    except dataset.DatasetError as exc:
        raise SubmissionError(str(exc)) from exc
    key = item.get("id", str(index))
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if not isinstance(key, str) or not key or len(key) > 200:
        raise SubmissionError(f"item {index}: id must be a non-empty string of at most 200 chars")
    item_context, input_, output = item.get("context"), item.get("input"), item.get("output")
    source = ctx.context_source(item_context, input_, output, spec.context_extractor)
    contexts: list[str] | None = None
    if source != "run":
        try:
            contexts = ctx.resolve_context(
                item_context, input_, output, spec.context, spec.context_extractor, spec.limits
            )
        except ctx.ContextError as exc:
            shown = key if len(key) <= 40 else key[:39] + "…"
            raise SubmissionError(f"item {index} ({shown}): {exc}") from exc
    resolvable = source != "run" or bool(spec.context)
    metadata = item.get("metadata") or {}
    try:
        id_precision, id_recall = precision_rules.id_scores(
            metadata.get(precision_rules.RETRIEVED_IDS),
            metadata.get(precision_rules.REFERENCE_IDS),
            spec.scale,
        )
    except ValueError as exc:
        raise SubmissionError(f"item {index}: {exc}") from exc
    row = {
        "idx": index,
        "key": key,
        "input": input_,
        "output": output,
        "ground_truth": scoring.ground_truth_text(item.get("ground_truth")),
        "contexts": contexts,
        "item_metadata": item.get("metadata"),
        "id_precision": id_precision,
        "id_recall": id_recall,
    }
    return row, resolvable


def find_by_idempotency_key(session: Session, spec: RunSpec) -> Run | None:
    if spec.idempotency_key is None:
        return None
    return session.scalars(
        select(Run).where(Run.project == spec.project, Run.idempotency_key == spec.idempotency_key)
    ).one_or_none()


def check_same_submission(run: Run, spec: RunSpec, items: Iterable[Any]) -> None:
    """A retried submission must be the one its Idempotency-Key first made: the same run
    fields and as many items (read through, not stored); else a 422."""
    differs = _differing_fields(run, spec)
    if not differs and sum(1 for _ in items) != run.total_items:
        differs.append("number of items")
    _refuse_reuse(differs)


def _differing_fields(run: Run, spec: RunSpec) -> list[str]:
    fields = {
        "model": (run.model, spec.model),
        "name": (run.name, spec.name),
        "scale": (run.scale, spec.scale),
        "context": (run.context, spec.context),
        "context_extractor": (run.context_extractor, spec.context_extractor),
        "retry_deadline_s": (run.retry_deadline_s, spec.retry_deadline_s),
        "mode": (run.mode, spec.mode),
        "precision": (run.precision or precision_rules.DEFAULT_MODE, spec.precision),
        "budget_usd": (run.budget_usd, spec.budget_usd),
        "budget_tokens": (run.budget_tokens, spec.budget_tokens),
    }
    return [name for name, (stored, sent) in fields.items() if stored != sent]


def _refuse_reuse(differs: list[str]) -> None:
    if differs:
        raise SubmissionError(
            "this Idempotency-Key was used for a different submission "
            f"(its {', '.join(differs)} differ); use a new key for a new run",
            code="idempotency_key_reused",
        )


def create_run(
    session: Session, runs: RunStore, spec: RunSpec, items: Iterable[Any], settings: Settings
) -> Run:
    """Check every item and store the run with them. Raises SubmissionError (nothing is kept),
    or IdempotencyRace when a concurrent request with the same Idempotency-Key stored its run
    first (the caller rolls back and returns that run)."""
    run = Run(
        id=str(uuid.uuid4()),
        project=spec.project,
        name=spec.name,
        model=spec.model,
        scale=spec.scale,
        context=spec.context,
        context_extractor=spec.context_extractor,
        idempotency_key=spec.idempotency_key,
        retry_deadline_s=spec.retry_deadline_s,
        mode=spec.mode,
        precision=spec.precision,
        budget_usd=spec.budget_usd,
        budget_tokens=spec.budget_tokens,
    )
    rows = ItemRows(items, spec, settings.max_items_per_run, max_item_bytes=settings.max_item_bytes)
    checked = rows if not isinstance(items, CheckedRows) else items
    try:
        run.total_items = runs.create(session, run, checked)
    except IntegrityError as exc:
        if _is_idempotency_conflict(exc):
            raise IdempotencyRace from exc
        raise _duplicate_id(exc) from exc
    if checked is rows:
        check_rows(rows)
    return run


class CheckedRows(Iterable[dict[str, Any]]):
    """Item rows that went through ItemRows and check_rows already (recallq.runs.service)."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


def check_rows(rows: ItemRows) -> None:
    """After every row went through: the run is not empty and some item has a context."""
    if rows.count == 0:
        raise SubmissionError("the run has no items", code="empty_run")
    if not rows.any_resolvable:
        raise SubmissionError(
            "no item can resolve a context: give items a context, the run a static context, "
            "or a context_extractor for agent-shaped items",
            code="no_context",
        )


def estimate_run(
    session: Session,
    spec: RunSpec,
    items: Iterable[Any],
    settings: Settings,
    models: Mapping[str, ModelConfig],
    batch: int = 1000,
) -> estimate.Estimate:
    """What the run would cost (recallq.runs.estimate), checking every item as a submission
    does (the same 4xx for the same problems); nothing is written. Claims the project's claim
    cache holds count as hits: no extraction call; online extractions are packed as the
    engine packs them, batch requests priced at the batch price."""
    rows = ItemRows(items, spec, settings.max_items_per_run, max_item_bytes=settings.max_item_bytes)
    result = estimate_checked(session, spec, rows, settings, models, batch)
    check_rows(rows)
    return result


def estimate_checked(
    session: Session,
    spec: RunSpec,
    rows: Iterable[dict[str, Any]],
    settings: Settings,
    models: Mapping[str, ModelConfig],
    batch: int = 1000,
    inherited: Mapping[str, EarlierClaims] | None = None,
) -> estimate.Estimate:
    """estimate_run of item rows already checked. `inherited`: the claims of the run that
    `claims_from` names, by item id; an item that takes them (pipeline.inherited_claims)
    needs no extraction."""
    estimator = estimate.estimator_for(
        spec.model,
        models,
        settings.extraction_pack,
        settings.extraction_pack_tokens,
        spec.mode,
        spec.precision,
    )
    pending: list[dict[str, Any]] = []

    def add(pending: list[dict[str, Any]]) -> None:
        truths = [row["ground_truth"] for row in pending if row["ground_truth"] is not None]
        keys = {text: ClaimCache.key(text, spec.model, project=spec.project) for text in truths}
        cached = ClaimCache.read(session, list(keys.values())) if spec.model != LEXICAL else {}
        for row in pending:
            truth = row["ground_truth"]
            contexts = spec.context or [] if row["contexts"] is None else row["contexts"]
            earlier = (inherited or {}).get(row["key"])
            known = pipeline.inherited_claims(truth, *earlier) if earlier else None
            estimator.add(
                truth, contexts, None if truth is None else cached.get(keys[truth]), known
            )

    for row in rows:
        pending.append(row)
        if len(pending) >= batch:
            add(pending)
            pending = []
    add(pending)
    return estimator.result()


class ItemRows:
    """The rows of a submission's items, checked one by one as they stream through: at most
    `max_items`, each at most `max_item_bytes` as JSON, ids unique, and the run's context
    extractor within `context_extractor_budget` seconds for the whole submission."""

    count = 0

    def __init__(
        self,
        items: Iterable[Any],
        spec: RunSpec,
        max_items: int,
        *,
        max_item_bytes: int | None = None,
        context_extractor_budget: float | None = None,
    ) -> None:
        self._items, self._spec, self._max = items, spec, max_items
        self._max_bytes, self._budget = max_item_bytes, context_extractor_budget
        self.any_resolvable = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        seen: set[str] = set()
        timed = self._spec.context_extractor is not None and self._budget is not None
        spent = 0.0
        for index, raw in enumerate(_as_submission_errors(self._items)):
            if index >= self._max:
                raise SubmissionError(
                    f"a run holds at most {self._max} items", code="too_many_items", status=413
                )
            if self._max_bytes is not None:
                _check_item_size(raw, index, self._max_bytes)
            started = time.monotonic() if timed else 0.0
            row, resolvable = item_row(raw, index, self._spec)
            if timed:
                spent += time.monotonic() - started
                if self._budget is not None and spent > self._budget:
                    raise SubmissionError(
                        f"the context_extractor took more than {self._budget:g} s for the "
                        f"first {index + 1} items, the limit for one submission: use a "
                        "simpler expression, send fewer items at once, or give items their "
                        "context",
                        code="context_extractor_too_slow",
                    )
            if row["key"] in seen:
                raise SubmissionError(
                    f"item ids must be unique within a run: {row['key']!r} appears twice",
                    code="duplicate_id",
                )
            seen.add(row["key"])
            self.any_resolvable = self.any_resolvable or resolvable
            self.count = index + 1
            yield row


def _as_submission_errors(items: Iterable[Any]) -> Iterator[Any]:
    """The items, a reader's DatasetError (a file or frame read lazily) raised as the
    SubmissionError the service answers for the same problem."""
    iterator = iter(items)
    while True:
        try:
            raw = next(iterator)
        except StopIteration:
            return
        except dataset.DatasetError as exc:
            raise SubmissionError(str(exc)) from exc
        yield raw


def _check_item_size(raw: Any, index: int, max_bytes: int) -> None:
    """An item under the per-item limit, as JSON (413 past it): the API's NDJSON lines and
    JSON bodies, files scored locally and `recallq.evaluate` alike."""
    try:
        size = len(json.dumps(raw, ensure_ascii=False, default=str).encode())
    except (TypeError, ValueError):
        return  # not JSON-shaped: item_row says what is wrong with it
    if size > max_bytes:
        raise SubmissionError(
            f"item {index}: larger than {max_bytes} bytes", code="item_too_large", status=413
        )


def _is_idempotency_conflict(exc: IntegrityError) -> bool:
    """Whether the unique key broken is the run's (project, idempotency_key)."""
    constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
    if constraint is not None:
        return bool(constraint == "uq_runs_idempotency")
    return "runs.idempotency_key" in str(exc.orig)  # SQLite names the columns


def _duplicate_id(exc: IntegrityError) -> SubmissionError:
    # Postgres names the key in its detail ("Key (run_id, key)=(…, q7) already exists.")
    detail = getattr(getattr(exc.orig, "diag", None), "message_detail", None) or ""
    found = re.search(r"\)=\([^,]*, (.*)\) already exists", detail)
    which = f": {found.group(1)!r} appears twice" if found else ""
    return SubmissionError(f"item ids must be unique within a run{which}", code="duplicate_id")


def parse_ndjson_lines(
    lines: Iterable[bytes | str], max_bytes: int, max_depth: int = MAX_JSON_DEPTH
) -> Iterator[Any]:
    """Items from NDJSON lines; blank lines are skipped; a bad line is a 422 naming it (NaN,
    NUL characters, lone surrogates and deep nesting are bad too: see recallq.core.inputs)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > max_bytes:
            raise SubmissionError(
                f"line {number}: item larger than {max_bytes} bytes",
                code="item_too_large",
                status=413,
            )
        try:
            yield inputs.loads(line, max_depth, where=f"line {number}")
        except inputs.UnsafeInput as exc:
            raise SubmissionError(str(exc), code="invalid_json") from None
