"""The agreement of a run's judge with its human labels (recallq.core.agreement over the
stored labels), kept until the labels change; two judges against each other; the comparison
of two runs corrected by their labels."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from recallq.core import agreement
from recallq.core.agreement import JudgeTotals, LabelledClaim, LabelledItem
from recallq.core.groups import MISSING_GROUP, group_value
from recallq.core.status import ItemStatus
from recallq.labels.sampling import sample_of
from recallq.labels.store import MAX_AGREEMENT_GROUPS, LabelError
from recallq.state import kept
from recallq.state.tables import Claim, ClaimLabel, Item, LabelSample, Run


def _labelled_items(session: Session, run_id: str, by: str | None) -> list[LabelledItem]:
    rows = session.execute(
        select(Item, Claim.idx, Claim.text, Claim.verdict, ClaimLabel.verdict)
        .join(Claim, Claim.item_id == Item.id)
        .join(
            ClaimLabel, (ClaimLabel.item_id == Claim.item_id) & (ClaimLabel.claim_idx == Claim.idx)
        )
        .where(ClaimLabel.run_id == run_id, Claim.verdict.is_not(None))
        .order_by(Item.idx, Claim.idx)
    )
    grouped: dict[int, tuple[Item, list[LabelledClaim]]] = {}
    for item, index, text, judge, human in rows:
        grouped.setdefault(item.id, (item, []))[1].append(
            LabelledClaim(index, text, judge or "", human)
        )
    return [
        LabelledItem(
            item.key,
            item.claims_total or 0,
            item.claims_attributed or 0,
            claims,
            _group(item.item_metadata, by),
        )
        for item, claims in grouped.values()
    ]


def _group(metadata: dict[str, Any] | None, by: str | None) -> str | None:
    if by is None:
        return None
    return group_value(metadata, by) or MISSING_GROUP


def _judge_totals(session: Session, run: Run, by: str | None) -> dict[str | None, JudgeTotals]:
    """The judge's sums over the run's scored items, per group when `by` is given. Alike
    items (same claim counts) are counted by the database, so a run moves few rows. Scores are
    the stored ones, rounded as reported, so the judge's mean is the run summary's."""
    columns: list[Any] = [Item.claims_total, Item.claims_attributed, Item.score, func.count()]
    query = select(*columns).where(Item.run_id == run.id, Item.status == ItemStatus.SUCCEEDED)
    rows: list[tuple[str | None, Any, Any, Any, Any]]
    if by is None:
        grouped = session.execute(query.group_by(*columns[:3]))
        rows = [(None, t, a, score, n) for t, a, score, n in grouped]
    else:
        per_item = session.execute(
            select(Item.item_metadata, *columns[:3]).where(
                Item.run_id == run.id, Item.status == ItemStatus.SUCCEEDED
            )
        )
        rows = [(_group(m, by), t, a, score, 1) for m, t, a, score in per_item]
    sums: dict[str | None, list[float]] = defaultdict(lambda: [0.0] * 9)
    for group, total, attributed, stored, count in rows:
        total, attributed = total or 0, attributed or 0
        score = float(stored) if stored is not None else 0.0
        s = sums[group]
        for position, value in enumerate(
            (
                1,
                score,
                score * score,
                total,
                attributed,
                attributed * attributed,
                total * total,
                attributed * total,
                1 if total else 0,
            )
        ):
            s[position] += value * count
    return {
        group: JudgeTotals(int(s[0]), s[1], s[2], int(s[3]), int(s[4]), s[5], s[6], s[7], int(s[8]))
        for group, s in sums.items()
    }


#: A completed run's agreement, kept until its labels or its sample change: its bootstraps
#: cost about 0.5 ms of CPU per labelled item, so 10,000 labelled items took 5.5 s a request.
_AGREEMENT: kept.Kind[dict[str, Any]] = kept.Kind("agreement", kept.shape("agreement", [1]))


def agreement_view(
    session: Session, run: Run, by: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """The contract's agreement body for a run's labels. `sample` is "random" when a sample
    was drawn and at least one of its items carries labels: the correction then uses those
    items only (labels elsewhere count in the agreement, not in the correction)."""
    return kept.get_or_compute(
        session,
        _AGREEMENT,
        [run],
        lambda: _agreement_view(session, run, by, seed),
        by=by,
        seed=seed,
        labels=_labels_version(session, run.id),
    )


def _labels_version(session: Session, run_id: str) -> list[Any]:
    """What changes whenever a label of the run is set, changed or cleared, or its sample is
    drawn again: a part of the kept agreement's key."""
    yes = case((ClaimLabel.verdict == "yes", ClaimLabel.id), else_=0)
    labels = session.execute(
        select(
            func.count(ClaimLabel.id),
            func.coalesce(func.sum(ClaimLabel.id), 0),
            func.coalesce(func.sum(yes), 0),
            func.max(ClaimLabel.labelled_at),
        ).where(ClaimLabel.run_id == run_id)
    ).one()
    drawn = session.execute(
        select(LabelSample.seed, LabelSample.drawn_at).where(LabelSample.run_id == run_id)
    ).one_or_none()
    return [str(value) for value in (*labels, *(drawn or ()))]


