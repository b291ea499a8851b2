"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)        release a window of pending items to the queue
    extract_group(items) take each item (own it under a fresh owner token, or learn there is
                         nothing to do), then find their claims: from the claim cache, or one
                         judge call per pack of up to N ground truths
    attribute(pass)      verdicts, score and reason: one judge call per item
    settle(outcome)      when an item ended, send the items released in its place, or complete
                         the run with its last item

Each stage calls the judge and the store, and returns what happened (recallq.outcomes):
Continue (the next stage goes on), Ended, Skipped(reason) or Deferred(until). State lives in
the database and only the store writes it. The same engine runs under Celery workers (one
task per stage) and in local mode (a thread pool); `WorkQueue` is how it sends work on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from recallq import scoring
from recallq.claim_cache import ClaimCache
from recallq.coordination.gate import RunCancelled
from recallq.judge.base import (
    NO_USAGE,
    Judge,
    JudgeError,
    PermanentJudgeError,
    TryLater,
    Usage,
)
from recallq.judge.registry import JudgeRegistry
from recallq.outcomes import Continue, Deferred, Ended, Skipped, Stage, StageOutcome, Taken
from recallq.store import ItemStore, RunStore

log = logging.getLogger(__name__)


class WorkQueue(Protocol):
    """Where the engine sends work: the broker (Celery) or an in-process runner."""

    def send_items(self, item_ids: Sequence[int]) -> None:
        """Score these queued items: extraction in groups (`extract_group`), then each item's
        attribution (`send_attribution`) and settle."""
        ...

    def send_attribution(self, taken: Taken) -> None:
        """Attribute (and settle) one item whose claims are known."""
        ...

    def send_dispatch(self, run_id: str) -> None:
        """Start a run, or top up its window of queued items."""
        ...


class Owners(Protocol):
    """Who owns an item while a stage runs: this process's owner tokens, and whether the
    worker named in another token is alive."""

    def new_token(self) -> str: ...

    def holder_alive(self, owner: str) -> bool: ...


