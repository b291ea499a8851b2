"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)  -> release a window of pending items to the broker
    extract(item)  -> claims (judge call 1, or the claim cache)
    attribute(item)-> verdicts, score, reason (judge call 2); the run ends with its last item

State lives in the database. Every write is guarded by the item's status, taken under a row
lock, so the loser of a race between two copies of a stage writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from recallq import scoring
from recallq.db import session_scope
from recallq.models import Claim, ClaimCache, Item, ItemStatus, Run, RunStatus, utcnow
from recallq.settings import get_settings
from worker.judge.base import JudgeError, PermanentJudgeError, RateLimited, Usage
from worker.judges import get_judge

log = logging.getLogger(__name__)

Enqueue = Callable[[list[int]], None]


# --- dispatch ---------------------------------------------------------------------------------


def release_items(session: Session, run_id: str, limit: int) -> list[int]:
    """Mark up to `limit` pending items of a run queued; the caller sends their messages."""
    if limit <= 0:
        return []
    ids = list(
        session.scalars(
            select(Item.id)
            .where(Item.run_id == run_id, Item.status == ItemStatus.PENDING)
            .order_by(Item.idx)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
    if ids:
        session.execute(
            update(Item)
            .where(Item.id.in_(ids))
            .values(status=ItemStatus.QUEUED, lease_until=_lease())
        )
    return ids


def dispatch(run_id: str, enqueue: Enqueue) -> int:
    """Start a run: fill its window of queued items. Safe to call again at any time."""
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


def _lease(seconds: float | None = None) -> object:
    return utcnow() + timedelta(seconds=seconds or get_settings().lease_seconds)


# --- claim cache ------------------------------------------------------------------------------


def cache_key(ground_truth: str, model: str, prompt_version: str) -> str:
    payload = json.dumps([ground_truth, model, prompt_version], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def _upsert_ignore(session: Session, table, rows: list[dict]) -> None:  # type: ignore[no-untyped-def]
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    session.execute(insert(table).on_conflict_do_nothing(), rows)


# --- item stages ------------------------------------------------------------------------------


def _lock_running(session: Session, item_id: int) -> Item | None:
    item = session.get(Item, item_id, with_for_update=True)
    return item if item is not None and item.status == ItemStatus.RUNNING else None


def _add_usage(item: Item, usage: Usage, cache_hits: int = 0) -> None:
    item.llm_calls += usage.llm_calls
    item.prompt_tokens += usage.prompt_tokens
    item.completion_tokens += usage.completion_tokens
    item.cost_usd += usage.cost_usd
    item.cache_hits += cache_hits


def _claim_texts(session: Session, item_id: int) -> list[Claim]:
    return list(session.scalars(select(Claim).where(Claim.item_id == item_id).order_by(Claim.idx)))


def start(item_id: int) -> tuple[str, str, str | None] | None:
    """Take an item for work. Returns (run_id, model, ground_truth) or None when there is
    nothing to do (ended, cancelled, or already extracted)."""
    with session_scope() as session:
        item = session.get(Item, item_id, with_for_update=True)
        if item is None or item.status in ItemStatus.ENDED:
            return None
        run = session.get(Run, item.run_id)
        assert run is not None
        if run.status == RunStatus.CANCELLED:
            item.status, item.finished_at = ItemStatus.CANCELLED, utcnow()
            return None
        if item.status != ItemStatus.RUNNING:
            item.started_at = item.started_at or utcnow()
        item.status, item.lease_until = ItemStatus.RUNNING, _lease()
        item.attempts += 1
        has_claims = session.scalar(select(exists().where(Claim.item_id == item_id)))
        if has_claims:
            return None
        if item.ground_truth is None:
            _finish(session, item, scoring.no_ground_truth())
            return None
        return item.run_id, run.model, item.ground_truth


def extract(item_id: int) -> None:
    taken = start(item_id)
    if taken is None:
        return
    run_id, model, ground_truth = taken
    judge = get_judge_or_fail(item_id, model)
    if judge is None:
        return
    key = cache_key(ground_truth, model, judge.prompt_version)
    with session_scope() as session:
        cached = session.get(ClaimCache, key)
    usage, hits = Usage(), 0
    if cached is not None:
        claims, hits = list(cached.claims), 1
    else:
        try:
            reply = judge.extract_claims(ground_truth)
        except JudgeError as exc:
            _settle_error(item_id, exc)
            return
        claims, usage = reply.data["claims"], reply.usage
    with session_scope() as session:
        item = _lock_running(session, item_id)
        if item is None or session.scalar(select(exists().where(Claim.item_id == item_id))):
            return  # cancelled meanwhile, or another copy of this stage got here first
        _add_usage(item, usage, hits)
        if cached is None and claims:
            _upsert_ignore(session, ClaimCache, [{"key": key, "claims": claims}])
        if not claims:
            _finish(session, item, scoring.no_claims())
            return
        session.add_all(Claim(item_id=item_id, idx=i, text=text) for i, text in enumerate(claims))
        item.lease_until = _lease()


def attribute(item_id: int) -> None:
    with session_scope() as session:
        item = _lock_running(session, item_id)
        if item is None:
            return
        claims = _claim_texts(session, item_id)
        if not claims:
            return  # extraction ended the item or has not happened; nothing to attribute
        texts = [c.text for c in claims]
        contexts, model, scale = (
            list(item.contexts),
            _run_model(session, item),
            _scale(session, item),
        )
        if not contexts:
            verdicts = scoring.no_context_verdicts(len(texts))
            _write_verdicts(session, claims, verdicts)
            _finish(session, item, scoring.no_context(texts))
            return
    judge = get_judge_or_fail(item_id, model)
    if judge is None:
        return
    usage = Usage()
    try:
        verdicts, missing = _ask_verdicts(judge, texts, contexts, list(range(len(texts))), usage)
        if missing:  # asked again once, for the claims left without a verdict
            again, missing = _ask_verdicts(judge, texts, contexts, missing, usage)
            verdicts.update(again)
    except JudgeError as exc:
        usage += exc.usage
        _settle_error(item_id, exc, usage)
        return
    with session_scope() as session:
        item = _lock_running(session, item_id)
        if item is None:
            return
        _add_usage(item, usage)
        if missing:
            _fail(
                session,
                item,
                "no verdict for claims " + ", ".join(map(str, missing)) + " after asking twice",
            )
            return
        claims = _claim_texts(session, item_id)
        _write_verdicts(session, claims, verdicts)
        _finish(session, item, scoring.score_claims(texts, verdicts, scale))


def _ask_verdicts(
    judge,
    texts: list[str],
    contexts: list[str],
    indices: list[int],
    usage: Usage,  # type: ignore[no-untyped-def]
) -> tuple[dict[int, scoring.Verdict], list[int]]:
    """Ask for verdicts on a subset of claims; return them keyed by the claims' own indices."""
    reply = judge.attribute([texts[i] for i in indices], contexts)
    usage += reply.usage
    matched, missing = scoring.match_verdicts(
        reply.data.get("verdicts"), len(indices), len(contexts)
    )
    return (
        {indices[j]: _reindex(v, indices[j]) for j, v in matched.items()},
        [indices[j] for j in missing],
    )


def _reindex(verdict: scoring.Verdict, index: int) -> scoring.Verdict:
    return scoring.Verdict(index, verdict.verdict, verdict.context_indices, verdict.reason)


def _run_model(session: Session, item: Item) -> str:
    return session.scalars(select(Run.model).where(Run.id == item.run_id)).one()


def _scale(session: Session, item: Item) -> float:
    return session.scalars(select(Run.scale).where(Run.id == item.run_id)).one()


def _write_verdicts(
    session: Session, claims: list[Claim], verdicts: dict[int, scoring.Verdict]
) -> None:
    for claim in claims:
        verdict = verdicts[claim.idx]
        claim.verdict, claim.context_indices, claim.reason = (
            verdict.verdict,
            verdict.context_indices,
            verdict.reason,
        )


def get_judge_or_fail(item_id: int, model: str):  # type: ignore[no-untyped-def]
    try:
        return get_judge(model)
    except JudgeError as exc:
        _settle_error(item_id, exc)
        return None


def _settle_error(item_id: int, exc: JudgeError, usage: Usage | None = None) -> None:
    """A judge error ends the item (permanent) or puts it back for later (rate limited)."""
    with session_scope() as session:
        item = _lock_running(session, item_id)
        if item is None:
            return
        _add_usage(item, usage or exc.usage)
        if isinstance(exc, RateLimited):
            item.status, item.lease_until = ItemStatus.QUEUED, _lease(exc.delay)
            return
        message = str(exc) if isinstance(exc, PermanentJudgeError) else f"judge error: {exc}"
        _fail(session, item, message)


# --- ending -----------------------------------------------------------------------------------


def _finish(session: Session, item: Item, outcome: scoring.Outcome) -> None:
    item.status, item.finished_at, item.lease_until = ItemStatus.SUCCEEDED, utcnow(), None
    item.score, item.reason, item.error = outcome.score, outcome.reason, None
    item.claims_total, item.claims_attributed = outcome.claims_total, outcome.claims_attributed


def _fail(session: Session, item: Item, error: str) -> None:
    log.info("item %s failed: %s", item.id, error)
    item.status, item.finished_at, item.lease_until = ItemStatus.FAILED, utcnow(), None
    item.error, item.score = error, None


def after_item(item_id: int, enqueue: Enqueue) -> None:
    """An item's chain is over: hand its slot in the window to the next pending item and
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
