"""How many statements and transactions each stage's end costs a worker, on real Postgres
(issue 29: SQLAlchemy's statement execution was most of a worker's CPU per item).

Every statement is a trip through SQLAlchemy and the driver holding the GIL, and every
transaction adds two round trips (BEGIN, COMMIT). The stages are called in-process as a worker
runs them (the judge is a double at the LLM boundary); the counts are those of the store's
writes at each stage's end, the engine's settle included.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from recallq.core.outcomes import Continue, Ended, Skipped, SkipReason, Taken
from recallq.core.status import ItemStatus, RunStatus
from recallq.core.usage import Usage
from recallq.execution.runtime import Runtime
from recallq.runs import ingest
from recallq.settings import Settings
from recallq.state.items import FoundClaims
from recallq.state.tables import Claim, ClaimCache, Item, Run, UsageCharge
from tests.fakes import RecordingQueue, ScriptedJudge
from tests.services import redis_database

MODEL = "round-trips-probe"


@dataclass
class Counts:
    """What the engine sent while counting: each statement's first line, and how many
    transactions (BEGIN ... COMMIT; a statement in autocommit is none)."""

    statements: list[str] = field(default_factory=list)
    transactions: int = 0

    def __str__(self) -> str:
        return f"{len(self.statements)} statement(s), {self.transactions} transaction(s)"


@contextmanager
def counted(engine: Engine) -> Iterator[Counts]:
    counts = Counts()

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        counts.statements.append(" ".join(text.split())[:120])

    def begin(conn: Any) -> None:
        if not conn.connection.driver_connection.autocommit:
            counts.transactions += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "begin", begin)


@pytest.fixture()
def runtime(pg_database: str) -> Iterator[Runtime]:
    """A worker's runtime: dispatch window 2, released two at a time (the extraction pack)."""
    settings = Settings(
        database_url=pg_database,
        redis_url=redis_database(7),
        dispatch_window=2,
        extraction_pack=2,
    )
    made = Runtime.distributed(
        settings, RecordingQueue(), worker_id="host:counted", judges={MODEL: ScriptedJudge(MODEL)}
    )
    yield made
    made.close()


def _run(runtime: Runtime, count: int) -> tuple[str, list[int]]:
    spec = ingest.build_spec(model=MODEL, known_models=[MODEL])
    rows = [
        {"ground_truth": f"Ada was born in 1815 ({uuid.uuid4()}).", "context": ["Ada: 1815."]}
        for _ in range(count)
    ]
    with runtime.database.session() as session:
        run_id = ingest.create_run(session, runtime.runs, spec, rows, runtime.settings).id
    with runtime.database.session() as session:
        ids = list(session.scalars(select(Item.id).where(Item.run_id == run_id).order_by(Item.idx)))
    return run_id, ids


def _attributed(runtime: Runtime, taken: Taken) -> Callable[[], Ended]:
    def attribute_and_settle() -> Ended:
        ended = runtime.engine.attribute(taken)
        assert isinstance(ended, Ended), ended
        runtime.engine.settle(ended)
        return ended

    return attribute_and_settle


def test_each_stage_end_is_one_statement_without_a_transaction(runtime: Runtime) -> None:
    engine, queue = runtime.engine, runtime.queue
    assert isinstance(queue, RecordingQueue)
    run_id, (first, second, third, fourth) = _run(runtime, 4)
    engine.dispatch(run_id)
    assert queue.items == [first, second]

    with counted(runtime.database.engine) as taking:
        taken = runtime.items.take_group(
            [first, second], runtime.engine.owners.new_token, lambda _: False
        )
    passes = [t for t in taken if isinstance(t, Taken)]
    assert len(passes) == 2
    with counted(runtime.database.engine) as extracting:
        extracted = engine._extract_together(passes)
    continued = [outcome.taken for _, outcome in extracted if isinstance(outcome, Continue)]
    assert len(continued) == 2

    # the first item ends while the second is in flight: nothing is released (a group's worth
    # of places is not free yet) and the run cannot be complete (two items wait, pending)
    with counted(runtime.database.engine) as mid_run:
        ended = _attributed(runtime, continued[0])()
    assert ended.released == ()
    # the second one frees the window: both pending items are released in its place
    with counted(runtime.database.engine) as releasing:
        ended = _attributed(runtime, continued[1])()
    assert sorted(ended.released) == [third, fourth]
    assert sorted(queue.items[2:]) == [third, fourth]

    for item_id in (third, fourth):
        outcome = engine.extract(_taken(runtime, item_id))
        assert isinstance(outcome, Continue)
        queue.attributions.append(outcome.taken)
    with counted(runtime.database.engine) as tail:
        _attributed(runtime, queue.attributions[-2])()
    assert _run_status(runtime, run_id) == RunStatus.RUNNING
    with counted(runtime.database.engine) as last:
        _attributed(runtime, queue.attributions[-1])()
    assert _run_status(runtime, run_id) == RunStatus.COMPLETED

    report = {
        "take_group (2 items)": taking,
        "extraction end (2 items, no cache hit)": extracting,
        "attribution end, mid-run": mid_run,
        "attribution end, releasing 2": releasing,
        "attribution end, tail": tail,
        "attribution end, last item": last,
    }
    for stage, counts in report.items():
        print(f"{stage}: {counts}")
        for line in counts.statements:
            print(f"    {line}")

    # extraction's end: the group's claim cache read once, then one statement for the items
    # of the extraction call (claims, claim cache, usage), no transaction
    assert extracting.transactions == 0
    assert len(extracting.statements) <= 2
    # take: one read and one write for the group
    assert taking.transactions == 0 and len(taking.statements) <= 2
    # attribution's end: the hand-over, then one statement ending the item (its verdicts, the
    # release in its place); the run's completion is looked for only when it can be complete
    for counts in (mid_run, releasing):
        assert counts.transactions == 0 and len(counts.statements) <= 2, counts
    for counts in (tail, last):
        assert counts.transactions == 0 and len(counts.statements) <= 3, counts


