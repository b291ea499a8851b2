"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)       -> release a window of pending items to the broker
    take(item)          -> own the item (a fresh owner token), or learn there is nothing to do
    extract(item)       -> claims (judge call 1, or the claim cache)
    attribute(item)     -> verdicts, score, reason (judge call 2)
    after_item(item)    -> refill the window; the run completes with its last item

State lives in the database. Every write happens under the item's row lock and only while the
item is still running under the writer's owner token, so a stale or duplicate copy of a stage
writes nothing: no second set of claims, no usage counted twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from recallq import scoring
from recallq.db import session_scope
from recallq.locking import update_items
from recallq.models import Claim, ClaimCache, Item, ItemStatus, Run, RunStatus, as_utc, utcnow
from recallq.settings import get_settings
from worker.gate import current_run
from worker.judge.base import Judge, JudgeError, RateLimited, Usage
from worker.judges import get_judge
from worker.liveness import new_owner_token

log = logging.getLogger(__name__)

Enqueue = Callable[[list[int]], None]


def lease_from_now(seconds: float | None = None) -> datetime:
    return utcnow() + timedelta(seconds=seconds or get_settings().lease_seconds)


# --- dispatch ---------------------------------------------------------------------------------


def release_items(session: Session, run_id: str, limit: int) -> list[int]:
    """Mark up to `limit` pending items of a run queued (in index order: ids follow it);
    the caller sends their messages."""
    if limit <= 0:
        return []
    return update_items(
        session,
        Item.run_id == run_id,
        Item.status == ItemStatus.PENDING,
        values={"status": ItemStatus.QUEUED, "lease_until": lease_from_now()},
        skip_locked=True,
        limit=limit,
    )


def dispatch(run_id: str, enqueue: Enqueue) -> int:
    """Start a run, or top up its window of queued items. Safe to call again at any time."""
    window = get_settings().dispatch_window
    with session_scope() as session:
        run = session.get(Run, run_id, with_for_update=True)
        if run is None or run.status in RunStatus.ENDED:
            return 0
        if run.status == RunStatus.QUEUED:
            run.status, run.started_at = RunStatus.RUNNING, utcnow()
        in_flight = session.scalar(
            select(func.count())
            .select_from(Item)
            .where(Item.run_id == run_id, Item.status.in_((ItemStatus.QUEUED, ItemStatus.RUNNING)))
        )
        ids = release_items(session, run_id, window - (in_flight or 0))
    if ids:
        enqueue(ids)
    complete_run_if_done(run_id)
    return len(ids)


# --- claim cache ------------------------------------------------------------------------------


def cache_key(ground_truth: str, model: str, prompt_version: str) -> str:
    payload = json.dumps([ground_truth, model, prompt_version], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def _insert_ignoring_conflicts(session: Session, table: type, rows: list[dict]) -> None:
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(table).on_conflict_do_nothing(), rows)


# --- taking an item ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Taken:
    owner: str
    run_id: str
    model: str
    ground_truth: str | None  # None when claims exist already (a retry reuses them)


def take(item_id: int, holder_alive: Callable[[str], bool]) -> Taken | None:
    """Own an item for this pass through the chain, or None when there is nothing to do:
    it ended, its run was cancelled, or a live worker holds it under an unexpired lease."""
    with session_scope() as session:
        item = session.get(Item, item_id, with_for_update=True)
        if item is None or item.status in ItemStatus.ENDED:
            return None
        run = session.get(Run, item.run_id)
        assert run is not None
        if run.status == RunStatus.CANCELLED:
            item.status, item.finished_at = ItemStatus.CANCELLED, utcnow()
            return None
        held = item.status == ItemStatus.RUNNING and item.owner and item.lease_until is not None
        if held and as_utc(item.lease_until) > utcnow() and holder_alive(item.owner):
            return None  # a duplicate message: the holder is on it
        owner = new_owner_token()
        item.status, item.owner, item.lease_until = ItemStatus.RUNNING, owner, lease_from_now()
        item.started_at = item.started_at or utcnow()
        item.attempts += 1
        if item.ground_truth is None:
            _finish(item, scoring.no_ground_truth())
            return None
        has_claims = session.scalar(select(exists().where(Claim.item_id == item_id)))
        return Taken(owner, item.run_id, run.model, None if has_claims else item.ground_truth)


