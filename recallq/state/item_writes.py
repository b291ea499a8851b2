"""What the stores share: the tables they write, the guarded UPDATE they build per set of
columns (owner token and status in its WHERE clause), and the values of an item's usage, success
and failure. Only the stores (recallq.state.items, batched_items, runs) import it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Connection,
    DateTime,
    Float,
    Insert,
    Integer,
    Select,
    String,
    Table,
    Text,
    Update,
    any_,
    bindparam,
    column,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from recallq.core.outcomes import Stage
from recallq.core.precision import Precision
from recallq.core.scoring import Outcome, Verdict
from recallq.core.status import ITEM_IN_FLIGHT, ItemStatus, RunStatus
from recallq.core.usage import Usage
from recallq.observability import metrics
from recallq.state.tables import Claim, ClaimCache, Item, KeptView, Run, UsageCharge, utcnow
from recallq.state.usage_spool import Charge

items, runs, claims_table, kept_views, usage_charges, claim_cache = (
    cast(Table, Item.__table__),
    cast(Table, Run.__table__),
    cast(Table, Claim.__table__),
    cast(Table, KeptView.__table__),
    cast(Table, UsageCharge.__table__),
    cast(Table, ClaimCache.__table__),
)

#: An item queued or running, its statuses written into the statement: an IN list of bound
#: values is an "expanding" parameter, which SQLAlchemy renders again, with the whole statement
#: around it, at every execution.
ITEM_IS_IN_FLIGHT = items.c.status.in_(
    [literal_column(f"'{status}'") for status in sorted(ITEM_IN_FLIGHT)]
)
IN_FLIGHT = (
    select(func.count())
    .select_from(items)
    .where(items.c.run_id == bindparam("b_run"), ITEM_IS_IN_FLIGHT)
)
# columns that an update adds to instead of setting
COUNTERS = (
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "cache_hits",
    "attempts",
    "call_attempts",
    "failed_calls",
    "deferrals",
    "extraction_calls",
    "extraction_prompt_tokens",
    "extraction_completion_tokens",
    "extraction_cost_usd",
    "relevance_calls",
    "relevance_prompt_tokens",
    "relevance_completion_tokens",
    "relevance_cost_usd",
)

#: The usage a charge carries, as its row in `usage_charges` keeps it.
CHARGE_COUNTERS = (
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "call_attempts",
    "failed_calls",
)


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


def item_update_params(
    item_id: int, values: dict[str, Any], owner: str | None = None, status: str | None = None
) -> dict[str, Any]:
    """The parameters of `_item_update`'s statement for these values and guards."""
    params = {f"v_{k}": v for k, v in values.items()} | {"b_id": item_id}
    if owner is not None:
        params["b_owner"] = owner
    if status is not None:
        params["b_status"] = status
    return params


def update_item(
    conn: Connection,
    item_id: int,
    values: dict[str, Any],
    owner: str | None = None,
    status: str | None = None,
    unowned: bool = False,
) -> int:
    match_owner = "null" if unowned else "value" if owner is not None else ""
    statement = _item_update(frozenset(values), match_owner, status is not None)
    params = item_update_params(item_id, values, owner, status)
    written: int = conn.execute(statement, params).rowcount
    if written and "status" in values:
        metrics.items_moved(values["status"], written)
    return written


def update_items_in_id_order(
    conn: Connection | Session,
    *conditions: ColumnElement[bool],
    values: dict[str, Any],
    skip_locked: bool = False,
    limit: int | None = None,
) -> list[int]:
    """Lock the matching items in id order, then update them; returns their ids.

    Every writer of several items takes its row locks in the same order, so two of them
    (a cancel and the reaper, say) never wait on each other in a cycle. With skip_locked,
    items another transaction holds right now are left for a later pass.
    """
    locked = (
        select(items.c.id)
        .where(*conditions)
        .order_by(items.c.id)
        .limit(limit)
        .with_for_update(skip_locked=skip_locked)
    )
    # one statement whatever the count (a list of ids would hit the driver's parameter limit)
    statement = (
        update(items)
        .where(items.c.id.in_(locked.scalar_subquery()))
        .values(**values)
        .returning(items.c.id)
    )
    moved = list(conn.execute(statement).scalars())
    if moved and "status" in values:
        metrics.items_moved(values["status"], len(moved))
    return moved


def _insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """INSERT with the dialect's ON CONFLICT support (Postgres, or SQLite in local mode)."""
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table)


@lru_cache
def claims_insert(dialect: str) -> Insert:
    return _insert(dialect, claims_table).on_conflict_do_nothing().returning(claims_table.c.idx)


