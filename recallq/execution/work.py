"""What waits across active runs, by model: the work-waiting read behind the autoscaling
gauges (recallq.observability.gauges.WorkCollector). Three grouped statements: the in-flight
items of the active runs (the run-and-status index finds them; a dispatch window bounds how
many a run has: 0.4 ms with 200k items), the active runs and the pending batches."""

from __future__ import annotations

from sqlalchemy import func, select

from recallq.batch.store import PENDING_BATCHES
from recallq.core.status import ITEM_IN_FLIGHT, RUN_ACTIVE, ItemStatus
from recallq.observability.gauges import WorkCounts
from recallq.state.db import Database
from recallq.state.tables import Item, ProviderBatch, Run

# built once (building SQLAlchemy statements per call costs CPU)
IN_FLIGHT_BY_MODEL = (
    select(Run.model, Item.status, func.count())
    .join(Run, Run.id == Item.run_id)
    .where(Item.status.in_(ITEM_IN_FLIGHT), Run.status.in_(RUN_ACTIVE))
    .group_by(Run.model, Item.status)
)
ACTIVE_RUNS_BY_MODEL = (
    select(Run.model, func.count()).where(Run.status.in_(RUN_ACTIVE)).group_by(Run.model)
)
PENDING_BATCHES_BY_MODEL = (
    select(ProviderBatch.model, func.count(), func.coalesce(func.sum(ProviderBatch.requests), 0))
    .where(ProviderBatch.state.in_(PENDING_BATCHES))
    .group_by(ProviderBatch.model)
)


def read_work(database: Database) -> WorkCounts:
    with database.single_statement() as conn:
        flight_rows = conn.execute(IN_FLIGHT_BY_MODEL).all()
        active_rows = conn.execute(ACTIVE_RUNS_BY_MODEL).all()
        batch_rows = conn.execute(PENDING_BATCHES_BY_MODEL).all()
    waiting: dict[str, float] = {}
    running: dict[str, float] = {}
    for model, status, count in flight_rows:
        waiting[model] = waiting.get(model, 0.0) + count
        if status == ItemStatus.RUNNING:
            running[model] = running.get(model, 0.0) + count
    return WorkCounts(
        waiting=waiting,
        running=running,
        runs={model: float(count) for model, count in active_rows},
        pending_batches={model: float(count) for model, count, _ in batch_rows},
        pending_requests={model: float(requests) for model, _, requests in batch_rows},
    )
