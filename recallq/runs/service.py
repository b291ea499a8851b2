"""The run service: every use case of a run, once, for every adapter.

The HTTP routes (api/routes.py), the web pages' buttons (api/pages.py), the CLI (local and
remote) and `recallq.evaluate` call these and only translate their answers and errors:

    submit    a checked spec (`spec`), items checked outside any lock, quotas, idempotency
    estimate  what a submission would cost, with the same checks
    cancel    the run and its unended items in the database, then the call gate
    retry     failed items queued again
    resume    a cancelled run's cancelled, unscored items queued again (a budget-cancelled
              run needs a higher budget), or an interrupted local run's handed-out items
    delete    an ended run with its items and claims

Reads are recallq.runs.reads (RunReads): every front end reads runs there, and this service
answers with its run object.

Errors are recallq.runs.ingest.SubmissionError (a 4xx with its code and message), RunNotFound,
and RunConflict (a 409 with its code and message).
"""

from __future__ import annotations

import itertools
import json
import logging
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from recallq import pipeline
from recallq.core.status import RUN_ACTIVE, RunStatus
from recallq.execution.runtime import Runtime
from recallq.judge import models as judge_models
from recallq.judge.models import ModelConfig
from recallq.runs import ingest, quotas
from recallq.runs.reads import RunReads
from recallq.settings import Settings
from recallq.state.runs import (
    MAX_ID_LENGTH,
    RunActiveError,
    RunBudgetSpentError,
    RunCancelledError,
    RunNotCancelledError,
    RunNotFound,
    find_run,
    plausible_id,
)
from recallq.state.tables import Claim, Item, Run

log = logging.getLogger(__name__)

#: The run fields a submission may carry besides its items (body fields or query parameters).
RUN_FIELDS = (
    "name",
    "model",
    "scale",
    "mode",
    "context",
    "context_extractor",
    "retry_deadline_s",
    "budget_usd",
    "budget_tokens",
    "claims_from",
    "precision",
)
CLAIM_BATCH = 2000  # inherited claims inserted per statement


class RunConflict(Exception):
    """The run is not in a state the action applies to: a 409 with this code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Submitted:
    view: dict[str, Any]
    created: bool  # False: the run an earlier submission with this Idempotency-Key made


@dataclass(frozen=True)
class Cancelled:
    view: dict[str, Any]
    #: False when Redis could not be reached: the run is cancelled in the database (no item
    #: starts another stage), but judge calls already under way were not stopped.
    calls_stopped: bool


def spec_of(
    fields: Mapping[str, Any],
    settings: Settings,
    models: Mapping[str, ModelConfig],
    project: str = "default",
    idempotency_key: str | None = None,
) -> ingest.RunSpec:
    """The one way run fields become a checked RunSpec: the settings' defaults and limits,
    the models file's models (RunService.spec; `recallq estimate` has no runtime)."""
    unknown = set(fields) - set(RUN_FIELDS)
    if unknown:
        names = ", ".join(sorted(name[:40] for name in unknown)[:10])
        raise ingest.SubmissionError(f"unknown field(s): {names}")
    scale = fields.get("scale")
    return ingest.build_spec(
        model=fields.get("model"),
        default_model=settings.default_model,
        known_models=models,
        name=fields.get("name"),
        scale=1 if scale is None else scale,
        context=fields.get("context"),
        context_extractor=fields.get("context_extractor"),
        project=project,
        idempotency_key=idempotency_key or None,
        retry_deadline_s=fields.get("retry_deadline_s"),
        default_retry_deadline=settings.retry_deadline,
        budget_usd=fields.get("budget_usd"),
        budget_tokens=fields.get("budget_tokens"),
        limits=ingest.limits_of(settings),
        mode=fields.get("mode"),
        batch_models=judge_models.batch_models(models),
        claims_from=fields.get("claims_from"),
        precision=fields.get("precision"),
    )


