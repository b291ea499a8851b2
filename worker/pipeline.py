"""The stages of one item, each idempotent: redelivery or a second copy never duplicates work.

    dispatch(run)        release a window of pending items to the broker
    take(item)           own the item under a fresh owner token, or learn there is nothing to do
    extract(item)        claims: judge call 1, or the claim cache
    attribute(item)      verdicts, score and reason: judge call 2
    when an item ends    the next pending item of its run takes its place in the window,
                         and the run completes with its last item

State lives in the database. A stage writes only while the item is still running under its
owner token (checked in the UPDATE itself), so a stale or duplicate copy of a stage writes
nothing: no second set of claims, no usage counted twice. The hot path is plain Core SQL,
about ten statements per item; one on its own runs without BEGIN and COMMIT.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Connection,
    Insert,
    Table,
    Update,
    and_,
    bindparam,
    exists,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from recallq import scoring
from recallq.db import session_scope, single_statement, transaction
from recallq.locking import update_items
from recallq.models import Claim, ClaimCache, Item, ItemStatus, Run, RunStatus, as_utc, utcnow
from recallq.settings import get_settings
from worker.gate import current_run
from worker.judge.base import Judge, JudgeError, RateLimited, Usage
from worker.judges import get_judge
from worker.liveness import new_owner_token

log = logging.getLogger(__name__)

items, runs, claims_table, cache = (
    Item.__table__,
    Run.__table__,
    Claim.__table__,
    ClaimCache.__table__,
)
Enqueue = Callable[[list[int]], None]


def lease_from_now(seconds: float | None = None) -> datetime:
    """Lease of a stage at work (default), or of `seconds`."""
    return utcnow() + timedelta(seconds=seconds or get_settings().lease_seconds)


def queue_lease() -> datetime:
    """Lease of an item whose next message waits in the broker. If the message is lost (a
    worker died holding it unacknowledged), the reaper sends another when this runs out;
    a duplicate is harmless, the owner token sorts it out."""
    return lease_from_now(get_settings().queue_lease_seconds)


# Statements of the hot path are built once, with bound parameters: building SQLAlchemy
# expressions per call cost more CPU than running them.

TAKE_READ = (
    select(
        items.c.status,
        items.c.owner,
        items.c.lease_until,
        items.c.started_at,
        items.c.ground_truth,
        items.c.run_id,
        runs.c.status.label("run_status"),
        runs.c.model,
        runs.c.scale,
        exists().where(claims_table.c.item_id == items.c.id).label("has_claims"),
    )
    .join_from(items, runs, runs.c.id == items.c.run_id)
    .where(items.c.id == bindparam("item_id"))
)
CACHED_CLAIMS = select(cache.c.claims).where(cache.c.key == bindparam("key"))
STORED_CLAIMS = (
    select(claims_table.c.text)
    .where(claims_table.c.item_id == bindparam("item_id"))
    .order_by(claims_table.c.idx)
)
ATTRIBUTION_START = (
    update(items)
    .where(
        items.c.id == bindparam("b_id"),
        items.c.owner == bindparam("b_owner"),
        items.c.status == ItemStatus.RUNNING,
    )
    .values(owner=bindparam("b_new_owner"), lease_until=bindparam("b_lease"))
    .returning(items.c.contexts)
)
RELEASE_NEXT = (
    update(items)
    .where(
        items.c.id
        == select(items.c.id)
        .where(items.c.run_id == bindparam("b_run"), items.c.status == ItemStatus.PENDING)
        .order_by(items.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery(),
        exists().where(runs.c.id == bindparam("b_run"), runs.c.status == RunStatus.RUNNING),
    )
    .values(status=ItemStatus.QUEUED, lease_until=bindparam("b_lease"))
    .returning(items.c.id)
)
COMPLETE_RUN = (
    update(runs)
    .where(
        runs.c.id == bindparam("b_run"),
        runs.c.status == RunStatus.RUNNING,
        ~exists().where(
            and_(items.c.run_id == bindparam("b_run"), items.c.status.not_in(ItemStatus.ENDED))
        ),
    )
    .values(status=RunStatus.COMPLETED, finished_at=bindparam("b_now"))
)
COUNTERS = ("llm_calls", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hits", "attempts")


@lru_cache
def _item_update(keys: frozenset[str], match_owner: str, match_status: bool) -> Update:
    """UPDATE items SET keys WHERE id [AND owner = / IS NULL] [AND status]; counters are
    increments."""
    values = {
        key: items.c[key] + bindparam(f"v_{key}") if key in COUNTERS else bindparam(f"v_{key}")
        for key in keys
    }
    where = [items.c.id == bindparam("b_id")]
    if match_owner == "value":
        where.append(items.c.owner == bindparam("b_owner"))
    elif match_owner == "null":
        where.append(items.c.owner.is_(None))
    if match_status:
        where.append(items.c.status == bindparam("b_status"))
    return update(items).where(*where).values(values)


def _run_item_update(
    conn: Connection,
    item_id: int,
    values: dict[str, Any],
    owner: str | None = None,
    status: str | None = None,
    unowned: bool = False,
) -> int:
    match_owner = "null" if unowned else "value" if owner is not None else ""
    statement = _item_update(frozenset(values), match_owner, status is not None)
    params = {f"v_{k}": v for k, v in values.items()} | {"b_id": item_id}
    if owner is not None:
        params["b_owner"] = owner
    if status is not None:
        params["b_status"] = status
    return conn.execute(statement, params).rowcount


def _insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """INSERT with the dialect's ON CONFLICT support (Postgres, or SQLite in local mode)."""
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table)