class Engine:
    def __init__(
        self,
        items: ItemStore,
        runs: RunStore,
        judges: JudgeRegistry,
        queue: WorkQueue,
        owners: Owners,
        retry_deadline: float,
        pack_tokens: int,
        completed: Callable[[str], None] = lambda run_id: None,
    ) -> None:
        """`retry_deadline`: how long an item of a run that sets none may wait out a provider
        incident before it fails. `pack_tokens`: about how many tokens of ground truths one
        packed extraction call carries at most. `completed` is told of each run this engine
        completes."""
        self.items = items
        self.runs = runs
        self.judges = judges
        self.queue = queue
        self.owners = owners
        self.retry_deadline = retry_deadline
        self.pack_tokens = pack_tokens
        self.completed = completed

    def dispatch(self, run_id: str) -> int:
        """Start a run, or top up its window of queued items. Safe to call again at any time."""
        released = self.runs.release_window(run_id)
        if released:
            self.queue.send_items(released)
        elif released is not None:
            self._complete_if_done(run_id)
        return len(released or ())

    def take(self, item_id: int) -> StageOutcome:
        """Own the item for this pass. An item with no ground truth ends here (no call)."""
        taken = self.items.take(item_id, self.owners.new_token(), self.owners.holder_alive)
        if isinstance(taken, Skipped):
            return taken
        if taken.ground_truth is None:
            return self.items.succeed(taken, scoring.no_ground_truth(), NO_USAGE, Stage.EXTRACTION)
        return Continue(taken)

    def extract(self, taken: Taken) -> StageOutcome:
        """The item's claims: known already (a retried item), from the claim cache, or from the
        judge. No claims ends the item with score 0."""
        return self._extract_together([taken])[0][1]

    def extract_group(self, item_ids: Sequence[int]) -> list[StageOutcome]:
        """Take several items and find their claims, as `extract` does for one, with one judge
        call for up to the model's pack size of ground truths (claims depend only on the ground
        truth, so packing changes nothing they mean). What each item became, in order."""
        outcomes: dict[int, StageOutcome] = {}
        by_run: dict[str, list[Taken]] = defaultdict(list)
        for item_id in item_ids:
            outcome = self.take(item_id)
            if isinstance(outcome, Continue) and outcome.taken.claims is None:
                by_run[outcome.taken.run_id].append(outcome.taken)
            else:
                outcomes[item_id] = outcome
        for passes in by_run.values():  # a run's items share its model and its call gate
            for taken, outcome in self._extract_together(passes):
                outcomes[taken.item_id] = outcome
        return [outcomes[item_id] for item_id in item_ids]

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
                Stage.ATTRIBUTION,
                scoring.no_context_verdicts(len(claims)),
            )
        try:
            judge = self.judges.get(taken.model)
        except JudgeError as exc:
            return self._settle_error(taken, exc, exc.usage, Stage.ATTRIBUTION)
        usage = NO_USAGE
        try:
            verdicts, missing, usage = self._verdicts(judge, taken, claims, contexts, None)
            if missing:  # asked again once, for the claims left without a verdict
                again, missing, more = self._verdicts(judge, taken, claims, contexts, missing)
                verdicts, usage = verdicts | again, usage + more
        except JudgeError as exc:
            return self._settle_error(taken, exc, usage + exc.usage, Stage.ATTRIBUTION)
        if missing:
            names = ", ".join(str(i) for i in missing)
            error = f"the judge gave no verdict for claim(s) {names}, asked twice"
            return self._fail(taken, error, usage, Stage.ATTRIBUTION)
        outcome = scoring.score_claims(claims, verdicts, taken.scale)
        return self.items.succeed(taken, outcome, usage, Stage.ATTRIBUTION, verdicts)

    def settle(self, outcome: StageOutcome) -> None:
        """After an item ended (its write committed): send the items released in its place,
        or, when none was, complete the run if this was its last item."""
        if not isinstance(outcome, Ended):
            return
        if outcome.released:
            self.queue.send_items(outcome.released)
        else:
            self._complete_if_done(outcome.run_id)

    def _complete_if_done(self, run_id: str) -> None:
        if self.runs.complete_if_done(run_id):
            self.completed(run_id)

    # --- internals --------------------------------------------------------------------------

    def _extract_together(self, passes: list[Taken]) -> list[tuple[Taken, StageOutcome]]:
        """Claims for passes of one run: known, cached, or extracted in packs."""
        done: list[tuple[Taken, StageOutcome]] = [
            (t, Continue(t)) for t in passes if t.claims is not None
        ]
        needed = [t for t in passes if t.claims is None]
        if not needed:
            return done
        try:
            judge = self.judges.get(needed[0].model)
        except JudgeError as exc:
            return done + [
                (t, self._settle_error(t, exc, exc.usage, Stage.EXTRACTION)) for t in needed
            ]
        uncached: list[tuple[Taken, str]] = []
        for taken in needed:
            assert taken.ground_truth is not None  # take ended items without one
            key = ClaimCache.key(taken.ground_truth, taken.model, project=taken.project)
            cached = self.items.cached_claims(key)
            if cached is None:
                uncached.append((taken, key))
            else:
                done.append((taken, self._claims_found(taken, cached, NO_USAGE, key, hit=True)))
        for pack in extraction_packs(uncached, self.judges.pack_size(judge.name), self.pack_tokens):
            if len(pack) == 1:
                taken, key = pack[0]
                done.append((taken, self._extract_alone(judge, taken, key, NO_USAGE)))
            else:
                done += self._extract_pack(judge, pack)
        return done

    def _extract_pack(
        self, judge: Judge, pack: list[tuple[Taken, str]]
    ) -> list[tuple[Taken, StageOutcome]]:
        """One call for the pack. An item the answer leaves out (all of them, when it is
        malformed or the call was refused as a bad request) is extracted on its own: one bad
        item never fails the others. The call's usage is shared among the pack's items."""
        texts = [taken.ground_truth or "" for taken, _ in pack]
        try:
            reply = judge.extract_claims_packed(texts, pack[0][0].run_id)
        except PermanentJudgeError as exc:
            shares, found = split_usage(exc.usage, len(pack)), {}
        except JudgeError as exc:  # wait (incident, rate limit) or stop (cancelled): all alike
            shares = split_usage(exc.usage, len(pack))
            return [
                (t, self._settle_error(t, exc, u, Stage.EXTRACTION))
                for (t, _), u in zip(pack, shares, strict=True)
            ]
        else:
            shares, found = split_usage(reply.usage, len(pack)), reply.claims
        done: list[tuple[Taken, StageOutcome]] = []
        for index, ((taken, key), share) in enumerate(zip(pack, shares, strict=True)):
            claims = found.get(index)
            if claims is None:
                done.append((taken, self._extract_alone(judge, taken, key, share)))
            else:
                done.append((taken, self._claims_found(taken, claims, share, key, hit=False)))
        return done

    def _extract_alone(self, judge: Judge, taken: Taken, key: str, spent: Usage) -> StageOutcome:
        """One call for one ground truth (after `spent` on its behalf already)."""
        assert taken.ground_truth is not None
        try:
            reply = judge.extract_claims(taken.ground_truth, taken.run_id)
        except JudgeError as exc:
            return self._settle_error(taken, exc, spent + exc.usage, Stage.EXTRACTION)
        return self._claims_found(taken, reply.data["claims"], spent + reply.usage, key, hit=False)

    def _claims_found(
        self, taken: Taken, claims: list[str], usage: Usage, key: str, hit: bool
    ) -> StageOutcome:
        """Store the claims (and cache fresh ones); none ends the item with score 0."""
        if not claims:
            return self.items.succeed(
                taken, scoring.no_claims(), usage, Stage.EXTRACTION, cache_hits=int(hit)
            )
        stored = self.items.save_claims(taken, claims, usage, hit, key)
        return stored if isinstance(stored, Skipped) else Continue(stored)

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

    def _settle_error(
        self, taken: Taken, exc: JudgeError, usage: Usage, stage: Stage
    ) -> Ended | Skipped | Deferred:
        """A call that cannot succeed now (no rate-limit room, a provider incident) puts the
        item back in the queue until it can, keeping its claims and usage; a provider
        incident fails it only once its run's retry deadline has passed. A run whose budget
        is spent is cancelled (reason "budget"), this item with it. Any other error fails it
        at once, with the provider's message."""
        if isinstance(exc, RunCancelled) and exc.reason == "budget":
            if self.runs.cancel_for_budget(taken.run_id):
                log.info("run %s reached its budget: cancelled", taken.run_id)
            # the item is cancelled now: fail() finds it so and only charges what was spent
            return self._fail(taken, str(exc), usage, stage)
        if not isinstance(exc, TryLater):
            return self._fail(taken, str(exc), usage, stage)
        if not exc.counts_towards_deadline:
            waiting = _datetime(taken.waiting_since)
            return self.items.defer(taken, exc.delay, usage, stage, waiting)
        now = time.time()
        since = taken.waiting_since or now
        deadline = self.retry_deadline if taken.retry_deadline_s is None else taken.retry_deadline_s
        if now - since >= deadline:
            error = f"gave up after the run's retry deadline ({deadline:g} s) passed: {exc}"
            return self._fail(taken, error, usage, stage)
        return self.items.defer(taken, exc.delay, usage, stage, _datetime(since))

    def _fail(self, taken: Taken, error: str, usage: Usage, stage: Stage) -> Ended | Skipped:
        log.info("item %s of run %s failed: %s", taken.item_id, taken.run_id, error)
        return self.items.fail(taken, error, usage, stage)