class RunService:
    """The use cases of runs over one runtime. `local=True` (local mode: one user, one
    process) skips the per-project caps on active runs and queued items, and a new run is
    not dispatched on submission: the local runner dispatches it when it starts scoring."""

    def __init__(self, runtime: Runtime, *, local: bool = False) -> None:
        self.runtime = runtime
        self.reads = RunReads.of(runtime, local=local)
        self.settings = runtime.settings
        self._quotas = not local
        self._dispatch = not local

    # --- submit ------------------------------------------------------------------------------

    def spec(
        self, fields: Mapping[str, Any], project: str, idempotency_key: str | None = None
    ) -> ingest.RunSpec:
        """The checked spec of a submission's run fields (RUN_FIELDS; absent ones default)."""
        return spec_of(fields, self.settings, self.runtime.models, project, idempotency_key)

    def admit(self, project: str) -> None:
        """Before a body is read: the project may start another run (QuotaExceeded if not)."""
        if not self._quotas:
            return
        with self.runtime.database.session() as session:
            quotas.check_active_runs(session, project, self.settings.max_active_runs_per_project)

    def submit(self, spec: ingest.RunSpec, items: Iterable[Any]) -> Submitted:
        """Check every item, then store the run with them; or return the run this spec's
        Idempotency-Key made. Items are checked (context extractors included, under the
        submission's time budget) before any transaction or lock is taken, so one slow
        submission holds up no other; then they are written under the project's lock."""
        with _CheckedRows(spec, items, self.settings) as rows:
            try:
                with self.runtime.database.session() as session:
                    if (found := self._replay(session, spec, rows.count)) is not None:
                        return found
                    earlier = self._claims_source(session, spec)
                    quotas.lock_project(session, spec.project)
                    if (found := self._replay(session, spec, rows.count)) is not None:
                        return found  # a twin committed while we waited
                    if self._quotas:
                        quotas.check_new_run(
                            session,
                            spec.project,
                            rows.count,
                            self.settings.max_active_runs_per_project,
                            self.settings.max_queued_items_per_project,
                        )
                    run = ingest.create_run(
                        session,
                        self.runtime.runs,
                        spec,
                        ingest.CheckedRows(rows.checked()),
                        self.settings,
                    )
                    session.flush()
                    if earlier is not None:
                        _inherit_claims(session, run, earlier)
                    view = self.reads.view_of(session, run)
            except ingest.IdempotencyRace:
                with self.runtime.database.session() as session:
                    found = self._replay(session, spec, rows.count)
                if found is None:  # the twin was rolled back after all
                    raise RunConflict(
                        "conflict", "a submission with this Idempotency-Key failed; retry"
                    ) from None
                return found
        self.queue(view["id"])
        return Submitted(view, True)

    @staticmethod
    def _claims_source(session: Session, spec: ingest.RunSpec) -> Run | None:
        """The run `claims_from` names: the project's, else the submission is refused (another
        project's run is not found, like a missing one)."""
        if spec.claims_from is None:
            return None
        earlier = find_run(session, spec.claims_from, spec.project)
        if earlier is None:
            shown = spec.claims_from[:MAX_ID_LENGTH]
            raise ingest.SubmissionError(
                f"claims_from: run {shown!r} not found", code="claims_from_not_found"
            )
        return earlier

    def _replay(self, session: Session, spec: ingest.RunSpec, count: int) -> Submitted | None:
        existing = ingest.find_by_idempotency_key(session, spec)
        if existing is None:
            return None
        ingest.check_same_submission(existing, spec, itertools.repeat(None, count))
        return Submitted(self.reads.view_of(session, existing), False)

    def estimate(self, spec: ingest.RunSpec, items: Iterable[Any]) -> dict[str, Any]:
        """What the run would cost, with every check a submission makes; nothing is written."""
        with (
            _CheckedRows(spec, items, self.settings) as rows,
            self.runtime.database.session() as session,
        ):
            earlier = self._claims_source(session, spec)
            found = ingest.estimate_checked(
                session,
                spec,
                rows.checked(),
                self.settings,
                self.runtime.models,
                inherited=_claims_of(session, earlier) if earlier is not None else None,
            )
        return found.as_dict()

    def queue(self, run_id: str) -> None:
        """Hand the run to the workers. If the broker is down the run stays queued, and a
        worker's reaper dispatches it later. (Local mode: the runner dispatches the run when
        it starts scoring it.)"""
        if not self._dispatch:
            return
        try:
            self.runtime.queue.send_dispatch(run_id)
        except Exception:
            log.warning("could not queue run %s now; the reaper will", run_id, exc_info=True)

    # --- actions -----------------------------------------------------------------------------

    def cancel(self, run_id: str, project: str) -> Cancelled:
        """Stop a run: in the database first (no item starts another stage), then the call
        gate stops calls already past that check and waits for those already sent. With
        Redis unreachable the run is still cancelled and the answer says the calls in flight
        were not stopped. Cancelling an ended run changes nothing."""
        self._require(run_id)
        calls_stopped = True
        if self.runtime.runs.cancel(run_id, project):
            try:
                self.runtime.gate.close(run_id)
                still_open = self.runtime.gate.wait_idle(run_id, self.settings.cancel_wait)
                if still_open:
                    log.warning("run %s cancelled with %d call(s) in flight", run_id, still_open)
            except Exception:
                log.warning("run %s cancelled; its call gate not closed", run_id, exc_info=True)
                calls_stopped = False
        return Cancelled(self.reads.view(run_id, project), calls_stopped)

    def retry(self, run_id: str, project: str) -> int:
        """Re-queue the run's failed items; how many."""
        self._require(run_id)
        try:
            retried = self.runtime.runs.retry_failed(run_id, project)
        except RunCancelledError:
            raise RunConflict(
                "run_cancelled",
                "a cancelled run cannot be retried: resume it (POST /v1/runs/{id}/resume, "
                "`recallq resume RUN`) to queue its cancelled items again",
            ) from None
        if retried:
            self.queue(run_id)
        return retried

    def resume(
        self,
        run_id: str,
        project: str,
        budget_usd: Any = None,
        budget_tokens: Any = None,
    ) -> int:
        """Continue a cancelled run: its cancelled, unscored items are queued again; how many.
        A run cancelled for its budget needs a higher budget (`budget_usd`/`budget_tokens`)."""
        try:
            usd, tokens = ingest.check_budget(budget_usd, budget_tokens)
        except ValueError as exc:
            raise ingest.SubmissionError(str(exc)) from None
        with self.runtime.database.session() as session:
            run = self._run(session, run_id, project)
            status, budget = run.status, (run.budget_usd, run.budget_tokens)
        if status != RunStatus.CANCELLED:
            hint = "; `retry` re-queues failed items" if status == RunStatus.COMPLETED else ""
            raise RunConflict(
                "run_not_cancelled", f"run {run_id} is {status}: only a cancelled run resumes{hint}"
            )
        for name, given, kept in (
            ("budget_usd", usd, budget[0]),
            ("budget_tokens", tokens, budget[1]),
        ):
            if given is not None and kept is None:
                # workers that read "no budget" once do not count spend: a new kind of budget
                # could not hold
                raise RunConflict(
                    "no_budget",
                    f"{name} raises a run's budget on resume; run {run_id} has no {name}",
                )
        raised = usd is not None or tokens is not None
        if raised:
            budget = (
                usd if usd is not None else budget[0],
                tokens if tokens is not None else budget[1],
            )
        # The gate first: with Redis unreachable (RedisError) nothing has changed yet.
        self.runtime.gate.reopen(run_id, budget if raised else None)
        try:
            resumed, _ = self.runtime.runs.resume_cancelled(run_id, project, usd, tokens)
        except RunNotCancelledError as exc:
            raise RunConflict("run_not_cancelled", str(exc)) from None
        except RunBudgetSpentError as exc:
            raise RunConflict("budget_spent", str(exc)) from None
        self.queue(run_id)
        return resumed

    def resume_local(self, run_id: str, project: str) -> tuple[int, str]:
        """Local mode: a cancelled run's cancelled items, or else the run's handed-out,
        unended items (the process that held them stopped), go back to pending. How many,
        and which ("cancelled" or "unended")."""
        self._require(run_id)
        status = self.reads.view(run_id, project, details=False)["status"]
        if status in RUN_ACTIVE:
            return self.runtime.runs.resume(run_id, project), "unended"
        return self.resume(run_id, project), "cancelled"  # a completed run: the service's 409

    def delete(self, run_id: str, project: str) -> None:
        """Remove an ended run with its items and claims."""
        self._require(run_id)
        try:
            self.runtime.runs.delete(run_id, project)
        except RunActiveError as exc:
            raise RunConflict("run_active", str(exc)) from None
        try:
            self.runtime.gate.forget(run_id)
        except Exception:
            log.warning("could not drop the gate state of deleted run %s", run_id, exc_info=True)

    def _run(self, session: Session, run_id: str, project: str) -> Run:
        run = find_run(session, run_id, project)
        if run is None:
            raise RunNotFound(run_id)
        return run

    @staticmethod
    def _require(run_id: str) -> None:
        if not plausible_id(run_id):
            raise RunNotFound(run_id)


