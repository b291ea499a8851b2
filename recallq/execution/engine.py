"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)        release a window of pending items to the queue
    extract_group(items) take each item (own it under a fresh owner token, or learn there is
                         nothing to do), then find their claims: from the claim cache, or one
                         judge call per pack of up to N ground truths
    attribute(pass)      verdicts, score and reason: one judge call per item; a run with
                         precision "judged" adds one context_relevance call (relevance stage)
    settle(outcome)      when an item ended, send the items released in its place, or complete
                         the run with its last item

The engine is the pipeline's synchronous driver: every rule (what an answer or an error
means for the item: score, ask again, repair, wait, fail) is recallq.pipeline's, applied here
one call after the other. `go_on` routes what a stage returned, for every caller.

Each stage calls the judge and the store, and returns what happened (recallq.core.outcomes):
Continue (the next stage goes on), Ended, Skipped(reason) or Deferred(until). State lives in
the database and only the store writes it. The same engine runs under Celery workers (one
task per stage) and in local mode (a thread pool); `WorkQueue` is how it sends work on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Protocol

from recallq import pipeline
from recallq.coordination.call_gate import RunCancelled
from recallq.core import precision as precision_rules
from recallq.core import scoring
from recallq.core.errors import JudgeError, MalformedAnswer, PermanentJudgeError
from recallq.core.outcomes import Continue, Deferred, Ended, Skipped, Stage, StageOutcome, Taken
from recallq.core.usage import NO_USAGE, Usage
from recallq.judge.base import Judge, JudgeReply, Repair
from recallq.judge.by_model import JudgeRegistry
from recallq.pipeline import Failed, Relevant, Scored, Verdicts, split_usage
from recallq.state.claim_cache import ClaimCache
from recallq.state.items import FoundClaims, HandedOver, ItemStore
from recallq.state.runs import RunStore

log = logging.getLogger(__name__)


