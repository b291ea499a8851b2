"""How much of the service one project may hold at once: runs queued or running, and items
not yet ended. Checked before a submission writes anything.

On Postgres the check and the insert that follows it run under a transaction-scoped advisory
lock of the project, so two submissions of one project cannot both pass a cap that only one
of them fits under. (SQLite, local mode, has one writer at a time anyway.)
"""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from recallq.core.status import ITEM_ENDED, RUN_ACTIVE
from recallq.runs.ingest import SubmissionError
from recallq.state.tables import Item, Run

# advisory lock ids are one bigint space for the whole database: ours start with this
_LOCK_NAMESPACE = b"recallq-project:"
RETRY_AFTER = 60  # seconds a refused client is told to wait: runs take minutes to end


class QuotaExceeded(SubmissionError):
    """A project holds as much as it may: 429, with a Retry-After hint."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code=code, status=429)
        self.retry_after = RETRY_AFTER


def lock_project(session: Session, project: str) -> None:
    """Until the session's transaction ends, no other submission of the project passes."""
    if session.get_bind().dialect.name != "postgresql":
        return
    digest = hashlib.sha256(_LOCK_NAMESPACE + project.encode()).digest()
    lock_id = int.from_bytes(digest[:8], "big", signed=True)
    session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})


def active_runs(session: Session, project: str) -> int:
    return int(
        session.scalar(
            select(func.count())
            .select_from(Run)
            .where(Run.project == project, Run.status.in_(RUN_ACTIVE))
        )
        or 0
    )


def unended_items(session: Session, project: str) -> int:
    """Items of the project's active runs that have not ended (an index range per run)."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(Item)
            .join(Run, Run.id == Item.run_id)
            .where(
                Run.project == project,
                Run.status.in_(RUN_ACTIVE),
                Item.status.not_in(ITEM_ENDED),
            )
        )
        or 0
    )


def check_active_runs(session: Session, project: str, most: int) -> None:
    if active_runs(session, project) >= most:
        raise QuotaExceeded(
            f"project {project!r} has {most} runs queued or running, as many as it may; "
            "wait for one to end, or cancel one",
            code="too_many_active_runs",
        )


def check_new_run(
    session: Session, project: str, new_items: int, max_active_runs: int, max_unended_items: int
) -> None:
    """QuotaExceeded when a new run of `new_items` items would pass a cap of the project."""
    check_active_runs(session, project, max_active_runs)
    unended = unended_items(session, project)
    if unended + new_items > max_unended_items:
        raise QuotaExceeded(
            f"project {project!r} has {unended} items waiting to be scored; with these "
            f"{new_items} it would pass its limit of {max_unended_items}",
            code="too_many_queued_items",
        )
