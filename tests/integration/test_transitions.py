"""The moves items and runs make are exactly the table in recallq.core.status.

A trigger on a real database records every (old, new) status of every UPDATE that sets a
status, while the engine and the store take items and runs through every path they have:
scoring, failure, deferral, lost workers, cancel and retry, and the provider batch lane. Then
the moves seen must be the table: none outside it, and every one in it made by some named
store method.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text

from recallq.core import scoring
from recallq.core.errors import PermanentJudgeError, RateLimited
from recallq.core.outcomes import Continue, Deferred, Ended, Skipped, SkipReason, Stage
from recallq.core.status import ITEM_TRANSITIONS, RUN_TRANSITIONS, ItemStatus, RunStatus
from recallq.core.usage import Usage
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.batched_items import BatchedItemStore
from recallq.state.migrate import upgrade
from recallq.state.tables import Item
from tests.fakes import RecordingQueue, ScriptedJudge

MODEL = "transitions-probe"

TRIGGERS = [
    "CREATE TABLE moves (tbl TEXT, old TEXT, new TEXT)",
    """CREATE TRIGGER item_moves AFTER UPDATE OF status ON items
       BEGIN INSERT INTO moves VALUES ('items', old.status, new.status); END""",
    """CREATE TRIGGER run_moves AFTER UPDATE OF status ON runs
       BEGIN INSERT INTO moves VALUES ('runs', old.status, new.status); END""",
]


@pytest.fixture()
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    url = f"sqlite:///{tmp_path / 'moves.db'}"
    upgrade(url)
    settings = Settings(database_url=url, dispatch_window=2)
    judge = ScriptedJudge(
        MODEL,
        fails={
            "permanent": lambda: PermanentJudgeError("bad request", Usage(llm_calls=1)),
            "busy": lambda: RateLimited(MODEL, 0.0),
        },
    )
    made = Runtime.local(settings, RecordingQueue(), judges={MODEL: judge})
    with made.database.transaction() as conn:
        for statement in TRIGGERS:
            conn.execute(text(statement))
    yield made
    made.close()


def _run(runtime: Runtime, *ground_truths: str, mode: str = "online") -> tuple[str, list[int]]:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL], mode=mode, batch_models=[MODEL])
    rows = [{"ground_truth": f"{g} {uuid.uuid4()}", "context": ["c"]} for g in ground_truths]
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, rows, runtime.settings).id
    with runtime.database.session() as session:
        ids = list(session.scalars(select(Item.id).where(Item.run_id == run_id).order_by(Item.idx)))
    return run_id, ids


def _score(runtime: Runtime, item_id: int) -> object:
    """Every stage, as a worker chain runs them."""
    engine = runtime.engine
    outcome = engine.take(item_id)
    if isinstance(outcome, Continue):
        outcome = engine.extract(outcome.taken)
    if isinstance(outcome, Continue):
        outcome = engine.attribute(outcome.taken)
    engine.settle(outcome)
    return outcome


def _moves(runtime: Runtime) -> dict[str, set[tuple[str, str]]]:
    with runtime.database.transaction() as conn:
        rows = conn.execute(text("SELECT tbl, old, new FROM moves")).all()
    seen: dict[str, set[tuple[str, str]]] = {"items": set(), "runs": set()}
    for table, old, new in rows:
        seen[table].add((old, new))
    return seen


def _status(runtime: Runtime, item_id: int) -> str:
    with runtime.database.session() as session:
        item = session.get(Item, item_id)
        assert item is not None
        return item.status


def test_every_move_is_in_the_table_and_every_move_in_the_table_is_made(
    runtime: Runtime,
) -> None:
    engine, items, runs = runtime.engine, runtime.items, runtime.runs

    # scored, failed and deferred items; a window of 2 releases the rest as items end
    run_id, (ok, bad, busy, last) = _run(runtime, "fine", "permanent", "busy", "fine too")
    assert engine.dispatch(run_id) == 2  # queued → running (run), pending → queued
    assert isinstance(_score(runtime, ok), Ended)  # … → succeeded, releases the next
    assert isinstance(_score(runtime, bad), Ended)  # … → failed
    assert isinstance(_score(runtime, busy), Deferred)  # running → queued
    assert items.requeue_lost([busy]) == [busy]  # queued → queued (a lost message)
    taken = engine.take(last)
    assert isinstance(taken, Continue)
    assert items.requeue_lost([last]) == [last]  # running → queued (its worker died)
    assert isinstance(_score(runtime, last), Ended)

    # a pass taken over from a dead worker: running → running
    assert isinstance(engine.take(busy), Continue)
    with runtime.database.transaction() as conn:  # its lease runs out, as after a crash
        conn.execute(text("UPDATE items SET lease_until = '2000-01-01' WHERE id = :i"), {"i": busy})
    assert isinstance(engine.take(busy), Continue)

    # retry while an item still runs (running → running), then after the run completes
    assert runs.retry_failed(run_id, "default") == 1  # failed → pending
    assert _status(runtime, bad) == ItemStatus.PENDING
    with runtime.database.transaction() as conn:  # the retried item is fine this time
        conn.execute(text("UPDATE items SET ground_truth = 'fine' WHERE id = :i"), {"i": bad})
    engine.dispatch(run_id)
    assert isinstance(_score(runtime, bad), Ended)
    taken_busy = engine.take(busy)
    assert isinstance(taken_busy, Continue)
    assert isinstance(items.fail(taken_busy.taken, "given up", Usage(), Stage.EXTRACTION), Ended)
    engine.settle(Ended(run_id))  # running → completed
    assert runs.retry_failed(run_id, "default") == 1  # completed → running

    # resume after the local process stopped: queued and running items → pending, and a
    # resumed item keeps the claims it had extracted
    stopped, (held, sent, later) = _run(runtime, "p", "q", "r")
    engine.dispatch(stopped)  # a window of 2: held and sent queued, later pending
    held_pass = engine.take(held)
    assert isinstance(held_pass, Continue)
    assert isinstance(engine.extract(held_pass.taken), Continue)
    assert runs.resume(stopped, "default") == 2  # running → pending, queued → pending
    assert {_status(runtime, i) for i in (held, sent, later)} == {ItemStatus.PENDING}
    engine.dispatch(stopped)
    again = engine.take(held)
    assert isinstance(again, Continue) and again.taken.claims is not None

    # cancel: a queued run (pending items), and a running one with queued and running items
    waiting, _ = _run(runtime, "a", "b")
    assert runs.cancel(waiting, "default")
    started, (first, second, third) = _run(runtime, "x", "y", "z")
    engine.dispatch(started)
    running = engine.take(first)
    assert isinstance(running, Continue)
    assert runs.cancel(started, "default")
    assert {_status(runtime, i) for i in (first, second, third)} == {ItemStatus.CANCELLED}

    # resume of a cancelled run: cancelled → running, its cancelled items → pending
    assert runs.resume_cancelled(started, "default", None, None) == (3, None)
    assert {_status(runtime, i) for i in (first, second, third)} == {ItemStatus.PENDING}

    # a batch-mode run: its provider batch lane adopts its items and ends them, or the run
    # is cancelled under it (the lane's own moves, made by BatchedItemStore)
    lane = BatchedItemStore()
    batched_run, (scored, failing, unended) = _run(runtime, "b1", "b2", "b3", mode="batch")
    assert engine.dispatch(batched_run) == 0  # queued → running; no item goes to the queue
    with runtime.database.transaction() as conn:
        assert lane.adopt(conn, batched_run, 10) == [scored, failing, unended]  # → batched
        outcome = scoring.score_claims(["b1"], {0: scoring.Verdict(0, "yes", [0])}, 1.0)
        used = Usage(llm_calls=2)
        assert lane.succeed(conn, scored, outcome, used, Stage.ATTRIBUTION, ["b1"])  # succeeded
        error = "provider answered 400: bad"
        assert lane.fail(conn, failing, error, Usage(), Stage.EXTRACTION)  # → failed
    assert engine.take(unended) == Skipped(SkipReason.IN_BATCH)  # no online call for it
    assert runs.cancel(batched_run, "default")  # batched → cancelled
    assert _status(runtime, unended) == ItemStatus.CANCELLED

    seen = _moves(runtime)
    assert seen["items"] <= ITEM_TRANSITIONS, seen["items"] - ITEM_TRANSITIONS
    assert seen["runs"] <= RUN_TRANSITIONS, seen["runs"] - RUN_TRANSITIONS
    assert seen["items"] == ITEM_TRANSITIONS, ITEM_TRANSITIONS - seen["items"]
    assert seen["runs"] == RUN_TRANSITIONS, RUN_TRANSITIONS - seen["runs"]


def test_every_status_has_a_one_line_doc() -> None:
    for enum in (ItemStatus, RunStatus):
        lines = inspect.getsource(enum).splitlines()
        for member in enum:
            definition = next(i for i, line in enumerate(lines) if f'= "{member.value}"' in line)
            assert lines[definition - 1].strip().startswith("#:"), member
    for old, new in ITEM_TRANSITIONS:
        assert ItemStatus(old) and ItemStatus(new)
    for old_run, new_run in RUN_TRANSITIONS:
        assert RunStatus(old_run) and RunStatus(new_run)