def _lock_owned(session: Session, item_id: int, owner: str) -> Item | None:
    item = session.get(Item, item_id, with_for_update=True)
    if item is None or item.status != ItemStatus.RUNNING or item.owner != owner:
        return None
    return item


# --- stages -----------------------------------------------------------------------------------


def extract(item_id: int, taken: Taken) -> bool:
    """Claims for the item; True when attribution should follow."""
    if taken.ground_truth is None:
        return True  # extracted on an earlier pass
    judge = _judge(item_id, taken)
    if judge is None:
        return False
    key = cache_key(taken.ground_truth, taken.model, judge.prompt_version)
    with session_scope() as session:
        cached = session.get(ClaimCache, key)
    usage, hits = Usage(), 0
    if cached is not None:
        claims, hits = list(cached.claims), 1
    else:
        try:
            reply = _with_run(taken, lambda: judge.extract_claims(taken.ground_truth or ""))
        except JudgeError as exc:
            _settle_error(item_id, taken, exc, exc.usage)
            return False
        claims, usage = reply.data["claims"], reply.usage
    with session_scope() as session:
        item = _lock_owned(session, item_id, taken.owner)
        if item is None:
            return False  # cancelled meanwhile, or another copy took the item over
        _add_usage(item, usage, hits)
        if cached is None and claims:
            _insert_ignoring_conflicts(session, ClaimCache, [{"key": key, "claims": claims}])
        if not claims:
            _finish(item, scoring.no_claims())
            return False
        rows = [{"item_id": item_id, "idx": i, "text": text} for i, text in enumerate(claims)]
        _insert_ignoring_conflicts(session, Claim, rows)
        item.lease_until = lease_from_now()
    return True


def attribute(item_id: int, taken: Taken) -> None:
    with session_scope() as session:
        item = _lock_owned(session, item_id, taken.owner)
        if item is None:
            return
        claims = _claims(session, item_id)
        texts, contexts = [c.text for c in claims], list(item.contexts)
        scale = session.scalars(select(Run.scale).where(Run.id == item.run_id)).one()
        if not contexts:
            _write_verdicts(claims, scoring.no_context_verdicts(len(texts)))
            _finish(item, scoring.no_context(texts))
            return
    judge = _judge(item_id, taken)
    if judge is None:
        return
    usage = Usage()
    try:
        verdicts, missing = _ask_verdicts(judge, taken, texts, contexts, range(len(texts)), usage)
        if missing:  # asked again once, for the claims left without a verdict
            again, missing = _ask_verdicts(judge, taken, texts, contexts, missing, usage)
            verdicts.update(again)
    except JudgeError as exc:
        usage += exc.usage
        _settle_error(item_id, taken, exc, usage)
        return
    with session_scope() as session:
        item = _lock_owned(session, item_id, taken.owner)
        if item is None:
            return
        _add_usage(item, usage)
        if missing:
            names = ", ".join(str(i) for i in missing)
            _fail(item, f"the judge gave no verdict for claim(s) {names}, asked twice")
            return
        _write_verdicts(_claims(session, item_id), verdicts)
        _finish(item, scoring.score_claims(texts, verdicts, scale))


def _ask_verdicts(
    judge: Judge,
    taken: Taken,
    texts: list[str],
    contexts: list[str],
    indices: range | list[int],
    usage: Usage,
) -> tuple[dict[int, scoring.Verdict], list[int]]:
    """Verdicts for a subset of claims, keyed by the claims' own indices, and those missing."""
    indices = list(indices)
    reply = _with_run(taken, lambda: judge.attribute([texts[i] for i in indices], contexts))
    usage += reply.usage
    matched, missing = scoring.match_verdicts(
        reply.data.get("verdicts"), len(indices), len(contexts)
    )
    verdicts = {
        indices[j]: scoring.Verdict(indices[j], v.verdict, v.context_indices, v.reason)
        for j, v in matched.items()
    }
    return verdicts, [indices[j] for j in missing]