@lru_cache
def _claims_insert(dialect: str) -> Insert:
    return _insert(dialect, claims_table).on_conflict_do_nothing().returning(claims_table.c.idx)


@lru_cache
def _cache_insert(dialect: str) -> Insert:
    return _insert(dialect, cache).on_conflict_do_nothing()


@lru_cache
def _verdicts_upsert(dialect: str) -> Insert:
    insert = _insert(dialect, claims_table)
    return insert.on_conflict_do_update(
        index_elements=["item_id", "idx"],
        set_={
            "text": insert.excluded.text,
            "verdict": insert.excluded.verdict,
            "context_indices": insert.excluded.context_indices,
            "reason": insert.excluded.reason,
        },
    )


# --- dispatch ---------------------------------------------------------------------------------


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
            .select_from(items)
            .where(items.c.run_id == run_id, items.c.status.in_(ItemStatus.IN_FLIGHT))
        )
        ids = update_items(
            session,
            Item.run_id == run_id,
            Item.status == ItemStatus.PENDING,
            values={"status": ItemStatus.QUEUED, "lease_until": queue_lease()},
            skip_locked=True,
            limit=max(0, window - (in_flight or 0)),
        )
    if ids:
        enqueue(ids)
    else:
        complete_run_if_done(run_id)
    return len(ids)


def complete_run_if_done(run_id: str) -> bool:
    """Called after the caller's item update has committed, so the last one to end sees all."""
    with single_statement() as conn:
        return bool(conn.execute(COMPLETE_RUN, {"b_run": run_id, "b_now": utcnow()}).rowcount)


def expire_lease(item_id: int) -> None:
    """Best effort: make a running item due for the reaper now."""
    try:
        with single_statement() as conn:
            soon = {"lease_until": lease_from_now(1)}
            _run_item_update(conn, item_id, soon, status=ItemStatus.RUNNING)
    except Exception:  # noqa: BLE001  (called while handling an outage)
        log.warning("could not expire the lease of item %s", item_id, exc_info=True)


def _release_next(conn: Connection, run_id: str) -> list[int]:
    """The next pending item of a running run becomes queued (its message is the caller's)."""
    params = {"b_run": run_id, "b_lease": queue_lease()}
    return list(conn.execute(RELEASE_NEXT, params).scalars())


