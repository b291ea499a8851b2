"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)        release a window of pending items to the queue
    take(item)           own the item under a fresh owner token, or learn there is nothing to do
    extract(pass)        claims: judge call 1, or the claim cache
    attribute(pass)      verdicts, score and reason: judge call 2
    settle(outcome)      when an item ended, send the items released in its place, or complete
                         the run with its last item

Each stage calls the judge and the store, and returns what happened (recallq.outcomes):
Continue (the next stage goes on), Ended, Skipped(reason) or Deferred(until). State lives in
the database and only the store writes it. The same engine runs under Celery workers (one
task per stage) and in local mode (a thread pool); `WorkQueue` is how it sends work on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from recallq import scoring
from recallq.coordination.gate import RunCancelled
from recallq.judge.base import NO_USAGE, Judge, JudgeError, TryLater, Usage
from recallq.judge.registry import JudgeRegistry
from recallq.outcomes import Continue, Deferred, Ended, Skipped, StageOutcome, Taken
from recallq.store import ItemStore, RunStore

log = logging.getLogger(__name__)


class WorkQueue(Protocol):
    """Where the engine sends work: the broker (Celery) or an in-process runner."""

    def send_items(self, item_ids: Sequence[int]) -> None:
        """Score these queued items: take, extract, attribute, settle."""
        ...

    def send_dispatch(self, run_id: str) -> None:
        """Start a run, or top up its window of queued items."""
        ...


class Owners(Protocol):
    """Who owns an item while a stage runs: this process's owner tokens, and whether the
    worker named in another token is alive."""

    def new_token(self) -> str: ...

    def holder_alive(self, owner: str) -> bool: ...