def _with_run(taken: Taken, call: Callable):  # type: ignore[type-arg,no-untyped-def]
    """Run a judge call with the item's run as context (the cancel gate reads it)."""
    token = current_run.set(taken.run_id)
    try:
        return call()
    finally:
        current_run.reset(token)


def _judge(item_id: int, taken: Taken) -> Judge | None:
    try:
        return get_judge(taken.model)
    except JudgeError as exc:
        _settle_error(item_id, taken, exc, exc.usage)
        return None


def _claims(session: Session, item_id: int) -> list[Claim]:
    return list(session.scalars(select(Claim).where(Claim.item_id == item_id).order_by(Claim.idx)))


def _write_verdicts(claims: list[Claim], verdicts: dict[int, scoring.Verdict]) -> None:
    for claim in claims:
        verdict = verdicts[claim.idx]
        claim.verdict = verdict.verdict
        claim.context_indices = verdict.context_indices
        claim.reason = verdict.reason


def _add_usage(item: Item, usage: Usage, cache_hits: int = 0) -> None:
    item.llm_calls += usage.llm_calls
    item.prompt_tokens += usage.prompt_tokens
    item.completion_tokens += usage.completion_tokens
    item.cost_usd += usage.cost_usd
    item.cache_hits += cache_hits


def _settle_error(item_id: int, taken: Taken, exc: JudgeError, usage: Usage) -> None:
    """A judge error fails the item, or, when the rate limit has no room soon, puts it back
    in the queue for the reaper to send again once capacity is expected."""
    with session_scope() as session:
        item = _lock_owned(session, item_id, taken.owner)
        if item is None:
            return
        _add_usage(item, usage)
        if isinstance(exc, RateLimited):
            item.status, item.owner = ItemStatus.QUEUED, None
            item.lease_until = lease_from_now(exc.delay)
            return
        _fail(item, str(exc))


# --- ending -----------------------------------------------------------------------------------


def _finish(item: Item, outcome: scoring.Outcome) -> None:
    item.status, item.finished_at, item.lease_until = ItemStatus.SUCCEEDED, utcnow(), None
    item.score, item.reason, item.error = outcome.score, outcome.reason, None
    item.claims_total, item.claims_attributed = outcome.claims_total, outcome.claims_attributed


def _fail(item: Item, error: str) -> None:
    log.info("item %s failed: %s", item.id, error)
    item.status, item.finished_at, item.lease_until = ItemStatus.FAILED, utcnow(), None
    item.error, item.score = error, None


def after_item(item_id: int, enqueue: Enqueue) -> None:
    """An item's chain is over: give its place in the window to the next pending item, and
    complete the run when this was its last item."""
    with session_scope() as session:
        row = session.execute(
            select(Item.run_id, Item.status).where(Item.id == item_id)
        ).one_or_none()
        if row is None or row.status not in ItemStatus.ENDED:
            return
        run_status = session.scalar(select(Run.status).where(Run.id == row.run_id))
        ids = release_items(session, row.run_id, 1) if run_status == RunStatus.RUNNING else []
    if ids:
        enqueue(ids)
    complete_run_if_done(row.run_id)


def complete_run_if_done(run_id: str) -> bool:
    """Called after the caller's item update has committed, so the last one to end sees all."""
    with session_scope() as session:
        unfinished = exists().where(
            and_(Item.run_id == run_id, Item.status.not_in(ItemStatus.ENDED))
        )
        result = session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == RunStatus.RUNNING, ~unfinished)
            .values(status=RunStatus.COMPLETED, finished_at=utcnow())
        )
        return bool(result.rowcount)