@lru_cache
def verdicts_upsert(dialect: str) -> Insert:
    statement = _insert(dialect, claims_table)
    return statement.on_conflict_do_update(
        index_elements=["item_id", "idx"],
        set_={
            "text": statement.excluded.text,
            "verdict": statement.excluded.verdict,
            "context_indices": statement.excluded.context_indices,
            "reason": statement.excluded.reason,
        },
    )


# --- a stage's end in one statement (Postgres) ------------------------------------------------
#
# On Postgres a stage's end is one statement in autocommit: the guarded UPDATE of the item is a
# data-modifying CTE, and every other write of the stage happens only for the row it returned
# (the pass still owned the item). One round trip and one trip through SQLAlchemy and the
# driver, instead of BEGIN, three to five statements and COMMIT: most of a worker's CPU per item
# was statement execution (issue 29). SQLite (local mode) has no data-modifying CTEs and keeps
# one transaction of several statements (recallq.state.items).


def json_rows(param: str, name: str, *columns: Any) -> Any:
    """The rows of the JSON array of objects bound as `param`, as a table `name` of `columns`."""
    return (
        func.json_to_recordset(bindparam(param, type_=JSON))
        .table_valued(*columns)
        .render_derived(name=name, with_types=True)
    )


def locked_in_id_order(param: str) -> Any:
    """The items whose ids are bound as `param`, locked in id order (as every writer of
    several items locks them: see update_items_in_id_order)."""
    return (
        select(items.c.id)
        .where(items.c.id == any_(bindparam(param, type_=ARRAY(BigInteger))))
        .order_by(items.c.id)
        .with_for_update()
        .scalar_subquery()
    )


#: A stage's claims, as one JSON array (also the claim cache's value): one row each, in order.
_CLAIM_TEXTS = (
    func.json_array_elements_text(bindparam("b_claims", type_=JSON))
    .table_valued("value", with_ordinality="n")
    .render_derived(name="claim")
)
#: verdict_rows' rows, as one JSON array of objects.
_VERDICT_ROWS = json_rows(
    "b_verdicts",
    "verdict",
    column("idx", Integer),
    column("text", Text),
    column("verdict", String),
    column("context_indices", JSON),
    column("reason", Text),
)
#: The charges a write records (`charge_params`): their usage is counted by the write itself.
_CHARGE_ROWS = json_rows(
    "b_charges",
    "charge",
    column("charge_id", String),
    column("item_id", BigInteger),
    column("run_id", String),
    column("stage", String),
    *(column(k, Float if k == "cost_usd" else Integer) for k in CHARGE_COUNTERS),
    column("answered_at", DateTime(timezone=True)),
)


def _charges_recorded(done: Any) -> Any:
    """The `usage_charges` rows of the charges (b_charges) whose items `done` wrote, as a CTE:
    the write counted their usage, so a copy of them kept in the spool (the write's answer was
    lost, though it committed) is counted nothing more (see write_charges)."""
    charge = _CHARGE_ROWS
    names = ["charge_id", "item_id", "run_id", "stage", *CHARGE_COUNTERS, "answered_at"]
    return (
        _insert("postgresql", usage_charges)
        .from_select(
            [*names, "written_at"],
            select(*(charge.c[n] for n in names), bindparam("b_now", type_=DateTime(timezone=True)))
            .select_from(charge)
            .join(done, done.c.id == charge.c.item_id),
        )
        .on_conflict_do_nothing()
        .returning(usage_charges.c.charge_id)
        .cte("charged")
    )


def _count_of(cte: Any, label: str) -> Any:
    """A count of a CTE's rows, as a column: a CTE the result names is sure to be part of the
    statement (SQLAlchemy leaves out those nothing refers to)."""
    return select(func.count()).select_from(cte).scalar_subquery().label(label)


def _owned_update(keys: frozenset[str]) -> Any:
    """The guarded UPDATE of `update_item(owner=, status=)` as a CTE: the item's id when the
    pass still owned it, no row when not."""
    return _item_update(keys, "value", True).returning(items.c.id, items.c.run_id).cte("done")


