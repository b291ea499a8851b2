"""A worker reads which items a task message is about by argument name, whether the message
carries them by name (what recallq.execution.celery_queue sends) or by position (messages of an
older sender still in the queue)."""

from __future__ import annotations

from recallq.execution.celery_queue import items_named
from worker.tasks import attribute, dispatch, extract_group, items_of


def test_items_by_name_or_by_position() -> None:
    assert items_of(attribute.run, [], {"message": None, "item_id": 5}) == [5]
    assert items_of(attribute.run, [None, 5], {}) == [5]
    assert items_of(extract_group.run, [], {"item_ids": [1, 2]}) == [1, 2]
    assert items_of(extract_group.run, [[1, 2]], {}) == [1, 2]
    assert items_of(dispatch.run, [], {"run_id": "r"}) == []  # a run, no item


def test_a_malformed_message_holds_no_item() -> None:
    assert items_of(attribute.run, [1, 2, 3], {}) == []  # too many arguments
    assert items_named({"item_ids": "12"}) == []
    assert items_named({"item_ids": [1, "2", None]}) == [1]