def split_usage(usage: Usage, parts: int) -> list[Usage]:
    """A shared call's usage as `parts` shares that add up to it exactly: the first share
    carries the call itself (llm_calls, attempts) and the tokens that do not divide evenly,
    so a run's totals count every call once."""
    prompt, prompt_rest = divmod(usage.prompt_tokens, parts)
    completion, completion_rest = divmod(usage.completion_tokens, parts)
    cost = usage.cost_usd / parts
    rest = Usage(0, prompt, completion, cost)
    first = Usage(
        usage.llm_calls,
        prompt + prompt_rest,
        completion + completion_rest,
        usage.cost_usd - cost * (parts - 1),
        usage.call_attempts,
        usage.failed_calls,
    )
    return [first] + [rest] * (parts - 1)


def extraction_packs(
    uncached: list[tuple[Taken, str]], size: int, max_tokens: int
) -> list[list[tuple[Taken, str]]]:
    """Consecutive packs of at most `size` ground truths and about `max_tokens` tokens of
    them (4 characters a token); one long ground truth goes alone."""
    packs: list[list[tuple[Taken, str]]] = []
    current: list[tuple[Taken, str]] = []
    tokens = 0
    for entry in uncached:
        length = len(entry[0].ground_truth or "") // 4
        if current and (len(current) >= size or tokens + length > max_tokens):
            packs.append(current)
            current, tokens = [], 0
        current.append(entry)
        tokens += length
    if current:
        packs.append(current)
    return packs


def _datetime(unix_seconds: float | None) -> datetime | None:
    return None if unix_seconds is None else datetime.fromtimestamp(unix_seconds, UTC)