@lru_cache
def claims_saved(keys: frozenset[str], write_cache: bool) -> Select[Any]:
    """Extraction's end: the item's usage (guarded by owner and status), its claims, and the
    claim cache's entry when freshly extracted, unless the pass no longer owned the item.
    Returns (owned, inserted): whether it was written, and how many claims were new (fewer
    than given: an earlier pass stored them first)."""
    done = _owned_update(keys)
    owned = exists(select(done.c.id))
    if write_cache:
        cached = (
            _insert("postgresql", claim_cache)
            .from_select(
                ["key", "claims", "created_at"],
                select(
                    bindparam("b_key", type_=String),
                    bindparam("b_claims", type_=JSON),
                    bindparam("b_now", type_=DateTime(timezone=True)),
                ).where(owned),
            )
            .on_conflict_do_nothing()
            .returning(claim_cache.c.key)
            .cte("cached")
        )
    texts = _CLAIM_TEXTS
    inserted = (
        _insert("postgresql", claims_table)
        .from_select(
            ["item_id", "idx", "text"],
            select(done.c.id, texts.c.n - 1, texts.c.value).select_from(done).join(texts, true()),
        )
        .on_conflict_do_nothing()
        .returning(claims_table.c.idx)
        .cte("inserted")
    )
    statement = select(
        owned.label("owned"),
        _count_of(inserted, "inserted"),
        _count_of(_charges_recorded(done), "charged"),
    )
    if write_cache:
        statement = statement.add_columns(_count_of(cached, "cached"))
    return statement


@lru_cache
def owned_write(keys: frozenset[str]) -> Select[Any]:
    """A stage's write of these values alone (a deferral), guarded by owner and status, with
    the charges it counts. Returns (owned)."""
    done = _owned_update(keys)
    return select(
        exists(select(done.c.id)).label("owned"), _count_of(_charges_recorded(done), "charged")
    )


@lru_cache
def ended_statement(keys: frozenset[str]) -> Select[Any]:
    """An item's end (succeed, fail): the item's values (guarded by owner and status), its
    claims' verdicts, and the release of pending items in its place (the run running; rows
    nobody else locks), unless the pass no longer owned the item. Returns (owned, released:
    ids or null, pending: the run's items that were pending before the release).

    All parts see the database as the statement started: the count of the window's items in
    flight leaves out the item itself, which the same statement ends."""
    done = _owned_update(keys)
    owned = exists(select(done.c.id))
    rows = _VERDICT_ROWS
    upsert = _insert("postgresql", claims_table).from_select(
        ["item_id", "idx", "text", "verdict", "context_indices", "reason"],
        select(done.c.id, rows.c.idx, rows.c.text, rows.c.verdict, rows.c.context_indices)
        .add_columns(rows.c.reason)
        .select_from(done)
        .join(rows, true()),
    )
    verdicts = (
        upsert.on_conflict_do_update(
            index_elements=["item_id", "idx"],
            set_={
                "text": upsert.excluded.text,
                "verdict": upsert.excluded.verdict,
                "context_indices": upsert.excluded.context_indices,
                "reason": upsert.excluded.reason,
            },
        )
        .returning(claims_table.c.idx)
        .cte("verdicts")
    )
    in_flight = (
        select(func.count())
        .select_from(items)
        .where(
            items.c.run_id == bindparam("b_run"),
            ITEM_IS_IN_FLIGHT,
            items.c.id != bindparam("b_id"),  # the item itself, which ends here
        )
        .scalar_subquery()
    )
    free = bindparam("b_window", type_=Integer) - in_flight
    pending = (
        select(items.c.id)
        .where(items.c.run_id == bindparam("b_run"), items.c.status == ItemStatus.PENDING)
        .order_by(items.c.id)
    )
    limit = func.greatest(free, 0)
    released = (
        update(items)
        .where(
            items.c.id.in_(
                pending.limit(limit).with_for_update(skip_locked=True).scalar_subquery()
            ),
            owned,
            free >= bindparam("b_group", type_=Integer),
            exists().where(runs.c.id == bindparam("b_run"), runs.c.status == RunStatus.RUNNING),
        )
        .values(status=ItemStatus.QUEUED, lease_until=bindparam("b_lease"))
        .returning(items.c.id)
        .cte("released")
    )
    return select(
        owned.label("owned"),
        select(func.array_agg(released.c.id)).scalar_subquery().label("released"),
        _count_of(pending.subquery(), "pending"),
        _count_of(verdicts, "verdicts"),
        _count_of(_charges_recorded(done), "charged"),
    )


#: The counters extraction's end adds to (spent_values of extraction, with its cache hit).
EXTRACTION_SPENT = (
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "cache_hits",
    "call_attempts",
    "failed_calls",
    "extraction_calls",
    "extraction_prompt_tokens",
    "extraction_completion_tokens",
    "extraction_cost_usd",
)