def _inherit_claims(session: Session, run: Run, earlier: Run) -> int:
    """Store with the new run's items the claims of the earlier run's items of the same id
    (recallq.pipeline.inherited_claims decides which); the engine and the batch lane then
    find them known and only attribute them. How many items took claims."""
    earlier_claims = _claims_of(session, earlier)
    taken, batch = 0, []
    new_items = session.execute(
        select(Item.id, Item.key, Item.ground_truth).where(Item.run_id == run.id)
    )
    for item_id, key, ground_truth in new_items:
        found = earlier_claims.get(key)
        claims = pipeline.inherited_claims(ground_truth, *found) if found else None
        if claims is None:
            continue
        taken += 1
        batch += [{"item_id": item_id, "idx": i, "text": t} for i, t in enumerate(claims)]
        if len(batch) >= CLAIM_BATCH:
            session.execute(insert(Claim), batch)
            batch = []
    if batch:
        session.execute(insert(Claim), batch)
    log.info("run %s took the claims of %d items of run %s", run.id, taken, earlier.id)
    return taken


def _claims_of(session: Session, run: Run) -> dict[str, ingest.EarlierClaims]:
    """The ground truth and claims of each of the run's items with claims, by item id."""
    found: dict[str, ingest.EarlierClaims] = {}
    rows = session.execute(
        select(Item.key, Item.ground_truth, Claim.text)
        .join(Claim, Claim.item_id == Item.id)
        .where(Item.run_id == run.id)
        .order_by(Item.id, Claim.idx)
    )
    for key, ground_truth, text in rows:
        found.setdefault(key, (ground_truth, []))[1].append(text)
    return found


