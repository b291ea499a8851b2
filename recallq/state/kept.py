"""Views of completed runs, kept: what recallq.runs.run_views and comparisons derive from a
completed run's items (its run object's aggregates, a group summary, a comparison of two completed
runs) is computed once and read back from `kept_views` after that.

A completed run's items no longer change until a retry re-opens it; a new completion sets a
new finished_at, part of the key, so the view is computed again. Only completed runs are kept:
an active run's items change, and a cancelled batch run's lane can still apply usage. The
entries of a run are deleted with it (ON DELETE CASCADE). Keeping is an optimisation: a view
that cannot be read or stored is computed, and the read that wanted it never fails for it.

Each kind of view has a shape (`Kind.shape`: a fingerprint of the fields its body holds) that
is part of its key and is stored beside its body. A view kept by a version of recallq whose
bodies had another shape is never read as this one's: its key differs, and a body whose stored
shape differs, or that does not read back as its kind (`Misshapen`), is computed again and
kept anew. Views kept before shapes (migration 0009's, positional rows) are never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from recallq.core.status import RunStatus
from recallq.state.tables import KeptView, Run, as_utc, utcnow

log = logging.getLogger(__name__)

_T = TypeVar("_T")
#: How long storing a view waits for a lock (a run being deleted holds one) before giving up.
_LOCK_TIMEOUT = "1s"


class Misshapen(ValueError):
    """A kept body that is not of its kind's shape."""


def shape(kind: str, *parts: Sequence[Any]) -> str:
    """A kind's shape: a fingerprint of what its body holds (names of fields, columns and
    statuses, or a version number that is bumped when the body changes)."""
    what = json.dumps([kind, *parts], sort_keys=True, default=str)
    return f"{kind}/{hashlib.sha256(what.encode()).hexdigest()[:16]}"


def _same(body: Any) -> Any:
    return body


@dataclass(frozen=True)
class Kind(Generic[_T]):
    """A kind of kept view: its name, its shape, how a value becomes a JSON body and how a body
    reads back (raising Misshapen for one that does not)."""

    name: str
    shape: str
    body: Callable[[_T], Any] = _same
    of_body: Callable[[Any], _T] = _same


def key(kind: Kind[Any], runs: Sequence[Run], **params: Any) -> str | None:
    """The key of the view `kind` of these runs with these parameters, or None when one of the
    runs is not completed (its view is not kept)."""
    if not runs or any(run.status != RunStatus.COMPLETED or not run.finished_at for run in runs):
        return None
    ended = [[run.id, as_utc(run.finished_at).isoformat()] for run in runs if run.finished_at]
    what = json.dumps([kind.name, kind.shape, ended, params], sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()


@dataclass(frozen=True)
class View:
    """A computed view to keep: its key, the run(s) it is of, its JSON body (`Kind.body`)."""

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


def read(session: Session, kind: Kind[_T], keys: Collection[str]) -> dict[str, _T]:
    """The kept views of those of these keys that are kept in `kind`'s shape."""
    if not keys:
        return {}
    query = select(KeptView.key, KeptView.body).where(KeptView.key.in_(keys))
    try:
        with session.begin_nested():  # a failure rolls back to here, not the whole session
            rows = session.execute(query).all()
    except SQLAlchemyError:
        log.warning("kept views: reading failed; computing", exc_info=True)
        return {}
    found: dict[str, _T] = {}
    for view_key, stored in rows:
        try:
            if not isinstance(stored, dict) or stored.get("shape") != kind.shape:
                raise Misshapen(f"kept in shape {_stored_shape(stored)!r}, not {kind.shape!r}")
            found[view_key] = kind.of_body(stored["body"])
        except (Misshapen, KeyError) as problem:
            log.info("kept views: %s view %s computed again: %s", kind.name, view_key, problem)
    return found


def _stored_shape(stored: Any) -> Any:
    return stored.get("shape") if isinstance(stored, dict) else None


def keep(session: Session, kind: Kind[Any], views: Sequence[View]) -> None:
    """Store these views in `kind`'s shape, replacing one of that key kept in another."""
    if not views:
        return
    rows = [
        {
            "key": view.key,
            "run_id": view.run_id,
            "other_run_id": view.other_run_id,
            "body": {"shape": kind.shape, "body": view.body},
            "created_at": utcnow(),
        }
        for view in views
    ]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite

    def store(conn: Connection) -> None:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
        insert = dialect.insert(KeptView).values(rows)
        conn.execute(
            insert.on_conflict_do_update(
                index_elements=[KeptView.key],
                set_={"body": insert.excluded.body, "created_at": insert.excluded.created_at},
            )
        )

    try:
        _apart(session, store)
    except SQLAlchemyError:
        log.warning("kept views: storing failed; the view is computed again", exc_info=True)


def get_or_compute(
    session: Session,
    kind: Kind[_T],
    runs: Sequence[Run],
    compute: Callable[[], _T],
    **params: Any,
) -> _T:
    """The kept view `kind` of these runs, else `compute()`, kept when every run is completed.
    A view computed to be kept is returned as it reads back."""
    view_key = key(kind, runs, **params)
    if view_key is None:
        return compute()
    found = read(session, kind, [view_key])
    if view_key in found:
        return found[view_key]
    body = as_json(kind.body(compute()))
    other = runs[1].id if len(runs) > 1 else None
    keep(session, kind, [View(view_key, runs[0].id, other, body)])
    return kind.of_body(body)


def _apart(session: Session, work: Callable[[Connection], _T]) -> _T:
    """Run `work` apart from the session's transaction, so that an error cannot spoil it: on
    Postgres in a short transaction of its own (the view's row locks are not held until the
    session ends); on SQLite, where the session's transaction holds the only write lock
    (recallq.state.db begins each one IMMEDIATE), in a savepoint of it."""
    bind = session.get_bind()
    if isinstance(bind, Engine) and bind.dialect.name == "postgresql":
        with bind.begin() as conn:
            return work(conn)
    with session.begin_nested():
        return work(session.connection())