@lru_cache
def claims_saved_together() -> Select[Any]:
    """Extraction's end for several items (Postgres), as `claims_saved` for each: one row of
    `b_rows` each ({id, owner, the EXTRACTION_SPENT counters, key, fresh, claims}); the items
    are locked in id order (`b_ids`), as every writer of several items. Returns a row per
    item its pass still owned: (id, inserted: how many of its claims were new)."""
    saving = json_rows(
        "b_rows",
        "saving",
        column("id", BigInteger),
        column("owner", String),
        *(column(k, Float if k.endswith("cost_usd") else Integer) for k in EXTRACTION_SPENT),
        column("key", String),
        column("fresh", Boolean),
        column("claims", JSON),
    )
    done = (
        update(items)
        .where(
            items.c.id == saving.c.id,
            items.c.owner == saving.c.owner,
            items.c.status == ItemStatus.RUNNING,
            items.c.id.in_(locked_in_id_order("b_ids")),
        )
        .values(
            {k: items.c[k] + saving.c[k] for k in EXTRACTION_SPENT}
            | {"lease_until": bindparam("b_lease"), "waiting_since": None}
        )
        .returning(items.c.id)
        .cte("done")
    )
    owned = saving.join(done, done.c.id == saving.c.id)
    cached = (
        _insert("postgresql", claim_cache)
        .from_select(
            ["key", "claims", "created_at"],
            select(
                saving.c.key,
                saving.c.claims,
                bindparam("b_now", type_=DateTime(timezone=True)),
            )
            .select_from(owned)
            .where(saving.c.fresh),
        )
        .on_conflict_do_nothing()  # also the second of two items of one ground truth
        .returning(claim_cache.c.key)
        .cte("cached")
    )
    texts = (
        func.json_array_elements_text(saving.c.claims)
        .table_valued("value", with_ordinality="n")
        .render_derived(name="claim")
    )
    inserted = (
        _insert("postgresql", claims_table)
        .from_select(
            ["item_id", "idx", "text"],
            select(saving.c.id, texts.c.n - 1, texts.c.value).select_from(
                owned.join(texts, true())
            ),
        )
        .on_conflict_do_nothing()
        .returning(claims_table.c.item_id)
        .cte("inserted")
    )
    return select(
        done.c.id,
        select(func.count())
        .select_from(inserted)
        .where(inserted.c.item_id == done.c.id)
        .scalar_subquery()
        .label("inserted"),
        _count_of(cached, "cached"),
        _count_of(_charges_recorded(done), "charged"),
    )


def spent_values(usage: Usage, stage: Stage, cache_hits: int = 0) -> dict[str, Any]:
    """Increments of an item's usage counters (see COUNTERS). Extraction's usage is also
    counted apart, so a run's usage can be split by stage (attribution's is the rest). Every
    extraction share counts there, also those of a packed call that carry tokens but not the
    call itself: else their tokens would read as attribution's."""
    spent = {
        "llm_calls": usage.llm_calls,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": usage.cost_usd,
        "cache_hits": cache_hits,
        "call_attempts": usage.call_attempts,
        "failed_calls": usage.failed_calls,
    }
    if stage == Stage.EXTRACTION:
        spent |= {
            "extraction_calls": usage.llm_calls,
            "extraction_prompt_tokens": usage.prompt_tokens,
            "extraction_completion_tokens": usage.completion_tokens,
            "extraction_cost_usd": usage.cost_usd,
        }
    elif stage == Stage.RELEVANCE:
        spent |= {
            "relevance_calls": usage.llm_calls,
            "relevance_prompt_tokens": usage.prompt_tokens,
            "relevance_completion_tokens": usage.completion_tokens,
            "relevance_cost_usd": usage.cost_usd,
        }
    return spent