# --- taking an item ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Taken:
    """One pass of an item through the chain; travels from extract to attribute."""

    item_id: int
    owner: str
    run_id: str
    model: str
    scale: float
    ground_truth: str
    claims: list[str] | None = None  # known already (a retry reuses extracted claims)

    def to_message(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Ended:
    """An item ended: the items released in its place, or the run to check for completion."""

    run_id: str
    released: list[int] = field(default_factory=list)


def finish_up(ended: Ended | None, enqueue: Enqueue) -> None:
    """After the ending transaction committed: send the released items, or complete the run."""
    if ended is None:
        return
    if ended.released:
        enqueue(ended.released)
    else:
        complete_run_if_done(ended.run_id)


def take(item_id: int, holder_alive: Callable[[str], bool]) -> Taken | Ended | None:
    """Own an item for this pass, or return why there is nothing to do: None when it ended,
    its run was cancelled or a live worker holds it; Ended when it ended right here.

    The read and the write need no common transaction: the write happens only if nobody
    moved the item on since the read (its WHERE checks owner and status again)."""
    now = utcnow()
    with single_statement() as conn:
        row = conn.execute(TAKE_READ, {"item_id": item_id}).one_or_none()
    if row is None or row.status in ItemStatus.ENDED:
        return None
    if row.run_status == RunStatus.CANCELLED:
        cancelled = {"status": ItemStatus.CANCELLED, "finished_at": now, "lease_until": None}
        with single_statement() as conn:
            _run_item_update(conn, item_id, cancelled, status=row.status)
        return None
    held = row.status == ItemStatus.RUNNING and row.owner and row.lease_until is not None
    if held and as_utc(row.lease_until) > now and holder_alive(row.owner):
        return None  # a duplicate message: the holder is on it
    owner = new_owner_token()
    values: dict[str, Any] = {
        "status": ItemStatus.RUNNING,
        "owner": owner,
        "lease_until": lease_from_now(),
        "attempts": 1,
    }
    if row.started_at is None:  # first taking; a retaken item keeps when it started
        values["started_at"] = now
    unchanged = {"owner": row.owner, "status": row.status, "unowned": row.owner is None}
    ends_here = row.ground_truth is None  # nothing to score: the next item starts in its place
    if ends_here:
        values |= _outcome_values(scoring.no_ground_truth(), now)
    with transaction() if ends_here else single_statement() as conn:
        if not _run_item_update(conn, item_id, values, **unchanged):
            return None
        if ends_here:
            return Ended(row.run_id, _release_next(conn, row.run_id))
        known = _stored_claims(conn, item_id) if row.has_claims else None
    return Taken(item_id, owner, row.run_id, row.model, row.scale, row.ground_truth, known)


# --- stages -----------------------------------------------------------------------------------


def extract(taken: Taken) -> Taken | Ended | None:
    """Claims for the item. Returns the pass with its claims for attribution, or how it ended."""
    if taken.claims is not None:
        return taken
    judge = _judge(taken)
    if isinstance(judge, Ended | type(None)):
        return judge
    key = cache_key(taken.ground_truth, taken.model, judge.prompt_version)
    with single_statement() as conn:
        cached = conn.execute(CACHED_CLAIMS, {"key": key}).scalar()
    usage, hits = Usage(), 0
    if cached is not None:
        found, hits = list(cached), 1
    else:
        try:
            reply = _with_run(taken, lambda: judge.extract_claims(taken.ground_truth))
        except JudgeError as exc:
            return _settle_error(taken, exc, exc.usage)
        found, usage = reply.data["claims"], reply.usage
    now = utcnow()
    with transaction() as conn:
        values = _usage_values(usage, hits) | {"lease_until": queue_lease()}
        if not found:
            return _end(conn, taken, values | _outcome_values(scoring.no_claims(), now))
        if not _update_owned(conn, taken, values):
            return None  # cancelled meanwhile, or another copy took the item over
        if cached is None:
            conn.execute(_cache_insert(conn.dialect.name), [{"key": key, "claims": found}])
        rows = [{"item_id": taken.item_id, "idx": i, "text": t} for i, t in enumerate(found)]
        inserted = conn.execute(_claims_insert(conn.dialect.name), rows).all()
        if len(inserted) != len(found):  # an earlier pass stored its claims first: use those
            found = _stored_claims(conn, taken.item_id)
    return Taken(**{**taken.to_message(), "claims": found})


def _stored_claims(conn: Connection, item_id: int) -> list[str]:
    return list(conn.execute(STORED_CLAIMS, {"item_id": item_id}).scalars())


def attribute(taken: Taken) -> Ended | None:
    """Verdicts, score and reason. The stage takes the item over under a token of the worker
    running it (often not the one that extracted), so the reaper follows this worker's
    heartbeat, and a duplicate of this message finds the item no longer its own."""
    texts = taken.claims or []
    owner = new_owner_token()
    with single_statement() as conn:
        params = {
            "b_id": taken.item_id,
            "b_owner": taken.owner,
            "b_new_owner": owner,
            "b_lease": lease_from_now(),
        }
        row = conn.execute(ATTRIBUTION_START, params).one_or_none()
    if row is None:
        return None  # not ours any more: cancelled, ended, or taken over
    taken = replace(taken, owner=owner)
    contexts = list(row.contexts)
    now = utcnow()
    if not contexts:
        with transaction() as conn:
            return _end(
                conn,
                taken,
                _outcome_values(scoring.no_context(texts), now),
                scoring.no_context_verdicts(len(texts)),
            )
    judge = _judge(taken)
    if isinstance(judge, Ended | type(None)):
        return judge
    usage = Usage()
    try:
        verdicts, missing = _ask_verdicts(judge, taken, texts, contexts, range(len(texts)), usage)
        if missing:  # asked again once, for the claims left without a verdict
            again, missing = _ask_verdicts(judge, taken, texts, contexts, missing, usage)
            verdicts.update(again)
    except JudgeError as exc:
        usage += exc.usage
        return _settle_error(taken, exc, usage)
    with transaction() as conn:
        if missing:
            names = ", ".join(str(i) for i in missing)
            error = f"the judge gave no verdict for claim(s) {names}, asked twice"
            return _end(conn, taken, _usage_values(usage) | _failure_values(taken, error, now))
        outcome = scoring.score_claims(texts, verdicts, taken.scale)
        values = _usage_values(usage) | _outcome_values(outcome, now)
        return _end(conn, taken, values, verdicts)


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


def cache_key(ground_truth: str, model: str, prompt_version: str) -> str:
    payload = json.dumps([ground_truth, model, prompt_version], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def _with_run(taken: Taken, call: Callable[[], Any]) -> Any:
    """Run a judge call with the item's run as context (the cancel gate reads it)."""
    token = current_run.set(taken.run_id)
    try:
        return call()
    finally:
        current_run.reset(token)


def _judge(taken: Taken) -> Judge | Ended | None:
    try:
        return get_judge(taken.model)
    except JudgeError as exc:
        return _settle_error(taken, exc, exc.usage)


# --- writes -----------------------------------------------------------------------------------


def _update_owned(conn: Connection, taken: Taken, values: dict[str, Any]) -> bool:
    """Write only while this pass owns the running item (the owner token says so). If its
    run was cancelled meanwhile, the calls this pass made were still sent and billed: their
    usage counts on the cancelled item, and nothing else of the pass is written."""
    owned = _run_item_update(
        conn, taken.item_id, values, owner=taken.owner, status=ItemStatus.RUNNING
    )
    if not owned:
        spent = {k: v for k, v in values.items() if k in COUNTERS and k != "attempts" and v}
        if spent:
            _run_item_update(conn, taken.item_id, spent, status=ItemStatus.CANCELLED)
    return bool(owned)


def _end(
    conn: Connection,
    taken: Taken,
    values: dict[str, Any],
    verdicts: dict[int, scoring.Verdict] | None = None,
) -> Ended | None:
    """End the item if this pass still owns it; release the next pending item in its place."""
    if not _update_owned(conn, taken, values):
        return None
    if verdicts:
        rows = [
            {
                "item_id": taken.item_id,
                "idx": i,
                "text": text,
                "verdict": verdicts[i].verdict,
                "context_indices": verdicts[i].context_indices,
                "reason": verdicts[i].reason,
            }
            for i, text in enumerate(taken.claims or [])
        ]
        conn.execute(_verdicts_upsert(conn.dialect.name), rows)
    return Ended(taken.run_id, _release_next(conn, taken.run_id))


def _settle_error(taken: Taken, exc: JudgeError, usage: Usage) -> Ended | None:
    """A judge error fails the item, or, when the rate limit has no room soon, puts it back
    in the queue for the reaper to send again once capacity is expected."""
    with transaction() as conn:
        if isinstance(exc, RateLimited):
            values = _usage_values(usage) | {
                "status": ItemStatus.QUEUED,
                "owner": None,
                "lease_until": lease_from_now(exc.delay),
            }
            _update_owned(conn, taken, values)
            return None
        return _end(conn, taken, _usage_values(usage) | _failure_values(taken, str(exc), utcnow()))


def _usage_values(usage: Usage, cache_hits: int = 0) -> dict[str, Any]:
    """Increments of the item's usage counters (see COUNTERS)."""
    return {
        "llm_calls": usage.llm_calls,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": usage.cost_usd,
        "cache_hits": cache_hits,
    }


def _outcome_values(outcome: scoring.Outcome, now: datetime) -> dict[str, Any]:
    return {
        "status": ItemStatus.SUCCEEDED,
        "finished_at": now,
        "lease_until": None,
        "score": outcome.score,
        "reason": outcome.reason,
        "error": None,
        "claims_total": outcome.claims_total,
        "claims_attributed": outcome.claims_attributed,
    }


def _failure_values(taken: Taken, error: str, now: datetime) -> dict[str, Any]:
    log.info("item %s of run %s failed: %s", taken.item_id, taken.run_id, error)
    return {
        "status": ItemStatus.FAILED,
        "finished_at": now,
        "lease_until": None,
        "error": error,
        "score": None,
    }