def _taken(runtime: Runtime, item_id: int) -> Taken:
    taken = runtime.items.take(item_id, runtime.engine.owners.new_token(), lambda _: False)
    assert isinstance(taken, Taken)
    return taken


def _run_status(runtime: Runtime, run_id: str) -> str:
    with runtime.database.session() as session:
        return session.scalars(select(Run.status).where(Run.id == run_id)).one()


def test_stage_ends_write_what_they_did_before(runtime: Runtime) -> None:
    """The folded statements keep every value: claims once with their verdicts, usage exact,
    the run's counts and its completion once."""
    engine, queue = runtime.engine, runtime.queue
    assert isinstance(queue, RecordingQueue)
    run_id, ids = _run(runtime, 3)
    engine.dispatch(run_id)
    for item_id in ids[:2]:
        assert item_id in queue.items
    outcomes = engine.extract_group(ids[:2])
    passes = [o.taken for o in outcomes if isinstance(o, Continue)]
    for taken in passes:
        ended = engine.attribute(taken)
        assert isinstance(ended, Ended)
        engine.settle(ended)
    # a second copy of extraction's end (its pass no longer owns the item) writes nothing but
    # the usage of its call
    stale = runtime.items.save_claims(passes[0], ["other"], ScriptedJudge(MODEL).usage, False, "k")
    assert not isinstance(stale, Taken)
    assert ids[2] in queue.items
    outcome = engine.extract(_taken(runtime, ids[2]))
    assert isinstance(outcome, Continue)
    ended = engine.attribute(outcome.taken)
    assert isinstance(ended, Ended) and ended.released == ()
    engine.settle(ended)
    # a duplicate attribution of an ended item changes nothing
    again = engine.attribute(outcome.taken)
    assert not isinstance(again, Ended)

    with runtime.database.session() as session:
        items = session.scalars(select(Item).where(Item.run_id == run_id)).all()
        claims = session.scalars(select(Claim).where(Claim.item_id.in_(ids))).all()
        run = session.get(Run, run_id)
        charges = session.scalars(select(UsageCharge)).all()
    assert run is not None and run.status == RunStatus.COMPLETED
    assert [i.status for i in items] == [ItemStatus.SUCCEEDED] * 3
    assert [(i.score, i.claims_total, i.claims_attributed) for i in items] == [(1.0, 1, 1)] * 3
    # the packed extraction call counts on the first item of its pack, the lone one on the
    # third; an attribution call each; the stale pass's extraction call counts too
    print([(i.llm_calls, i.extraction_calls, i.cache_hits, i.deferrals, i.attempts) for i in items])
    assert [i.llm_calls for i in items] == [3, 1, 2]
    assert [i.extraction_calls for i in items] == [2, 0, 1]
    assert [i.attempts for i in items] == [1, 1, 1]
    assert sorted((c.item_id, c.idx, c.verdict) for c in claims) == [(i, 0, "yes") for i in ids]
    # every write that counted usage recorded its charges (so a copy of one kept in the spool,
    # its answer lost, counts nothing more): together they are the items' usage
    for item in items:
        of_item = [c for c in charges if c.item_id == item.id]
        assert of_item, item.id
        assert sum(c.llm_calls for c in of_item) == item.llm_calls
        assert sum(c.prompt_tokens for c in of_item) == item.prompt_tokens