def add_values(values: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Counter increments of two usages written in one statement, added up."""
    return values | {k: values.get(k, 0) + v for k, v in more.items()}


def succeeded_values(
    outcome: Outcome,
    usage: Usage,
    stage: Stage,
    cache_hits: int,
    precision: Precision | None = None,
    relevance: Usage | None = None,
) -> dict[str, Any]:
    """The values of an item that ends with a score (and its context precision; None: none,
    with no context, or precision off). `relevance`: what a context_relevance call spent,
    beside `stage`'s `usage`."""
    spent = spent_values(usage, stage, cache_hits)
    if relevance is not None and relevance != Usage():
        spent = add_values(spent, spent_values(relevance, Stage.RELEVANCE))
    return spent | {
        "context_precision": None if precision is None else precision.context_precision,
        "first_relevant_rank": None if precision is None else precision.first_relevant_rank,
        "passages": None if precision is None else precision.passages_json(),
        "status": ItemStatus.SUCCEEDED,
        "finished_at": utcnow(),
        "lease_until": None,
        "waiting_since": None,
        "score": outcome.score,
        "reason": outcome.reason,
        "error": None,
        "claims_total": outcome.claims_total,
        "claims_attributed": outcome.claims_attributed,
    }


def failed_values(
    error: str, usage: Usage, stage: Stage, relevance: Usage | None = None
) -> dict[str, Any]:
    """The values of an item that ends without a score."""
    spent = spent_values(usage, stage)
    if relevance is not None and relevance != Usage():
        spent = add_values(spent, spent_values(relevance, Stage.RELEVANCE))
    return spent | {
        "status": ItemStatus.FAILED,
        "finished_at": utcnow(),
        "lease_until": None,
        "waiting_since": None,
        "error": error,
        "score": None,
    }


def verdict_rows(
    item_id: int, claims: Sequence[str], verdicts: dict[int, Verdict]
) -> list[dict[str, Any]]:
    return [
        {
            "item_id": item_id,
            "idx": i,
            "text": text,
            "verdict": verdicts[i].verdict,
            "context_indices": verdicts[i].context_indices,
            "reason": verdicts[i].reason,
        }
        for i, text in enumerate(claims)
    ]


#: What a charge adds to its item: every counter but those of the item's own moves.
USAGE_COUNTERS = tuple(k for k in COUNTERS if k not in ("attempts", "cache_hits", "deferrals"))


def charge_cancelled(conn: Connection, item_id: int, values: dict[str, Any]) -> None:
    """A batch lane write that found the item no longer batched because its run was cancelled:
    the calls it made were still sent and billed, so their usage counts on the cancelled item."""
    spent = {k: v for k, v in values.items() if k in COUNTERS and k != "attempts" and v}
    if spent:
        update_item(conn, item_id, spent, status=ItemStatus.CANCELLED)


def forget_kept_views(conn: Connection, run_id: str) -> None:
    """Usage added to an item after its run completed: the run's kept views are stale."""
    conn.execute(
        delete(kept_views).where(
            or_(kept_views.c.run_id == run_id, kept_views.c.other_run_id == run_id)
        )
    )


@lru_cache
def _charge_insert(dialect: str) -> Insert:
    """A charge's row, unless its charge id was written before."""
    statement = _insert(dialect, usage_charges).on_conflict_do_nothing()
    return statement.returning(usage_charges.c.charge_id)


#: The item a charge is for, locked until the charge is written (or None: deleted since).
_CHARGED_ITEM = select(items.c.id).where(items.c.id == bindparam("item_id")).with_for_update()


def _charge_row(charge: Charge, as_json: bool = False) -> dict[str, Any]:
    """A charge's `usage_charges` row (`as_json`: its time as text, for a JSON parameter)."""
    usage = charge.usage
    answered_at = datetime.fromtimestamp(charge.answered_at, UTC)
    return {
        "charge_id": charge.charge_id,
        "item_id": charge.item_id,
        "run_id": charge.run_id,
        "stage": str(charge.stage),
        **{k: getattr(usage, k) for k in CHARGE_COUNTERS},
        "answered_at": answered_at.isoformat() if as_json else answered_at,
    }


def charge_params(charges: Sequence[Charge]) -> dict[str, Any]:
    """The parameters of the charges a one-statement write records beside its item's usage
    (b_charges, as JSON)."""
    return {"b_charges": [_charge_row(c, as_json=True) for c in charges], "b_now": utcnow()}


def record_charges(conn: Connection, charges: Sequence[Charge]) -> None:
    """Record charges whose usage the write in this transaction counted (SQLite's path of
    `_charges_recorded`)."""
    now = utcnow()
    for charge in charges:
        conn.execute(_charge_insert(conn.dialect.name), _charge_row(charge) | {"written_at": now})


def write_charges(conn: Connection, charges: Sequence[Charge]) -> int:
    """Add each charge's usage to its item, once per charge id (its `usage_charges` row says
    it was written); how many were new. A charge of an item deleted since is dropped."""
    written = 0
    for charge in charges:
        row = _charge_row(charge) | {"written_at": utcnow()}
        usage = charge.usage
        if conn.execute(_CHARGED_ITEM, {"item_id": charge.item_id}).first() is None:
            continue  # its item was deleted (with its run) since
        if conn.execute(_charge_insert(conn.dialect.name), row).first() is None:
            continue  # written before
        spent = spent_values(usage, charge.stage)
        update_item(conn, charge.item_id, {k: spent[k] for k in USAGE_COUNTERS if k in spent})
        forget_kept_views(conn, charge.run_id)
        written += 1
    return written
