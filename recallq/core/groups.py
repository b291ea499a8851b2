"""Slicing a run by a metadata field (``--by category``): pure, no I/O.

An item's group is the value of one field of its metadata: a string as it is, any other value
as JSON text (so ``3`` and ``"3"`` are different groups, and every group name is a string),
and :data:`MISSING_GROUP` when the item's metadata lacks the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from recallq.core.status import ItemStatus

MISSING_GROUP = "(missing)"
_DECIMALS = 4


class UnknownField(ValueError):
    """A run sliced by a metadata field none of its items has (a typo, most often)."""


def check_field(groups: Mapping[str, Any], by: str, fields: Callable[[], Iterable[str]]) -> None:
    """The one rule for every `--by`/`?by=`: slicing by a field no item has is an error that
    lists the fields the items have (`fields`, asked only then), not one "(missing)" group."""
    if not groups or set(groups) != {MISSING_GROUP}:
        return
    have = sorted(set(fields()))
    listed = f"the items' fields: {', '.join(have)}" if have else "the items have no metadata"
    raise UnknownField(f"no item has the metadata field {by!r}; {listed}")


def group_value(metadata: Mapping[str, Any] | None, by: str) -> str | None:
    """The group an item's metadata puts it in, or None when it lacks the field."""
    if not metadata or by not in metadata:
        return None
    value = metadata[by]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class GroupedItem:
    """What a group summary needs of one item, or of `count` items alike."""

    status: str
    score: float | None
    metadata: Mapping[str, Any] | None
    count: int = 1
    context_precision: float | None = None


def summarise_groups(items: Iterable[GroupedItem], by: str) -> dict[str, dict[str, Any]]:
    """Per group, in name order: ``items``, ``scored_items``, ``failed`` and ``mean_score`` (of
    the scored items, rounded to 4 decimals; None when none was scored), and
    ``mean_context_precision`` with its 95% interval ``context_precision_ci95`` (of the scored
    items with a context precision)."""
    groups: dict[str, dict[str, Any]] = {}
    scores: dict[str, list[float]] = {}
    precisions: dict[str, list[float]] = {}
    for item in items:
        name = group_value(item.metadata, by) or MISSING_GROUP
        group = groups.setdefault(name, {"items": 0, "scored_items": 0, "failed": 0})
        group["items"] += item.count
        if item.status == ItemStatus.SUCCEEDED and item.score is not None:
            group["scored_items"] += item.count
            scores.setdefault(name, []).extend([item.score] * item.count)
            if item.context_precision is not None:
                values = [item.context_precision] * item.count
                precisions.setdefault(name, []).extend(values)
        elif item.status == ItemStatus.FAILED:
            group["failed"] += item.count
    return {
        name: {
            **groups[name],
            "mean_score": _mean(scores.get(name, [])),
            "mean_context_precision": _mean(precisions.get(name, [])),
            "context_precision_ci95": _interval(precisions.get(name, [])),
        }
        for name in sorted(groups)
    }


def _interval(values: list[float]) -> list[float] | None:
    """Normal 95% interval of the mean (as recallq.core.compare.mean_interval), unclipped."""
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(max(0.0, math.fsum(v * v for v in values) / len(values) - mean * mean))
    half = 1.959964 * spread / math.sqrt(len(values))
    return [round(max(0.0, mean - half), _DECIMALS) + 0.0, round(mean + half, _DECIMALS) + 0.0]


def _mean(values: list[float]) -> float | None:
    if not values:
        return None
    return round(math.fsum(values) / len(values), _DECIMALS) + 0.0