def test_extraction_end_of_a_group_writes_each_pass_once(runtime: Runtime) -> None:
    """Claims saved together: a stale pass's write counts only its usage, a later pass finds
    the claims stored first, a claim cache hit counts as one, and fresh claims are cached."""
    items = runtime.items
    run_id, ids = _run(runtime, 2)
    runtime.engine.dispatch(run_id)
    token = runtime.engine.owners.new_token

    def passes() -> list[Taken]:
        taken = items.take_group(ids, token, lambda _: False)  # its holders taken for dead
        assert all(isinstance(t, Taken) for t in taken)
        return [t for t in taken if isinstance(t, Taken)]

    used = Usage(llm_calls=1, prompt_tokens=10, completion_tokens=5, cost_usd=0.1)
    stale, current = passes(), passes()
    refused = items.save_claims_together(
        [FoundClaims(t, ["stale"], used, False, f"stale-{t.item_id}") for t in stale]
    )
    assert refused == [Skipped(SkipReason.NOT_OWNED)] * 2
    keys = [f"fresh-{uuid.uuid4()}", f"fresh-{uuid.uuid4()}"]
    saved = items.save_claims_together(
        [
            FoundClaims(t, [f"{t.item_id} a", f"{t.item_id} b"], used, False, key)
            for t, key in zip(current, keys, strict=True)
        ]
    )
    assert [s.claims for s in saved if isinstance(s, Taken)] == [(f"{i} a", f"{i} b") for i in ids]
    # a later pass (a redelivered message) whose claims came from the cache keeps those stored
    later = items.save_claims_together(
        [FoundClaims(t, ["other"], Usage(), True, keys[0]) for t in passes()]
    )
    assert [s.claims for s in later if isinstance(s, Taken)] == [(f"{i} a", f"{i} b") for i in ids]

    with runtime.database.session() as session:
        rows = session.scalars(select(Item).where(Item.id.in_(ids)).order_by(Item.id)).all()
        claims = session.scalars(
            select(Claim).where(Claim.item_id.in_(ids)).order_by(Claim.item_id, Claim.idx)
        ).all()
        cached = session.scalars(
            select(ClaimCache.key).where(ClaimCache.key.in_([*keys, *(f"stale-{i}" for i in ids)]))
        ).all()
    assert [(c.item_id, c.idx, c.text) for c in claims] == [
        (i, n, f"{i} {x}") for i in ids for n, x in enumerate("ab")
    ]
    assert sorted(cached) == sorted(keys)
    for row in rows:
        assert (row.llm_calls, row.extraction_calls, row.cache_hits) == (2, 2, 1)
        assert (row.prompt_tokens, row.extraction_completion_tokens) == (20, 10)
        assert row.cost_usd == pytest.approx(0.2) and row.status == ItemStatus.RUNNING


class ThreadedQueue:
    """A work queue worker threads take from, recording every item released."""

    def __init__(self) -> None:
        self.work: queue.Queue[int | Taken] = queue.Queue()
        self.released: list[int] = []

    def send_items(self, item_ids: Sequence[int]) -> None:
        self.released += item_ids
        for item_id in item_ids:
            self.work.put(item_id)

    def send_attributions(self, passes: Sequence[Taken]) -> None:
        for taken in passes:
            self.work.put(taken)

    def send_dispatch(self, run_id: str) -> None:
        pass


def test_threads_ending_items_at_once_release_each_item_once_and_complete_the_run_once(
    pg_database: str,
) -> None:
    """The folded end (release in the item's place, completion skipped while items are
    pending) under 6 threads, a window of 3 released one at a time."""
    work = ThreadedQueue()
    settings = Settings(
        database_url=pg_database,
        redis_url=redis_database(7),
        dispatch_window=3,
        extraction_pack=1,
    )
    runtime = Runtime.distributed(
        settings, work, worker_id="host:threads", judges={MODEL: ScriptedJudge(MODEL)}
    )
    completions: list[str] = []
    runtime.on_completed = lambda database, run_id: completions.append(run_id)
    try:
        run_id, ids = _run(runtime, 30)
        engine = runtime.engine
        engine.dispatch(run_id)
        done = threading.Event()
        errors: list[BaseException] = []

        def worker() -> None:
            while not done.is_set():
                try:
                    message = work.work.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    if isinstance(message, Taken):
                        engine.go_on(message.item_id, engine.attribute(message))
                    else:
                        for outcome in engine.extract_group([message]):
                            engine.go_on(message, outcome)
                except BaseException as exc:  # reported below
                    errors.append(exc)
                if completions:
                    done.set()

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for thread in threads:
            thread.start()
        done.wait(60)
        done.set()
        for thread in threads:
            thread.join()
        assert errors == []
        assert completions == [run_id]
        assert sorted(work.released) == ids  # each released once
        with runtime.database.session() as session:
            statuses = session.scalars(select(Item.status).where(Item.run_id == run_id)).all()
        assert statuses == [ItemStatus.SUCCEEDED] * 30
    finally:
        runtime.close()
