"""Views of completed runs, kept: what recallq.queries derives from a completed run's items (its
run object's aggregates, a group summary, a comparison of two completed runs) is computed once
and read back from `kept_views` after that.

A completed run's items no longer change until a retry re-opens it; a new completion sets a
new finished_at, part of the key, so the view is computed again. Only completed runs are kept:
an active run's items change, and a cancelled batch run's lane can still apply usage. The
entries of a run are deleted with it (ON DELETE CASCADE). Keeping is an optimisation: a view
that cannot be read or stored is computed, and the read that wanted it never fails for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from recallq.models import KeptView, Run, as_utc, utcnow
from recallq.status import RunStatus

log = logging.getLogger(__name__)

_T = TypeVar("_T")
#: How long storing a view waits for a lock (a run being deleted holds one) before giving up.
_LOCK_TIMEOUT = "1s"


def key(kind: str, runs: Sequence[Run], **params: Any) -> str | None:
    """The key of the view `kind` of these runs with these parameters, or None when one of the
    runs is not completed (its view is not kept)."""
    if not runs or any(run.status != RunStatus.COMPLETED or not run.finished_at for run in runs):
        return None
    ended = [[run.id, as_utc(run.finished_at).isoformat()] for run in runs if run.finished_at]
    what = json.dumps([kind, ended, params], sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()


@dataclass(frozen=True)
class View:
    """A computed view to keep: its key, the run(s) it is of, its JSON body."""

    key: str
    run_id: str
    other_run_id: str | None
    body: Any


def as_json(body: _T) -> _T:
    """The body as it reads back once kept (lists for tuples, floats for decimals), so a view
    is the same whether it was just computed or read back."""
    loaded: _T = json.loads(json.dumps(body, default=_number))
    return loaded


def _number(value: object) -> float:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def read(session: Session, keys: Collection[str]) -> dict[str, Any]:
    """The kept bodies of those of these keys that are kept."""
    if not keys:
        return {}
    query = select(KeptView.key, KeptView.body).where(KeptView.key.in_(keys))
    try:
        with session.begin_nested():  # a failure rolls back to here, not the whole session
            rows = session.execute(query).all()
    except SQLAlchemyError:
        log.warning("kept views: reading failed; computing", exc_info=True)
        return {}
    return {key: body for key, body in rows}


def keep(session: Session, views: Sequence[View]) -> None:
    """Store these views (a view already kept, by a concurrent read, stays as it is)."""
    if not views:
        return
    rows = [
        {
            "key": view.key,
            "run_id": view.run_id,
            "other_run_id": view.other_run_id,
            "body": view.body,
            "created_at": utcnow(),
        }
        for view in views
    ]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite

    def store(conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
        conn.execute(dialect.insert(KeptView).values(rows).on_conflict_do_nothing())

    try:
        _apart(session, store)
    except SQLAlchemyError:
        log.warning("kept views: storing failed; the view is computed again", exc_info=True)


def get_or_compute(
    session: Session, kind: str, runs: Sequence[Run], compute: Callable[[], _T], **params: Any
) -> _T:
    """The kept view `kind` of these runs, else `compute()`, kept when every run is completed."""
    view_key = key(kind, runs, **params)
    if view_key is None:
        return compute()
    found = read(session, [view_key])
    if view_key in found:
        kept: _T = found[view_key]
        return kept
    body = as_json(compute())
    other = runs[1].id if len(runs) > 1 else None
    keep(session, [View(view_key, runs[0].id, other, body)])
    return body


def _apart(session: Session, work: Callable[[Connection], _T]) -> _T:
    """Run `work` apart from the session's transaction, so that an error cannot spoil it: on
    Postgres in a short transaction of its own (the view's row locks are not held until the
    session ends); on SQLite, where the session's transaction holds the only write lock
    (recallq.db begins each one IMMEDIATE), in a savepoint of it."""
    bind = session.get_bind()
    if isinstance(bind, Engine) and bind.dialect.name == "postgresql":
        with bind.begin() as conn:
            return work(conn)
    with session.begin_nested():
        return work(session.connection())
