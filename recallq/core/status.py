"""The states of items and runs, and the moves allowed between them.

Only the stores of `recallq.state` move anything from one state to another; their methods name
each move (the package's docstring says which method makes which move, under which guard).

    item:  pending → queued → running → succeeded | failed
           running → queued             (deferred, or its worker was lost)
           queued | running → pending   (resume: the local process that held it stopped)
           failed → pending             (retry)
           pending | queued | running → cancelled   (its run was cancelled)
           cancelled → pending          (resume of its cancelled run)
           pending → batched → succeeded | failed | cancelled   (a batch-mode run's items)
    run:   queued → running → completed → running   (retry of failed items)
           queued | running → cancelled → running   (resume of a cancelled run)
"""

from __future__ import annotations

from enum import StrEnum


class ItemStatus(StrEnum):
    #: Stored, not yet handed to the broker (waits for a place in its run's dispatch window).
    PENDING = "pending"
    #: Handed to the broker: a message for it is on its way, or due once its lease runs out.
    QUEUED = "queued"
    #: A stage owns it under an owner token until the stage ends or its lease runs out.
    RUNNING = "running"
    #: Scored: score, reason and every claim's verdict are stored.
    SUCCEEDED = "succeeded"
    #: Ended without a score; `error` says why. `retry` sends it back to pending.
    FAILED = "failed"
    #: Its run was cancelled before it ended.
    CANCELLED = "cancelled"
    #: Its batch-mode run's provider batch lane owns it (recallq.batch.lane), request by request.
    BATCHED = "batched"


class RunStatus(StrEnum):
    #: Stored; no item has been handed to the broker yet.
    QUEUED = "queued"
    #: Its items are being scored.
    RUNNING = "running"
    #: Every item ended (succeeded or failed); `retry` of failed items makes it running again.
    COMPLETED = "completed"
    #: Cancelled before every item ended; nothing more is scored.
    CANCELLED = "cancelled"


class PublicItemStatus(StrEnum):
    """An item's status as the API, the pages, the exports and the CLI show it: a stored
    status the user need not tell apart is shown as the one it means (public_item_status)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ITEM_ENDED = frozenset({ItemStatus.SUCCEEDED, ItemStatus.FAILED, ItemStatus.CANCELLED})
PUBLIC_ITEM_ENDED = frozenset(
    {PublicItemStatus.SUCCEEDED, PublicItemStatus.FAILED, PublicItemStatus.CANCELLED}
)
ITEM_IN_FLIGHT = frozenset({ItemStatus.QUEUED, ItemStatus.RUNNING})
RUN_ENDED = frozenset({RunStatus.COMPLETED, RunStatus.CANCELLED})
RUN_ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})

#: Every move an item may make. A pair not listed here is a bug: the store makes no other.
ITEM_TRANSITIONS: frozenset[tuple[ItemStatus, ItemStatus]] = frozenset(
    {
        (ItemStatus.PENDING, ItemStatus.QUEUED),  # release_window, release_next
        (ItemStatus.PENDING, ItemStatus.CANCELLED),  # cancel_run
        (ItemStatus.QUEUED, ItemStatus.RUNNING),  # take
        (ItemStatus.QUEUED, ItemStatus.QUEUED),  # requeue_lost (a lost message is sent again)
        (ItemStatus.QUEUED, ItemStatus.CANCELLED),  # cancel_run, or take of a cancelled run
        (ItemStatus.RUNNING, ItemStatus.RUNNING),  # take over from a dead worker, hand_over
        (ItemStatus.RUNNING, ItemStatus.QUEUED),  # defer, requeue_lost
        (ItemStatus.RUNNING, ItemStatus.SUCCEEDED),  # succeed
        (ItemStatus.RUNNING, ItemStatus.FAILED),  # fail
        (ItemStatus.RUNNING, ItemStatus.CANCELLED),  # cancel_run, or take of a cancelled run
        (ItemStatus.QUEUED, ItemStatus.PENDING),  # resume
        (ItemStatus.RUNNING, ItemStatus.PENDING),  # resume
        (ItemStatus.FAILED, ItemStatus.PENDING),  # retry_failed
        (ItemStatus.CANCELLED, ItemStatus.PENDING),  # resume_cancelled
        # the provider batch lane (BatchedItemStore); never queued, so never reaped
        (ItemStatus.PENDING, ItemStatus.BATCHED),  # adopt
        (ItemStatus.BATCHED, ItemStatus.SUCCEEDED),  # succeed
        (ItemStatus.BATCHED, ItemStatus.FAILED),  # fail
        (ItemStatus.BATCHED, ItemStatus.CANCELLED),  # cancel_run
    }
)

#: Every move a run may make.
RUN_TRANSITIONS: frozenset[tuple[RunStatus, RunStatus]] = frozenset(
    {
        (RunStatus.QUEUED, RunStatus.RUNNING),  # release_window (the run's first dispatch)
        (RunStatus.RUNNING, RunStatus.COMPLETED),  # complete_if_done
        (RunStatus.QUEUED, RunStatus.CANCELLED),  # cancel
        (RunStatus.RUNNING, RunStatus.CANCELLED),  # cancel
        (RunStatus.COMPLETED, RunStatus.RUNNING),  # retry_failed
        (RunStatus.RUNNING, RunStatus.RUNNING),  # retry_failed while other items still run
        (RunStatus.CANCELLED, RunStatus.RUNNING),  # resume_cancelled
    }
)


def public_item_status(status: str) -> PublicItemStatus:
    """What the API shows: an item waiting in the broker is still `pending` to a user, and one
    in its run's provider batch lane is `running` (its requests are with the provider)."""
    if status == ItemStatus.QUEUED:
        return PublicItemStatus.PENDING
    if status == ItemStatus.BATCHED:
        return PublicItemStatus.RUNNING
    return PublicItemStatus(status)


def stored_item_statuses(public: str) -> tuple[ItemStatus, ...]:
    """The stored statuses behind a status the API shows."""
    if public == PublicItemStatus.PENDING:
        return (ItemStatus.PENDING, ItemStatus.QUEUED)
    if public == PublicItemStatus.RUNNING:
        return (ItemStatus.RUNNING, ItemStatus.BATCHED)
    return (ItemStatus(PublicItemStatus(public)),)
