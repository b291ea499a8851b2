"""The item counters count exactly the moves the database made: the store's every path (the
drive of tests/integration/test_transitions.py, whose trigger records each row's move), and
the items ended among them."""

from __future__ import annotations

from prometheus_client import REGISTRY
from sqlalchemy import text

from recallq.runtime import Runtime
from recallq.status import ITEM_ENDED, ItemStatus
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
