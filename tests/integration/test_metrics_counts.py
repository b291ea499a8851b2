"""The item counters count exactly the moves the database made: the store's every path (the
drive of tests/integration/test_transitions.py, whose trigger records each row's move), and
the items ended among them."""

from __future__ import annotations

from functools import partial

from prometheus_client import REGISTRY
from sqlalchemy import event, text

from recallq.core.status import ITEM_ENDED, ItemStatus
from recallq.execution import work
from recallq.execution.runtime import Runtime
from recallq.observability import gauges as metrics_state
from tests.integration import test_transitions as transitions

runtime = transitions.runtime  # the same runtime: SQLite with the moves trigger


def _counter(name: str, label: str, value: str) -> float:
    return REGISTRY.get_sample_value(name, {label: value}) or 0.0


def test_item_counters_equal_the_moves_the_database_recorded(runtime: Runtime) -> None:
    statuses = [str(s) for s in ItemStatus]
    moved_before = {s: _counter("recallq_item_transitions_total", "status", s) for s in statuses}
    ended_before = {s: _counter("recallq_items_ended_total", "outcome", s) for s in statuses}

    transitions.test_every_move_is_in_the_table_and_every_move_in_the_table_is_made(runtime)

    with runtime.database.transaction() as conn:
        rows = conn.execute(
            text("SELECT new, count(*) FROM moves WHERE tbl = 'items' GROUP BY new")
        ).all()
    recorded = {str(new): float(count) for new, count in rows}
    moved = {
        s: _counter("recallq_item_transitions_total", "status", s) - moved_before[s]
        for s in statuses
    }
    assert {s: n for s, n in moved.items() if n} == recorded
    ended = {
        s: _counter("recallq_items_ended_total", "outcome", s) - ended_before[s] for s in statuses
    }
    assert {s: n for s, n in ended.items() if n} == {
        s: n for s, n in recorded.items() if s in ITEM_ENDED
    }
    assert set(recorded) >= {"succeeded", "failed", "cancelled"}


def test_work_waiting_is_one_read_per_cache_period(runtime: Runtime) -> None:
    statements: list[str] = []
    event.listen(
        runtime.database.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *args: statements.append(statement.split()[0]),
    )
    now = [1000.0]
    collector = metrics_state.WorkCollector(
        partial(work.read_work, runtime.database),
        lambda: [transitions.MODEL, "other-model"],
        clock=lambda: now[0],
    )
    assert _gauges(collector)["recallq_items_waiting"] == {transitions.MODEL: 0, "other-model": 0}
    run_id, _ = transitions._run(runtime, "a", "b", "c")  # a dispatch window of 2
    runtime.engine.dispatch(run_id)
    now[0] += metrics_state.CACHE_SECONDS - 0.1
    read = len(statements)
    assert _gauges(collector)["recallq_items_waiting"][transitions.MODEL] == 0  # cached
    assert len(statements) == read  # nothing read
    now[0] += 0.1
    gauges = _gauges(collector)
    assert gauges["recallq_items_waiting"] == {transitions.MODEL: 2, "other-model": 0}
    assert gauges["recallq_runs_active"][transitions.MODEL] == 1
    # one grouped read each: in flight, active runs, pending batches
    assert statements[read:].count("SELECT") == 3
    assert runtime.runs.cancel(run_id, "default")
    now[0] += metrics_state.CACHE_SECONDS
    assert _gauges(collector)["recallq_items_waiting"][transitions.MODEL] == 0


def _gauges(collector: metrics_state.WorkCollector) -> dict[str, dict[str, float]]:
    return {
        family.name: {sample.labels["model"]: sample.value for sample in family.samples}
        for family in collector.collect()
    }
