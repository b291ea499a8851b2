"""Edges of context precision found by probing it as a user and as an attacker: ids that leave
nothing to be relevant to, ids read from CSV cells, and the one message for bad ids in every
entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

import recallq
from recallq.core import precision

ITEM = {"id": "q", "ground_truth": "Einstein was born in 1879.", "context": ["Born in 1879."]}


def test_no_reference_id_leaves_id_precision_null_like_no_ground_truth() -> None:
    # nothing is relevant to an item without reference ids: null (never a 0 that drags the
    # mean down), as context_precision is without a ground truth
    assert precision.id_scores(["a", "b"], [], 1.0) == (None, None)
    assert precision.id_scores([], [], 1.0) == (None, None)
    # a reference id and nothing retrieved is a miss: recall 0, precision null (no context)
    assert precision.id_scores([], ["a"], 10.0) == (None, 0.0)


@pytest.mark.parametrize(
    "ids",
    ["r1", {"r1": 1}, [1.5], [None], [["r1"]], [True]],
    ids=["string", "object", "float", "null", "nested", "boolean"],
)
def test_bad_ids_are_the_one_message(ids: object, tmp_path: Path) -> None:
    bad = {**ITEM, "retrieved_context_ids": ids, "reference_context_ids": ["r1"]}
    with pytest.raises(ValueError) as raised:
        recallq.evaluate([bad], database_url=f"sqlite:///{tmp_path / 'r.db'}", progress=False)
    assert str(raised.value) == (
        "item 0: retrieved_context_ids must be a list of ids (strings or integers)"
    )
