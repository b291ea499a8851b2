"""Two runs compared over the same items (paired by id in the database), and a run sliced by a
metadata field. What is derived from completed runs is kept (recallq.state.kept)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    SQLColumnExpression,
    Text,
    and_,
    case,
    cast,
    func,
    select,
)
from sqlalchemy import text as sql
from sqlalchemy.orm import Session, aliased

from recallq.core import compare as ab
from recallq.core import precision as precision_rules
from recallq.core.groups import GroupedItem, check_field, summarise_groups
from recallq.core.status import ItemStatus
from recallq.runs.item_views import claims_by_item, metadata_fields
from recallq.state import kept
from recallq.state.tables import Claim, Item, Run

_COMPARISON: kept.Kind[dict[str, Any]] = kept.Kind("compare", kept.shape("compare", [2]))
_GROUP_SUMMARY: kept.Kind[dict[str, dict[str, Any]]] = kept.Kind(
    "groups", kept.shape("groups", [2])
)


class IncomparableRuns(ValueError):
    """Two runs whose scores cannot be set against each other (different scales)."""


def _run_brief(run: Run) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "model": run.model, "status": run.status}


def compare_runs(
    session: Session,
    base: Run,
    candidate: Run,
    by: str | None = None,
    top: int = 10,
    pairs: int = 0,
) -> dict[str, Any]:
    """The contract's comparison of `candidate` against `base`, items paired by id, with
    `base_run` and `candidate_run` (id, name, model, status) and, with `pairs`, up to that many
    of the pairs scored in both as `[key, base score, candidate score]` (for a scatter; an even
    sample in key order when there are more). Raises IncomparableRuns for runs of different
    scales.

    The database pairs the items and counts: a 100k-item comparison reads a few hundred rows
    (pairs counted by their two scores, the largest changes, the flipped claims' totals), not
    every item and claim of both runs; a comparison of two completed runs is kept
    (recallq.state.kept)."""
    if base.scale != candidate.scale:
        raise IncomparableRuns(
            f"the runs have different scales ({base.scale:g} and {candidate.scale:g}); "
            "compare runs scored on one scale"
        )

    def compare() -> dict[str, Any]:
        pairing = _pair_runs(session, base.id, candidate.id, scale=base.scale, top=top, by=by)
        result = ab.summarise(pairing, scale=base.scale, by_group=by is not None)
        result["precision"] = _precision(session, base.id, candidate.id, top)
        if pairs:
            paired = _Paired(session, base.id, candidate.id)
            result["pairs"] = _pair_sample(paired, pairing, pairs)
        return result

    result = kept.get_or_compute(
        session, _COMPARISON, [base, candidate], compare, by=by, top=top, pairs=pairs
    )
    return {**result, "base_run": _run_brief(base), "candidate_run": _run_brief(candidate)}


def _pair_runs(
    session: Session,
    base_id: str,
    candidate_id: str,
    *,
    scale: float,
    top: int = 10,
    by: str | None = None,
) -> ab.Pairing:
    """Two runs' items paired by key in the database: the same as recallq.core.compare.pair of
    every item with its claims."""
    if top < 0:
        raise ValueError("top must be 0 or more")
    if session.get_bind().dialect.name == "postgresql":
        # compiling these joins to machine code takes longer (about 70 ms) than running them
        session.execute(sql("SET LOCAL jit = off"))
    paired = _Paired(session, base_id, candidate_id)
    b, c = paired.base, paired.candidate
    # one row per (base score, candidate score[, group]) of the scored pairs, and one with no
    # scores counting the pairs not scored in both
    groups: list[ColumnElement[Any]] = []
    metadata: Callable[[str | None], dict[str, Any] | None] = _no_metadata
    if by is not None:
        base_value, metadata = _metadata_field(session, b, by)
        candidate_value, _ = _metadata_field(session, c, by)
        groups = [base_value, candidate_value]
    columns = [case((paired.scored, column)) for column in (b.score, c.score, *groups)]
    counted: dict[tuple[float, float, str | None], int] = defaultdict(int)
    in_both = unscored = 0
    for n, base_score, candidate_score, *raw in session.execute(
        paired.select(func.count(), *columns).group_by(*columns)
    ):
        in_both += n
        if base_score is None:
            unscored += n
            continue
        group = None if by is None else ab.group_name(metadata(raw[0]), metadata(raw[1]), by)
        counted[base_score, candidate_score, group] += n
    scored = in_both - unscored
    base_items, candidate_items = (
        session.scalar(select(func.count()).select_from(Item).where(Item.run_id == run_id)) or 0
        for run_id in (base_id, candidate_id)
    )
    keyed = None
    if scored <= ab.BOOTSTRAP_MAX_PAIRS:
        rows = session.execute(paired.select(b.key, b.score, c.score).where(paired.scored))
        keyed = sorted((key, base, candidate) for key, base, candidate in rows)
    return ab.Pairing(
        base_only=base_items - in_both,
        candidate_only=candidate_items - in_both,
        unscored=unscored,
        scores=[ab.ScoredPairs(bs, cs, n, g) for (bs, cs, g), n in counted.items()],
        keyed=keyed,
        largest=_largest_changes(session, paired, ab.tolerance(scale), top),
        claims_flipped=_flip_counts(session, paired),
    )


def _precision(session: Session, base_id: str, candidate_id: str, top: int) -> dict[str, Any]:
    """The two runs' context precision, paired by item id (recallq.core.precision.compare)."""
    paired = _Paired(session, base_id, candidate_id)
    b, c = paired.base, paired.candidate
    rows = session.execute(
        paired.select(b.key, b.context_precision, c.context_precision).where(
            paired.scored, b.context_precision.is_not(None), c.context_precision.is_not(None)
        )
    )
    return precision_rules.compare([(key, bp, cp) for key, bp, cp in rows], top)


class _Paired:
    """Items of two runs joined on their key: `base` and `candidate` are the two items."""

    def __init__(self, session: Session, base_id: str, candidate_id: str) -> None:
        self.session = session
        self.base, self.candidate = aliased(Item), aliased(Item)
        b, c = self.base, self.candidate
        self.join = and_(c.run_id == candidate_id, c.key == b.key)
        self.base_id = base_id
        self.scored = and_(
            b.status == ItemStatus.SUCCEEDED,
            c.status == ItemStatus.SUCCEEDED,
            b.score.is_not(None),
            c.score.is_not(None),
        )

    def select(self, *columns: Any) -> Select[Any]:
        return (
            select(*columns)
            .select_from(self.base)
            .join(self.candidate, self.join)
            .where(self.base.run_id == self.base_id)
        )

    def in_key_order(self) -> SQLColumnExpression[str]:
        """The base item's key in code point order (Python's order of strings): Postgres
        sorts by its collation unless told to compare bytes."""
        if self.session.get_bind().dialect.name == "postgresql":
            return self.base.key.collate("C")
        return self.base.key


def _largest_changes(
    session: Session, paired: _Paired, tolerance: float, top: int
) -> list[ab.Change]:
    if top == 0:
        return []
    b, c = paired.base, paired.candidate
    size = func.abs(c.score - b.score)
    rows = session.execute(
        paired.select(b.id, c.id, b.key, b.score, c.score)
        .where(paired.scored, size > tolerance)
        .order_by(size.desc(), paired.in_key_order())
        .limit(top)
    ).all()
    claims = claims_by_item(session, [item_id for row in rows for item_id in row[:2]])

    def verdicts(item_id: int) -> list[tuple[str, str]]:
        return [(cl.text, cl.verdict) for cl in claims[item_id] if cl.verdict is not None]

    return [
        ab.Change(key, base, candidate, ab.flipped_claims(verdicts(bid), verdicts(cid)))
        for bid, cid, key, base, candidate in rows
    ]


def _flip_counts(session: Session, paired: _Paired) -> dict[str, int]:
    """Claims of the same text in both items of a scored pair whose verdict flipped: the
    database joins the claims on their text and counts, per direction."""
    b, c = paired.base, paired.candidate
    base_claim, candidate_claim = aliased(Claim), aliased(Claim)
    verdicts = ("yes", "no")
    no_to_yes, yes_to_no = session.execute(
        paired.select(
            func.count().filter(base_claim.verdict == "no"),
            func.count().filter(base_claim.verdict == "yes"),
        )
        .join(base_claim, base_claim.item_id == b.id)
        .join(
            candidate_claim,
            and_(candidate_claim.item_id == c.id, candidate_claim.text == base_claim.text),
        )
        # the verdicts' inequality as a filter, not a join condition: with it in the join,
        # Postgres misjudges how few claims it matches and joins every claim of both runs
        # on its text before pairing the items (1 s instead of 0.3 s)
        .where(
            paired.scored,
            base_claim.verdict.in_(verdicts),
            candidate_claim.verdict.in_(verdicts),
            candidate_claim.verdict != base_claim.verdict,
        )
    ).one()
    return {"no_to_yes": no_to_yes, "yes_to_no": yes_to_no}


def _pair_sample(
    paired: _Paired, pairing: ab.Pairing, limit: int
) -> list[tuple[str, float, float]]:
    """Up to `limit` of the scored pairs, an even sample in key order (ab.even_positions)."""
    if pairing.keyed is not None and len(pairing.keyed) <= limit:
        return sorted(pairing.keyed)
    b, c = paired.base, paired.candidate
    numbered = (
        paired.select(
            b.key,
            b.score,
            c.score.label("candidate_score"),
            (func.row_number().over(order_by=paired.in_key_order()) - 1).label("position"),
        )
        .where(paired.scored)
        .subquery()
    )
    total = sum(s.count for s in pairing.scores)
    positions = ab.even_positions(total, limit)
    rows = paired.session.execute(
        select(numbered.c.key, numbered.c.score, numbered.c.candidate_score)
        .where(numbered.c.position.in_(positions))
        .order_by(numbered.c.position)
    )
    return [tuple(row) for row in rows]


def group_summary(session: Session, run_id: str, by: str) -> dict[str, dict[str, Any]]:
    """The run's items by the value of metadata field `by` (recallq.core.groups). The database
    counts alike items (same field value, status and score: scores are rounded, so a run has
    few distinct ones) and recallq.core.groups names and sums them, so a 100k-item run moves a few
    hundred rows, not 100k. A completed run's summary is kept (recallq.state.kept)."""

    def summarise() -> dict[str, dict[str, Any]]:
        value, metadata = _metadata_field(session, Item, by)
        rows = session.execute(
            select(value, Item.status, Item.score, Item.context_precision, func.count())
            .where(Item.run_id == run_id)
            .group_by(value, Item.status, Item.score, Item.context_precision)
        )
        alike = (
            GroupedItem(status, score, metadata(raw), n, precision)
            for raw, status, score, precision, n in rows
        )
        return summarise_groups(alike, by)

    run = session.get(Run, run_id)
    if run is None:
        groups = summarise()
    else:
        groups = kept.get_or_compute(session, _GROUP_SUMMARY, [run], summarise, by=by)
    check_field(groups, by, lambda: metadata_fields(session, run_id))
    return groups


def _no_metadata(_raw: str | None) -> dict[str, Any] | None:
    return None


def _metadata_field(
    session: Session, item: Any, by: str
) -> tuple[ColumnElement[Any], Callable[[str | None], dict[str, Any] | None]]:
    """What items (`item`: Item or an alias of it) alike in metadata field `by` share, as a
    column, and the metadata that
    recallq.core.groups reads back from its value. On Postgres that is the field's JSON text (NULL:
    no such field); SQLite's JSON functions do not tell a missing field from a null one, so
    there it is the whole metadata."""
    if session.get_bind().dialect.name == "postgresql":

        def field(raw: str | None) -> dict[str, Any] | None:
            return None if raw is None else {by: json.loads(raw)}

        return cast(item.item_metadata[by], Text), field

    def whole(raw: str | None) -> dict[str, Any] | None:
        return None if raw is None else json.loads(raw)

    return cast(item.item_metadata, Text), whole
