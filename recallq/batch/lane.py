"""The provider batch lane: batch-mode runs (`"mode": "batch"`) scored through the providers'
Batch APIs, at the batch price, without a single online judge call.

One worker polls at a time (worker.housekeeping, every `batch_poll_interval` s; the poll holds
a Postgres advisory lock, see recallq.batch.store). A poll:

1. moves on batches left half-way by a crash or a failed call: uploads their input file,
   creates them, or first finds a batch whose create call lost its answer by the metadata it
   carries (our batch id); drops the batches of cancelled or deleted runs that the provider
   never saw;
2. retrieves the submitted batches (cancelling those of cancelled or deleted runs) and, once
   one has ended, reads its output and error files and applies every result by custom_id:
   claims, verdicts, scores and usage at the batch price, through the store's guarded item
   moves; a request to make next (attribution after extraction, a repair request after a
   malformed answer, a re-ask of claims left without a verdict, a failed line again, and for a
   run with precision `judged` the context_relevance request after attribution, then a re-ask
   of the passages its answer left without a verdict) becomes a new request line in the same
   transaction;
3. adopts the pending items of running batch-mode runs and plans their first request, or ends
   them as the online engine would without a call (no ground truth, claims from the claim
   cache, no claims, no context);
4. sends the requests ready, per run and stage (extraction, attribution, relevance), in input files
   within the provider's limits (`batch_max_requests`, `batch_max_bytes`);
5. completes the runs whose items all ended.

Every rule an answer is judged by is the online engine's (recallq.batch.requests.decide), so a
batch-mode run scores as an online one. Transient failures (a failed line, an expired batch,
a provider that will not take a batch) wait and go again at a later poll until the run's retry
deadline has passed since the item started waiting; permanent ones fail the item at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from recallq import pipeline
from recallq.batch.provider import BatchAPI, BatchInfo
from recallq.batch.requests import (
    FAILED_REQUEST,
    UNANSWERED,
    Answer,
    InputFile,
    LineFailure,
    LineResult,
    answer_usage,
    carry_relevance,
    carry_verdicts,
    custom_id,
    decide,
    kept_verdicts,
    parse_results,
    repair_carry,
    request_line,
)
from recallq.batch.store import (
    BatchRow,
    BatchState,
    LaneRun,
    LaneStore,
    LineRow,
    LineState,
    NewLine,
)
from recallq.core.errors import PermanentJudgeError, TransientJudgeError
from recallq.core.outcomes import Stage
from recallq.core.redact import Redactor
from recallq.core.usage import NO_USAGE, Usage
from recallq.judge.base import Repair
from recallq.judge.models import JudgeModelsError, ModelConfig
from recallq.judge.prices import Price, batch_price
from recallq.observability import metrics
from recallq.pipeline import (
    AskAgain,
    AskAgainPassages,
    Claims,
    Failed,
    Relevant,
    ResendLater,
    Scored,
    Verdicts,
    Wait,
)
from recallq.settings import Settings
from recallq.state.batched_items import BatchedItemStore
from recallq.state.claim_cache import ClaimCache
from recallq.state.runs import RunStore
from recallq.state.tables import as_utc, utcnow

log = logging.getLogger(__name__)

#: The metadata key a provider batch carries our batch id under (recovery looks for it).
METADATA_KEY = "recallq_batch_id"
#: How far back, before a batch's create call, the recovery looks at the provider's batches.
CLOCK_SLACK_S = 600.0
#: Items and lines per transaction.
CHUNK = 500


@dataclass
class PollReport:
    """What one poll did (for logs and tests)."""

    polled: bool = False
    adopted: int = 0
    batches_created: int = 0
    batches_applied: int = 0
    results_applied: int = 0


class BatchLane:
    def __init__(
        self,
        store: LaneStore,
        items: BatchedItemStore,
        runs: RunStore,
        models: Mapping[str, ModelConfig],
        settings: Settings,
        api_for: Callable[[ModelConfig], BatchAPI] | None = None,
        completed: Callable[[str], None] = lambda run_id: None,
        redact: Redactor | None = None,
    ) -> None:
        """`api_for` builds a model's provider Batch API (default: through litellm);
        `completed` is told of each run the lane completes; `redact` takes secrets out of
        answers before they are stored (see recallq.core.redact)."""
        self.store = store
        self.items = items
        self.runs = runs
        self.models = models
        self.settings = settings
        self.completed = completed
        self.interval = settings.batch_poll_interval
        self._api_for = api_for or _litellm_api(settings.request_timeout)
        self._redact = redact
        self._apis: dict[str, BatchAPI] = {}
        self._prices: dict[str, Price] = {}

    # --- the poll ---------------------------------------------------------------------------

    def poll(self) -> PollReport:
        """One pass over every batch and every batch-mode run (see the module docstring);
        nothing when another worker is polling."""
        report = PollReport()
        with self.store.exclusive() as mine:
            if not mine:
                return report
            report.polled = True
            for batch in self.store.batches(
                [BatchState.BUILDING, BatchState.UPLOADED, BatchState.CREATING]
            ):
                self._move_on(batch, None)
            for batch in self.store.batches([BatchState.SUBMITTED]):
                applied = self.check(batch)
                if applied is not None:
                    metrics.batch_applied(batch.model)
                    report.batches_applied += 1
                    report.results_applied += applied
            for run in self.store.running_runs():
                report.adopted += self.plan(run)
                report.batches_created += self.send(run)
                if self.runs.complete_if_done(run.id):
                    self.completed(run.id)
        return report

    # --- planning: an item's first request ----------------------------------------------------

    def plan(self, run: LaneRun) -> int:
        """Adopt the run's pending items and plan what each needs next. Returns how many
        were adopted."""
        adopted = 0
        while True:
            with self.store.transaction() as conn:
                taken = self.items.adopt(conn, run.id, CHUNK)
            adopted += len(taken)
            if len(taken) < CHUNK:
                break
        while unplanned := self.store.unplanned(run.id, CHUNK):
            keys = {
                u.item_id: ClaimCache.key(u.ground_truth, run.model, project=run.project)
                for u in unplanned
                if u.ground_truth is not None and u.claims is None
            }
            cached = self.store.cached_claims(list(keys.values()))
            new: list[NewLine] = []
            with self.store.transaction() as conn:
                for u in unplanned:
                    ended = pipeline.start(u.ground_truth)
                    if ended is not None:
                        self.items.succeed(
                            conn, u.item_id, ended.outcome, NO_USAGE, Stage.EXTRACTION
                        )
                    elif u.claims is not None:
                        new += self._after_claims(conn, run, u.item_id, u.claims, u.contexts)
                    elif (hit := cached.get(keys[u.item_id])) is not None:
                        assert u.ground_truth is not None  # else start() ended it
                        new += self._claims_known(
                            conn, run, u.item_id, u.ground_truth, u.contexts, hit, NO_USAGE, True
                        )
                    else:
                        new.append(NewLine(run.id, u.item_id, Stage.EXTRACTION))
                self.store.add_lines(conn, new)
        return adopted

    def _claims_known(
        self,
        conn: Connection,
        run: LaneRun,
        item_id: int,
        ground_truth: str,
        contexts: Sequence[str],
        claims: Sequence[str],
        usage: Usage,
        cache_hit: bool,
    ) -> list[NewLine]:
        """Extraction is over (answered, or from the claim cache): no claims ends the item
        with score 0, else its claims are stored and attribution comes next."""
        found = pipeline.claims_found(claims)
        if isinstance(found, Scored):
            self.items.succeed(
                conn, item_id, found.outcome, usage, Stage.EXTRACTION, cache_hits=int(cache_hit)
            )
            return []
        key = ClaimCache.key(ground_truth, run.model, project=run.project)
        if not self.items.save_claims(conn, item_id, found.claims, usage, cache_hit, key):
            return []
        return self._after_claims(conn, run, item_id, tuple(found.claims), contexts)

    def _after_claims(
        self,
        conn: Connection,
        run: LaneRun,
        item_id: int,
        claims: Sequence[str],
        contexts: Sequence[str],
    ) -> list[NewLine]:
        """With no context every claim is `no` and no call is made; else attribution."""
        ended = pipeline.before_attribution(claims, contexts)
        if ended is not None:
            self.items.succeed(
                conn, item_id, ended.outcome, NO_USAGE, Stage.ATTRIBUTION, claims, ended.verdicts
            )
            return []
        return [NewLine(run.id, item_id, Stage.ATTRIBUTION)]

    # --- sending ------------------------------------------------------------------------------

    def send(self, run: LaneRun) -> int:
        """Batches of the run's ready requests, by stage (extraction, attribution, relevance).
        Returns how many."""
        try:
            api = self.api(run.model)
        except PermanentJudgeError as exc:  # the model cannot batch here: its items fail
            self._fail_ready(run, str(exc))
            return 0
        created = 0
        limits = self.settings.batch_max_requests, self.settings.batch_max_bytes
        for stage in Stage:
            while ready := self.store.ready(run.id, stage, limits[0]):
                file = InputFile(*limits)
                oversized: list[LineRow] = []
                for row in ready:
                    line = request_line(row.request, api.body_model, api.body_params)
                    if len(line) > limits[1]:
                        oversized.append(row)
                    elif not file.add(row.request.line_id, line):
                        break
                if oversized:
                    error = f"the request is larger than a batch file may be ({limits[1]} bytes)"
                    self._fail_lines(oversized, error)
                if file.line_ids:
                    batch_id = self.store.open_batch(run.id, run.model, stage, file.line_ids)
                    log.info(
                        "run %s: batch %s of %d %s request(s), %d bytes",
                        run.id,
                        batch_id,
                        len(file.line_ids),
                        stage,
                        file.size,
                    )
                    created += 1
                    batch = self.store.batch(batch_id)
                    if batch is not None:
                        self._move_on(batch, file.content())
                if len(file.line_ids) + len(oversized) == len(ready) < limits[0]:
                    break
        return created

    def _move_on(self, batch: BatchRow, content: bytes | None) -> None:
        """Take a batch that the provider may not have yet as far as it goes: dropped (its
        run is gone), or submitted. A transient provider error leaves it for the next poll;
        one lasting past its run's retry deadline, or a permanent one, fails its items."""
        try:
            if batch.run_gone and batch.state != BatchState.CREATING:
                with self.store.transaction() as conn:
                    self.store.drop(conn, batch.id, "its run was cancelled or deleted")
                return
            self._advance(batch, content)
        except TransientJudgeError as exc:
            log.warning("batch %s: %s; trying again at the next poll", batch.id, exc)
            self.store.waiting(batch.id, str(exc))
            decision = pipeline.wait_or_give_up(
                str(exc),
                _seconds(batch.waiting_since),
                utcnow().timestamp(),
                self._deadline(batch.retry_deadline_s),
            )
            if isinstance(decision, Failed):
                self._drop_failing(batch, decision.error)
        except PermanentJudgeError as exc:
            log.warning("batch %s: %s; its items fail", batch.id, exc)
            self._drop_failing(batch, str(exc))

    def _advance(self, batch: BatchRow, content: bytes | None) -> None:
        api = self.api(batch.model)
        state, file_id = batch.state, batch.input_file_id
        if state == BatchState.BUILDING:
            if content is None:  # a poll crashed before the upload: the same file again
                content = self._render(batch.id, api)
            file_id = api.upload(f"recallq-{batch.id}.jsonl", content)
            if not self.store.uploaded(batch.id, file_id, len(content)):
                return
            state = BatchState.UPLOADED
        if state == BatchState.UPLOADED:
            if not self.store.creating(batch.id):
                return
            assert file_id is not None
            info = api.create(file_id, self._metadata(batch))
        else:  # creating: the call may have gone out, its answer lost
            assert batch.creating_at is not None and batch.input_file_id is not None
            age = (utcnow() - batch.creating_at).total_seconds()
            if age < self.settings.request_timeout + 30:
                return  # a create call of a poller cut off mid-way could still be running
            since = batch.creating_at.timestamp() - CLOCK_SLACK_S
            found = api.find(METADATA_KEY, batch.id, since)
            if found is None and batch.run_gone:
                with self.store.transaction() as conn:
                    self.store.drop(conn, batch.id, "its run was cancelled or deleted")
                return
            if found is None:
                log.warning("batch %s: its create call never reached the provider", batch.id)
                if not self.store.creating_again(batch.id):
                    return
                found = api.create(batch.input_file_id, self._metadata(batch))
            else:
                log.warning("batch %s: found at the provider as %s", batch.id, found.id)
            info = found
        self.store.submitted(batch.id, info.id, info.status)

    def _metadata(self, batch: BatchRow) -> dict[str, str]:
        return {METADATA_KEY: batch.id, "recallq_run_id": batch.run_id or ""}

    def _render(self, batch_id: str, api: BatchAPI) -> bytes:
        rows = self.store.sent(batch_id)
        return b"".join(request_line(r.request, api.body_model, api.body_params) for r in rows)

    # --- results ------------------------------------------------------------------------------

    def check(self, batch: BatchRow) -> int | None:
        """Retrieve a submitted batch (cancelling it when its run is gone); once it has ended,
        apply its results. Returns how many results were applied (None: not ended yet)."""
        assert batch.provider_batch_id is not None
        try:
            api = self.api(batch.model)
            info = api.retrieve(batch.provider_batch_id)
            if batch.run_gone and not info.final and info.status != "cancelling":
                log.info("batch %s: its run is gone; cancelling it", batch.id)
                info = api.cancel(batch.provider_batch_id)
            self.store.observed(
                batch.id,
                info.status,
                info.completed,
                info.failed,
                info.output_file_id,
                info.error_file_id,
            )
            if not info.final:
                return None
            results: dict[str, LineResult] = {}
            for file_id in (info.output_file_id, info.error_file_id):
                if file_id:
                    for key, result in parse_results(api.content(file_id)).items():
                        results.setdefault(key, result)
        except TransientJudgeError as exc:
            log.warning("batch %s: %s; trying again at the next poll", batch.id, exc)
            return None
        except PermanentJudgeError as exc:  # the provider refuses to tell: its items fail
            log.warning("batch %s: %s; its items fail", batch.id, exc)
            results, unanswered = {}, LineFailure(str(exc), transient=False)
        else:
            unanswered = _missing_result(info)
        applied = self._apply(batch, results, unanswered)
        self.store.done(batch.id)
        log.info("batch %s: %d result(s) applied", batch.id, applied)
        return applied

    def _apply(
        self, batch: BatchRow, results: dict[str, LineResult], unanswered: LineFailure
    ) -> int:
        price = self.price(batch.model)
        run = LaneRun(
            batch.run_id or "",
            batch.project or "",
            batch.model,
            batch.scale or 1.0,
            batch.retry_deadline_s,
            batch.precision or "cited",
        )
        applied, after = 0, 0
        while rows := self.store.sent(batch.id, after=after, limit=CHUNK):
            new: list[NewLine] = []
            with self.store.transaction() as conn:
                for row in rows:
                    result = results.get(custom_id(row.request.line_id))
                    if result is None and batch.run_gone:  # nobody waits for this answer
                        self.store.close_line(
                            conn, row.request.line_id, batch.id, LineState.DROPPED, NO_USAGE
                        )
                        continue
                    new += self._apply_line(conn, batch, run, row, result or unanswered, price)
                    applied += 1
                self.store.add_lines(conn, new)
            after = rows[-1].request.line_id
        return applied

    def _apply_line(
        self,
        conn: Connection,
        batch: BatchRow,
        run: LaneRun,
        row: LineRow,
        result: LineResult,
        price: Price,
    ) -> list[NewLine]:
        """One result: its line closed and its item moved on, in the caller's transaction.
        Returns the requests to make next."""
        request, item_id = row.request, row.item_id
        if isinstance(result, Answer):
            usage, state, error = answer_usage(result, price), LineState.ANSWERED, None
        else:
            usage, state, error = FAILED_REQUEST, LineState.FAILED, result.error
        if not self.store.close_line(conn, request.line_id, batch.id, state, usage, error):
            return []  # applied by an earlier poll that crashed before it finished
        decision = decide(request, result, self.settings.answer_limits(), self._redact)
        asked = None if request.asked is None else list(request.asked)
        if isinstance(decision, Claims):
            assert row.ground_truth is not None
            return self._claims_known(
                conn,
                run,
                item_id,
                row.ground_truth,
                request.contexts,
                decision.claims,
                usage,
                False,
            )
        if isinstance(decision, Verdicts):
            done = pipeline.scored(
                request.claims, decision.verdicts, run.scale, len(request.contexts), run.precision
            )
            if pipeline.needs_relevance(run.precision, len(request.contexts)):
                # precision "judged": the relevance request next, carrying the verdicts
                if not self.items.charge(conn, item_id, usage, Stage.ATTRIBUTION):
                    return []
                carry: dict[str, Any] = {"verdicts": carry_verdicts(decision.verdicts)}
                return [NewLine(run.id, item_id, Stage.RELEVANCE, None, False, carry)]
            self.items.succeed(
                conn,
                item_id,
                done.outcome,
                usage,
                Stage.ATTRIBUTION,
                list(request.claims),
                done.verdicts,
                precision=done.precision,
            )
            return []
        if isinstance(decision, Relevant):
            n_contexts = len(request.contexts)
            verdicts = kept_verdicts(request.carry)
            done = pipeline.scored(request.claims, verdicts, run.scale, n_contexts, run.precision)
            judged = pipeline.judged_precision(done, decision.relevance, n_contexts, run.scale)
            self.items.succeed(
                conn,
                item_id,
                judged.outcome,
                usage,
                Stage.RELEVANCE,
                list(request.claims),
                judged.verdicts,
                precision=judged.precision,
            )
            return []
        if isinstance(decision, AskAgainPassages):
            if not self.items.charge(conn, item_id, usage, Stage.RELEVANCE):
                return []
            carry = {
                "verdicts": (request.carry or {}).get("verdicts"),
                "relevance": carry_relevance(decision.relevance),
            }
            return [NewLine(run.id, item_id, Stage.RELEVANCE, decision.missing, True, carry)]
        if isinstance(decision, AskAgain):
            if not self.items.charge(conn, item_id, usage, Stage.ATTRIBUTION):
                return []
            carry = {"verdicts": carry_verdicts(decision.verdicts)}
            return [NewLine(run.id, item_id, Stage.ATTRIBUTION, decision.missing, True, carry)]
        if isinstance(decision, Repair):
            if not self.items.charge(conn, item_id, usage, request.stage):
                return []
            carry = repair_carry(request, decision)
            return [NewLine(run.id, item_id, request.stage, asked, request.reask, carry)]
        if isinstance(decision, Failed):
            self.items.fail(conn, item_id, decision.error, usage, request.stage)
            return []
        assert isinstance(decision, ResendLater)
        waited = pipeline.wait_or_give_up(
            decision.error,
            _seconds(row.waiting_since),
            utcnow().timestamp(),
            self._deadline(run.retry_deadline_s),
        )
        if isinstance(waited, Failed):
            self.items.fail(conn, item_id, waited.error, usage, request.stage)
            return []
        assert isinstance(waited, Wait) and waited.since_s is not None
        since = datetime.fromtimestamp(waited.since_s, UTC)
        if not self.items.wait(conn, item_id, usage, request.stage, since):
            return []
        return [NewLine(run.id, item_id, request.stage, asked, request.reask, request.carry)]

    # --- failing what cannot be sent ------------------------------------------------------------

    def _drop_failing(self, batch: BatchRow, error: str) -> None:
        """A batch the provider will not take: dropped, and its items fail with the error."""
        rows = self.store.sent(batch.id)
        with self.store.transaction() as conn:
            if self.store.drop(conn, batch.id, error):
                for row in rows:
                    self.items.fail(conn, row.item_id, error, NO_USAGE, row.request.stage)

    def _fail_ready(self, run: LaneRun, error: str) -> None:
        for stage in Stage:
            while rows := self.store.ready(run.id, stage, CHUNK):
                self._fail_lines(rows, error)

    def _fail_lines(self, rows: Sequence[LineRow], error: str) -> None:
        """Ready requests that cannot be sent: dropped, and their items fail."""
        with self.store.transaction() as conn:
            for row in rows:
                if self.store.drop_ready(conn, row.request.line_id, error):
                    self.items.fail(conn, row.item_id, error, NO_USAGE, row.request.stage)

    # --- models -------------------------------------------------------------------------------

    def api(self, model: str) -> BatchAPI:
        """The model's provider Batch API; PermanentJudgeError if this worker cannot batch it."""
        if model not in self._apis:
            config = self.models.get(model)
            if config is None or not config.batch:
                raise PermanentJudgeError(
                    f"model {model!r} is not marked `batch: true` in this worker's models file"
                )
            try:
                self._apis[model] = self._api_for(config)
            except JudgeModelsError as exc:  # a key missing from this worker's environment
                raise PermanentJudgeError(str(exc)) from exc
        return self._apis[model]

    def price(self, model: str) -> Price:
        """What one of the model's batch requests costs per token."""
        if model not in self._prices:
            config = self.models.get(model)
            if config is None:
                return Price()
            self._prices[model] = batch_price(config)
        return self._prices[model]

    def _deadline(self, retry_deadline_s: float | None) -> float:
        return pipeline.retry_deadline_s(retry_deadline_s, self.settings.retry_deadline)


def _seconds(moment: datetime | None) -> float | None:
    """A stored moment in the pipeline's unit of time: unix seconds."""
    return None if moment is None else as_utc(moment).timestamp()


def _missing_result(info: BatchInfo) -> LineFailure:
    """What a request of this ended batch that has no result line gets: another try."""
    if info.status == "completed":
        return UNANSWERED
    reason = f": {info.errors}" if info.errors else ""
    return LineFailure(f"the provider's batch ended {info.status}{reason}", transient=True)


def _litellm_api(timeout: float) -> Callable[[ModelConfig], BatchAPI]:
    def build(config: ModelConfig) -> BatchAPI:
        from recallq.batch.litellm_files import LitellmBatchAPI

        return LitellmBatchAPI(config, timeout)

    return build