class _CheckedRows:
    """A submission's item rows, checked one by one before any transaction (context
    extractors within the submission's time budget), kept in a spooled file (memory up to
    the spool setting, then disk) and read back for the insert."""

    def __init__(self, spec: ingest.RunSpec, items: Iterable[Any], settings: Settings) -> None:
        self._file: IO[str] = tempfile.SpooledTemporaryFile(  # noqa: SIM115  (closed in __exit__)
            max_size=settings.spool_memory_bytes, mode="w+", encoding="utf-8"
        )
        self.count = 0
        rows = ingest.ItemRows(
            items,
            spec,
            settings.max_items_per_run,
            max_item_bytes=settings.max_item_bytes,
            context_extractor_budget=settings.context_extractor_budget,
        )
        started = time.monotonic()
        try:
            for row in rows:
                self._file.write(json.dumps(row, ensure_ascii=False))
                self._file.write("\n")
            ingest.check_rows(rows)
        except BaseException:
            self._file.close()
            raise
        self.count = rows.count
        log.debug("checked %d items in %.2f s", self.count, time.monotonic() - started)

    def checked(self) -> Iterator[dict[str, Any]]:
        self._file.seek(0)
        for line in self._file:
            row: dict[str, Any] = json.loads(line)
            yield row

    def __enter__(self) -> _CheckedRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()