class WorkQueue(Protocol):
    """Where the engine sends work: the broker (Celery) or an in-process runner."""

    def send_items(self, item_ids: Sequence[int]) -> None:
        """Score these queued items: extraction in groups (`extract_group`), then their
        attribution (`send_attributions`) and settle."""
        ...

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        """Attribute (and settle) items whose claims are known: those of one extraction group
        are sent together."""
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
        return self._started(taken)

    def _started(self, taken: Taken | Skipped) -> StageOutcome:
        if isinstance(taken, Skipped):
            return taken
        ended = pipeline.start(taken.ground_truth)
        if ended is not None:
            return self.items.succeed(taken, ended.outcome, NO_USAGE, Stage.EXTRACTION)
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
        group = self.items.take_group(item_ids, self.owners.new_token, self.owners.holder_alive)
        for item_id, taken in zip(item_ids, group, strict=True):
            outcome = self._started(taken)
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
        return self.attribute_handed(self.items.hand_over(taken, self.owners.new_token()))

    def hand_over_group(self, passes: Sequence[Taken]) -> list[HandedOver | Skipped]:
        """Take over the items of one attribution message at once (as `attribute` does for
        one), to attribute them one after the other with `attribute_handed`."""
        return self.items.hand_over_group(passes, self.owners.new_token())

    def attribute_handed(self, handed: HandedOver | Skipped) -> StageOutcome:
        """`attribute` of an item this process has taken over."""
        if isinstance(handed, Skipped):
            return handed
        taken, contexts = handed
        claims = list(taken.claims or ())
        ended = pipeline.before_attribution(claims, contexts)
        if ended is not None:
            return self.items.succeed(
                taken, ended.outcome, NO_USAGE, Stage.ATTRIBUTION, ended.verdicts
            )
        try:
            judge = self.judges.get(taken.model)
        except JudgeError as exc:
            return self._settle_error(taken, exc, exc.usage, Stage.ATTRIBUTION)
        usage = NO_USAGE
        asked = list(range(len(claims)))
        kept: dict[int, scoring.Verdict] = {}
        reask = False
        while True:
            question = [claims[i] for i in asked]
            answer, used = ask_repairing(partial(judge.attribute, question, contexts, taken.run_id))
            usage += used
            if not isinstance(answer, JudgeReply):
                return self._unanswered(taken, answer, usage, Stage.ATTRIBUTION)
            found = pipeline.verdicts_found(
                answer.data.get("verdicts"), asked, len(contexts), kept, reask
            )
            if isinstance(found, Failed):
                return self._fail(taken, found.error, usage, Stage.ATTRIBUTION)
            if isinstance(found, Verdicts):
                done = pipeline.scored(
                    claims, found.verdicts, taken.scale, len(contexts), taken.precision
                )
                if pipeline.needs_relevance(taken.precision, len(contexts)):
                    return self._relevance(judge, taken, contexts, done, usage)
                return self.items.succeed(
                    taken,
                    done.outcome,
                    usage,
                    Stage.ATTRIBUTION,
                    done.verdicts,
                    precision=done.precision,
                )
            asked, kept, reask = found.missing, found.verdicts, True

    def _relevance(
        self, judge: Judge, taken: Taken, contexts: list[str], done: Scored, spent: Usage
    ) -> StageOutcome:
        """Precision "judged": one context_relevance call with every passage (verdicts matched
        by context_index); passages left without a verdict are asked again once, then the item
        fails naming them. Its usage is the relevance stage's; `spent` is attribution's."""
        assert taken.ground_truth is not None  # take ended items without one
        usage = NO_USAGE
        asked = list(range(len(contexts)))
        kept: dict[int, precision_rules.Relevance] = {}
        reask = False
        while True:
            passages = [(i, contexts[i]) for i in asked]
            answer, used = ask_repairing(
                partial(judge.judge_relevance, taken.ground_truth, passages, taken.run_id)
            )
            usage += used
            if not isinstance(answer, JudgeReply):
                if isinstance(answer, Failed):
                    return self._fail(taken, answer.error, spent, Stage.ATTRIBUTION, usage)
                return self._settle_error(taken, answer, spent, Stage.ATTRIBUTION, usage)
            found = pipeline.relevance_found(
                answer.data.get("verdicts"), asked, len(contexts), kept, reask
            )
            if isinstance(found, Failed):
                return self._fail(taken, found.error, spent, Stage.ATTRIBUTION, usage)
            if isinstance(found, Relevant):
                judged = pipeline.judged_precision(
                    done, found.relevance, len(contexts), taken.scale
                )
                return self.items.succeed(
                    taken,
                    judged.outcome,
                    spent,
                    Stage.ATTRIBUTION,
                    judged.verdicts,
                    precision=judged.precision,
                    relevance=usage,
                )
            asked, kept, reask = found.missing, found.relevance, True

    def go_on(
        self,
        item_id: int,
        outcome: StageOutcome,
        later: Callable[[int, datetime], None] | None = None,
    ) -> None:
        """What follows a stage, wherever it ran (a Celery task, the local runner, a test):
        a pass that goes on is sent to attribution; a deferred item is sent again at its time
        by `later` (without one, the reaper sends it when it is due); an item that ended is
        settled; a skipped message needs nothing."""
        self.go_on_group([(item_id, outcome)], later)

    def go_on_group(
        self,
        outcomes: Sequence[tuple[int, StageOutcome]],
        later: Callable[[int, datetime], None] | None = None,
    ) -> None:
        """`go_on` for the items of one stage's group, in order; those that go on are sent to
        attribution together."""
        passes = [outcome.taken for _, outcome in outcomes if isinstance(outcome, Continue)]
        if passes:
            self.queue.send_attributions(passes)
        for item_id, outcome in outcomes:
            if isinstance(outcome, Deferred):
                if later is not None:
                    later(item_id, outcome.until)
            elif not isinstance(outcome, Continue):
                self.settle(outcome)

    def settle(self, outcome: StageOutcome) -> None:
        """After an item ended (its write committed): send the items released in its place,
        or, when none was, complete the run if this was its last item. An item whose write
        saw pending items left cannot have been the last: no query for that."""
        if not isinstance(outcome, Ended):
            return
        if outcome.released:
            self.queue.send_items(outcome.released)
        elif not outcome.pending_left:
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
        hits: list[FoundClaims] = []
        keys = [ClaimCache.key(t.ground_truth or "", t.model, project=t.project) for t in needed]
        known = self.items.cached_claims(keys)  # one query for the group
        for taken, key in zip(needed, keys, strict=True):
            assert taken.ground_truth is not None  # take ended items without one
            cached = known.get(key)
            if cached is None:
                uncached.append((taken, key))
            else:
                hits.append(FoundClaims(taken, cached, NO_USAGE, True, key))
        done += self._claims_found_together(hits)
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
        item never fails the others. The call's usage is shared among the pack's items by
        their share of the prompt, all of it extraction's."""
        texts = [taken.ground_truth or "" for taken, _ in pack]
        weights = [len(text) for text in texts]
        try:
            reply = judge.extract_claims_packed(texts, pack[0][0].run_id)
        except PermanentJudgeError as exc:  # malformed, or refused as a bad request
            shares = split_usage(exc.usage, len(pack), weights)
            found = pipeline.packed_claims_found(None)
        except JudgeError as exc:  # wait (incident, rate limit) or stop (cancelled): all alike
            shares = split_usage(exc.usage, len(pack), weights)
            return [
                (t, self._settle_error(t, exc, u, Stage.EXTRACTION))
                for (t, _), u in zip(pack, shares, strict=True)
            ]
        else:
            shares = split_usage(reply.usage, len(pack), weights)
            found = pipeline.packed_claims_found(reply)
        answered: list[FoundClaims] = []
        left_out: list[tuple[Taken, str, Usage]] = []
        for index, ((taken, key), share) in enumerate(zip(pack, shares, strict=True)):
            claims = found.get(index)
            if claims is None:
                left_out.append((taken, key, share))
            else:
                answered.append(FoundClaims(taken, claims, share, False, key))
        done = self._claims_found_together(answered)  # stored before any further call
        for taken, key, share in left_out:
            done.append((taken, self._extract_alone(judge, taken, key, share)))
        return done

    def _extract_alone(self, judge: Judge, taken: Taken, key: str, spent: Usage) -> StageOutcome:
        """One call for one ground truth (after `spent` on its behalf already), and its
        repair request if the answer is malformed."""
        assert taken.ground_truth is not None
        answer, used = ask_repairing(
            partial(judge.extract_claims, taken.ground_truth, taken.run_id)
        )
        usage = spent + used
        if not isinstance(answer, JudgeReply):
            return self._unanswered(taken, answer, usage, Stage.EXTRACTION)
        return self._claims_found(taken, answer.data["claims"], usage, key, hit=False)

    def _claims_found(
        self, taken: Taken, claims: list[str], usage: Usage, key: str, hit: bool
    ) -> StageOutcome:
        """Store the claims (and cache fresh ones); none ends the item with score 0."""
        found = pipeline.claims_found(claims)
        if isinstance(found, Scored):
            return self.items.succeed(
                taken, found.outcome, usage, Stage.EXTRACTION, cache_hits=int(hit)
            )
        stored = self.items.save_claims(taken, found.claims, usage, hit, key)
        return stored if isinstance(stored, Skipped) else Continue(stored)

    def _claims_found_together(self, found: list[FoundClaims]) -> list[tuple[Taken, StageOutcome]]:
        """`_claims_found` for several passes: their claims stored together."""
        done: list[tuple[Taken, StageOutcome]] = []
        storing: list[FoundClaims] = []
        for each in found:
            claims = pipeline.claims_found(each.claims)
            if isinstance(claims, Scored):
                ended = self.items.succeed(
                    each.taken,
                    claims.outcome,
                    each.usage,
                    Stage.EXTRACTION,
                    cache_hits=int(each.cache_hit),
                )
                done.append((each.taken, ended))
            else:
                storing.append(replace(each, claims=claims.claims))
        stored = self.items.save_claims_together(storing)
        for each, outcome in zip(storing, stored, strict=True):
            done.append(
                (each.taken, outcome if isinstance(outcome, Skipped) else Continue(outcome))
            )
        return done

    def _unanswered(
        self, taken: Taken, answer: Failed | JudgeError, usage: Usage, stage: Stage
    ) -> Ended | Skipped | Deferred:
        """A question the judge left unanswered: a malformed answer its repair did not mend,
        or an error."""
        if isinstance(answer, Failed):
            return self._fail(taken, answer.error, usage, stage)
        return self._settle_error(taken, answer, usage, stage)

    def _settle_error(
        self,
        taken: Taken,
        exc: JudgeError,
        usage: Usage,
        stage: Stage,
        relevance: Usage = NO_USAGE,
    ) -> Ended | Skipped | Deferred:
        """A call that cannot succeed now (no rate-limit room, a provider incident) puts the
        item back in the queue until it can, keeping its claims and usage; a provider
        incident fails it only once its run's retry deadline has passed. A run whose budget
        is spent is cancelled (reason "budget"), this item with it. Any other error fails it
        at once, with the provider's message."""
        if isinstance(exc, RunCancelled):
            if exc.reason == "budget" and self.runs.cancel_for_budget(taken.run_id):
                log.info("run %s reached its budget: cancelled", taken.run_id[:8])
            # the item is cancelled now: fail() finds it so and only charges what was spent
            ended = self.items.fail(taken, str(exc), usage, stage, relevance)
            log.info("%s cancelled: %s", taken.label, exc)
            return ended
        deadline = pipeline.retry_deadline_s(taken.retry_deadline_s, self.retry_deadline)
        decision = pipeline.after_error(exc, taken.waiting_since, time.time(), deadline)
        if isinstance(decision, Failed):
            return self._fail(taken, decision.error, usage, stage, relevance)
        delay = decision.delay_s or 0.0
        since = _datetime(decision.since_s)
        return self.items.defer(taken, delay, usage, stage, since, relevance)

    def _fail(
        self, taken: Taken, error: str, usage: Usage, stage: Stage, relevance: Usage = NO_USAGE
    ) -> Ended | Skipped:
        ended = self.items.fail(taken, error, usage, stage, relevance)
        if isinstance(ended, Ended):  # else it had moved on: cancelled, or taken over
            log.info("%s failed: %s", taken.label, error)
        return ended


def ask_repairing(
    ask: Callable[[Repair | None], JudgeReply],
) -> tuple[JudgeReply | Failed | JudgeError, Usage]:
    """One judge call, and its repair request when the answer is malformed (the pipeline says
    when a repair is allowed): the answer, Failed (a malformed answer not mended) or the error
    the call raised, with what every call made for it used."""
    usage, repair = NO_USAGE, None
    while True:
        try:
            reply = ask(repair)
        except MalformedAnswer as exc:
            usage += exc.usage
            mended = pipeline.malformed_answer(exc, repaired=repair is not None)
            if isinstance(mended, Failed):
                return mended, usage
            repair = mended
        except JudgeError as exc:
            return exc, usage + exc.usage
        else:
            return reply, usage + reply.usage


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