def cache_key(ground_truth: str, model: str, prompt_version: str, *, project: str) -> str:
    """The claim cache's key. It includes the project: a hit must never tell one project
    that another scored the same ground truth (or hand it the claims extracted there)."""
    payload = json.dumps([project, ground_truth, model, prompt_version], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


class Engine:
    def __init__(
        self,
        items: ItemStore,
        runs: RunStore,
        judges: JudgeRegistry,
        queue: WorkQueue,
        owners: Owners,
        dispatch_window: int,
        retry_deadline: float,
    ) -> None:
        """`retry_deadline`: how long an item of a run that sets none may wait out a provider
        incident before it fails."""
        self.items = items
        self.runs = runs
        self.judges = judges
        self.queue = queue
        self.owners = owners
        self.dispatch_window = dispatch_window
        self.retry_deadline = retry_deadline

    def dispatch(self, run_id: str) -> int:
        """Start a run, or top up its window of queued items. Safe to call again at any time."""
        released = self.runs.release_window(run_id, self.dispatch_window)
        if released:
            self.queue.send_items(released)
        elif released is not None:
            self.runs.complete_if_done(run_id)
        return len(released or ())

    def take(self, item_id: int) -> StageOutcome:
        """Own the item for this pass. An item with no ground truth ends here (no call)."""
        taken = self.items.take(item_id, self.owners.new_token(), self.owners.holder_alive)
        if isinstance(taken, Skipped):
            return taken
        if taken.ground_truth is None:
            return self.items.succeed(taken, scoring.no_ground_truth(), NO_USAGE)
        return Continue(taken)

    def extract(self, taken: Taken) -> StageOutcome:
        """The item's claims: known already (a retried item), from the claim cache, or from the
        judge. No claims ends the item with score 0."""
        if taken.claims is not None:
            return Continue(taken)
        assert taken.ground_truth is not None  # take ended items without one
        judge = self._judge(taken)
        if isinstance(judge, Ended | Skipped | Deferred):
            return judge
        key = cache_key(
            taken.ground_truth, taken.model, judge.prompt_version, project=taken.project
        )
        claims = self.items.cached_claims(key)
        usage, hit = NO_USAGE, claims is not None
        if claims is None:
            try:
                reply = judge.extract_claims(taken.ground_truth, taken.run_id)
            except JudgeError as exc:
                return self._settle_error(taken, exc)
            claims, usage = reply.data["claims"], reply.usage
        if not claims:
            return self.items.succeed(taken, scoring.no_claims(), usage, cache_hits=int(hit))
        stored = self.items.save_claims(taken, claims, usage, hit, key)
        return stored if isinstance(stored, Skipped) else Continue(stored)

    def attribute(self, taken: Taken) -> StageOutcome:
        """Verdicts, score and reason. The stage first takes the item over under this
        process's owner token (often not the one that extracted), so the reaper follows this
        worker's heartbeat, and a duplicate of this message finds the item no longer its own."""
        handed = self.items.hand_over(taken, self.owners.new_token())
        if isinstance(handed, Skipped):
            return handed
        taken, contexts = handed
        claims = list(taken.claims or ())
        if not contexts:
            return self.items.succeed(
                taken,
                scoring.no_context(claims),
                NO_USAGE,
                scoring.no_context_verdicts(len(claims)),
            )
        judge = self._judge(taken)
        if isinstance(judge, Ended | Skipped | Deferred):
            return judge
        usage = NO_USAGE
        try:
            verdicts, missing, usage = self._verdicts(judge, taken, claims, contexts, None)
            if missing:  # asked again once, for the claims left without a verdict
                again, missing, more = self._verdicts(judge, taken, claims, contexts, missing)
                verdicts, usage = verdicts | again, usage + more
        except JudgeError as exc:
            return self._settle_error(taken, exc.after(usage))
        if missing:
            names = ", ".join(str(i) for i in missing)
            error = f"the judge gave no verdict for claim(s) {names}, asked twice"
            return self._fail(taken, error, usage)
        outcome = scoring.score_claims(claims, verdicts, taken.scale)
        return self.items.succeed(taken, outcome, usage, verdicts)

    def settle(self, outcome: StageOutcome) -> None:
        """After an item ended (its write committed): send the items released in its place,
        or, when none was, complete the run if this was its last item."""
        if not isinstance(outcome, Ended):
            return
        if outcome.released:
            self.queue.send_items(outcome.released)
        else:
            self.runs.complete_if_done(outcome.run_id)

    def run_item(self, item_id: int) -> StageOutcome:
        """Every stage of one item in this thread (local mode)."""
        outcome = self.take(item_id)
        if isinstance(outcome, Continue):
            outcome = self.extract(outcome.taken)
        if isinstance(outcome, Continue):
            outcome = self.attribute(outcome.taken)
        self.settle(outcome)
        return outcome

    # --- internals --------------------------------------------------------------------------

    def _verdicts(
        self,
        judge: Judge,
        taken: Taken,
        claims: list[str],
        contexts: list[str],
        indices: list[int] | None,
    ) -> tuple[dict[int, scoring.Verdict], list[int], Usage]:
        """Verdicts for the claims at `indices` (all when None), keyed by the claims' own
        indices; the indices left without one; what the call used."""
        asked = list(range(len(claims))) if indices is None else indices
        reply = judge.attribute([claims[i] for i in asked], contexts, taken.run_id)
        matched, missing = scoring.match_verdicts(
            reply.data.get("verdicts"), len(asked), len(contexts)
        )
        verdicts = {
            asked[j]: scoring.Verdict(asked[j], v.verdict, v.context_indices, v.reason)
            for j, v in matched.items()
        }
        return verdicts, [asked[j] for j in missing], reply.usage

    def _judge(self, taken: Taken) -> Judge | Ended | Skipped | Deferred:
        try:
            return self.judges.get(taken.model)
        except JudgeError as exc:
            return self._settle_error(taken, exc)

    def _settle_error(self, taken: Taken, exc: JudgeError) -> Ended | Skipped | Deferred:
        """A call that cannot succeed now (no rate-limit room, a provider incident) puts the
        item back in the queue until it can, keeping its claims and usage; a provider
        incident fails it only once its run's retry deadline has passed. A run whose budget
        is spent is cancelled (reason "budget"), this item with it. Any other error fails it
        at once, with the provider's message."""
        if isinstance(exc, RunCancelled) and exc.reason == "budget":
            if self.runs.cancel_for_budget(taken.run_id):
                log.info("run %s reached its budget: cancelled", taken.run_id)
            # the item is cancelled now: fail() finds it so and only charges what was spent
            return self._fail(taken, str(exc), exc.usage)
        if not isinstance(exc, TryLater):
            return self._fail(taken, str(exc), exc.usage)
        if not exc.counts_towards_deadline:
            waiting = taken.waiting_since
            return self.items.defer(taken, exc.delay, exc.usage, _datetime(waiting))
        now = time.time()
        since = taken.waiting_since or now
        deadline = self.retry_deadline if taken.retry_deadline_s is None else taken.retry_deadline_s
        if now - since >= deadline:
            error = f"gave up after the run's retry deadline ({deadline:g} s) passed: {exc}"
            return self._fail(taken, error, exc.usage)
        return self.items.defer(taken, exc.delay, exc.usage, _datetime(since))

    def _fail(self, taken: Taken, error: str, usage: Usage) -> Ended | Skipped:
        log.info("item %s of run %s failed: %s", taken.item_id, taken.run_id, error)
        return self.items.fail(taken, error, usage)


def _datetime(unix_seconds: float | None) -> datetime | None:
    return None if unix_seconds is None else datetime.fromtimestamp(unix_seconds, UTC)