def _agreement_view(session: Session, run: Run, by: str | None, seed: int) -> dict[str, Any]:
    items = _labelled_items(session, run.id, by)
    drawn = sample_of(session, run.id)
    in_sample = set(drawn.item_keys) if drawn is not None else set()
    sampled = [item for item in items if item.key in in_sample]
    totals = _judge_totals(session, run, by)
    names = sorted({g for g in totals if g is not None} | {i.group for i in items if i.group})
    if len(names) > MAX_AGREEMENT_GROUPS:  # before any bootstrap
        raise LabelError(
            f"metadata field {str(by)[:80]!r} has {len(names)} values; agreement is split by "
            f"a field of at most {MAX_AGREEMENT_GROUPS}"
        )
    body = _body(items, sampled, totals.get(None) if by is None else _all(totals), run, seed)
    if by is not None:
        body["by_group"] = {
            name: _body(
                [i for i in items if i.group == name],
                [i for i in sampled if i.group == name],
                totals.get(name),
                run,
                seed,
            )
            for name in names
        }
    return body


def _all(totals: dict[str | None, JudgeTotals]) -> JudgeTotals:
    parts = list(totals.values())
    return JudgeTotals(
        *(sum(getattr(t, f) for t in parts) for f in JudgeTotals.__dataclass_fields__)
    )


def _body(
    items: Sequence[LabelledItem],
    sampled: Sequence[LabelledItem],
    totals: JudgeTotals | None,
    run: Run,
    seed: int,
) -> dict[str, Any]:
    body = agreement.summarise(items, seed=seed)
    body["sample"] = "random" if sampled else "chosen"
    body["outside_sample"] = len(items) - len(sampled)
    body["corrected"] = (
        agreement.corrected(totals, sampled, scale=run.scale, seed=seed)
        if sampled and totals is not None
        else None
    )
    return body


def _random_sample(session: Session, run: Run) -> tuple[JudgeTotals, list[LabelledItem]] | None:
    """The judge's totals and the labelled items of the run's drawn sample, if any."""
    drawn = sample_of(session, run.id)
    totals = _judge_totals(session, run, None).get(None)
    if drawn is None or totals is None:
        return None
    in_sample = set(drawn.item_keys)
    return totals, [i for i in _labelled_items(session, run.id, None) if i.key in in_sample]


def corrected_comparison(
    session: Session, base: Run, candidate: Run, comparison: dict[str, Any], seed: int = 0
) -> dict[str, Any] | None:
    """The comparison's mean difference corrected by both runs' labels of random samples
    (agreement.corrected_difference); None unless both runs have enough of them. The judge
    part's standard error is read off the comparison's paired 95% interval."""
    low, high = comparison.get("ci95") or (None, None)
    difference = comparison.get("mean_difference")
    if difference is None or low is None or high is None:
        return None
    base_found = _random_sample(session, base)
    candidate_found = _random_sample(session, candidate)
    if base_found is None or candidate_found is None:
        return None
    (base_totals, base_sample), (candidate_totals, candidate_sample) = base_found, candidate_found
    return agreement.corrected_difference(
        difference,
        (high - low) / (2 * agreement.Z95),
        agreement.score_corrections(base_totals, base_sample, scale=base.scale),
        agreement.score_corrections(candidate_totals, candidate_sample, scale=candidate.scale),
        scale=candidate.scale,
        seed=seed,
    )


def against_view(session: Session, run: Run, other: Run, seed: int = 0) -> dict[str, Any]:
    """Two judges on the same claims: the run's verdicts against the other run's, paired by
    item id and claim index where the claim's text is the same (`claims_from` runs share
    them). The other run's verdict takes the person's place in the statistics."""
    rows = session.execute(
        select(Item.key, Claim.idx, Claim.text, Claim.verdict)
        .join(Claim, Claim.item_id == Item.id)
        .where(Item.run_id == other.id, Claim.verdict.is_not(None))
    )
    reference = {(key, idx): (text, verdict or "") for key, idx, text, verdict in rows}
    mine = session.execute(
        select(Item.key, Item.claims_total, Item.claims_attributed, Claim.idx, Claim.text)
        .add_columns(Claim.verdict)
        .join(Claim, Claim.item_id == Item.id)
        .where(Item.run_id == run.id, Claim.verdict.is_not(None))
        .order_by(Item.idx, Claim.idx)
    )
    grouped: dict[str, tuple[int, int, list[LabelledClaim]]] = {}
    for key, total, attributed, idx, text, verdict in mine:
        match = reference.get((key, idx))
        if match is None or match[0] != text:
            continue
        grouped.setdefault(key, (total or 0, attributed or 0, []))[2].append(
            LabelledClaim(idx, text, verdict or "", match[1])
        )
    items = [LabelledItem(key, t, a, claims) for key, (t, a, claims) in grouped.items()]
    body = agreement.summarise(items, seed=seed)
    flips = agreement.flip_rate(items, seed=seed)
    body["against"] = other.id
    body["flip_rate"] = flips["rate"]
    body["flip_rate_ci95"] = flips["rate_ci95"]
    body["flipped"] = body.pop("disagreements")
    return body
