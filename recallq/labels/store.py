"""Human labels of claims, one row per claim (a label never changes the judge's verdict,
claims.verdict): set, clear, read and export them, and the labelling page's walk through a
sample. Every function takes the caller's session; the caller (recallq.labels.service) has
already checked that the run belongs to its project."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from recallq.core.inputs import text_problem
from recallq.state.tables import Claim, ClaimLabel, Item, Run, utcnow

VERDICTS = ("yes", "no")
MAX_NOTE_CHARS = 2_000
MAX_SAMPLE = 10_000  # items in one labelling sample (each is a stored id)
MAX_SEED = 2**53 - 1  # a sample's seed: exact in any JSON client, a float's too (FastAPI's schema)
MAX_IMPORT_BYTES = 10 * 1024 * 1024
MAX_IMPORT_ROWS = 100_000
MAX_PROBLEMS = 200  # problems listed in an import's answer (all are counted)
# values of a `by=` field the agreement is split by: each is a bootstrap of its own (about
# 3 ms), so a field with a value per item (an id) would cost minutes of CPU per request
MAX_AGREEMENT_GROUPS = 100
BIND_CHUNK = 10_000  # ids per IN (...): a statement binds at most 65,535 values (psycopg)
SAMPLE_COLUMNS = [
    "item_id",
    "claim_index",
    "claim",
    "context",
    "judge_verdict",
    "judge_reason",
    "human_verdict",
    "note",
]
EXPORT_COLUMNS = [
    "item_id",
    "claim_index",
    "claim",
    "judge_verdict",
    "verdict",
    "note",
    "labelled_by",
    "labelled_at",
]


class LabelError(ValueError):
    """A label request that cannot be done: `status` says how (404 nothing there, 422 bad)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def check_verdict(value: Any) -> str:
    """A human verdict, "yes" or "no" (case and surrounding spaces aside)."""
    verdict = value.strip().lower() if isinstance(value, str) else None
    if verdict not in VERDICTS:
        raise LabelError(f"verdict must be yes or no, not {str(value)[:40]!r}")
    return verdict


def check_note(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise LabelError("note must be text")
    if len(value) > MAX_NOTE_CHARS:
        raise LabelError(f"note is longer than {MAX_NOTE_CHARS} characters")
    problem = text_problem(value)
    if problem is not None:
        raise LabelError(f"note contains {problem}")
    return value


def _claim(session: Session, run_id: str, item_key: str, claim_index: int) -> tuple[Item, Claim]:
    item = session.scalars(
        select(Item).where(Item.run_id == run_id, Item.key == item_key)
    ).one_or_none()
    if item is None:
        raise LabelError(f"item {item_key[:80]} not found", 404)
    claim = session.scalars(
        select(Claim).where(Claim.item_id == item.id, Claim.idx == claim_index)
    ).one_or_none()
    if claim is None:
        raise LabelError(f"claim {claim_index} of item {item_key[:80]} not found", 404)
    return item, claim


def set_label(
    session: Session,
    run_id: str,
    item_key: str,
    claim_index: int,
    verdict: str,
    note: str | None,
    who: str | None,
) -> dict[str, Any]:
    """Record (or replace) a person's verdict on one claim; returns the label."""
    verdict, note = check_verdict(verdict), check_note(note)
    item, claim = _claim(session, run_id, item_key, claim_index)
    store_label(session, run_id, item.id, claim.idx, verdict, note, who)
    return label_view(item.key, claim, verdict, note, who)


def store_label(
    session: Session,
    run_id: str,
    item_id: int,
    claim_index: int,
    verdict: str,
    note: str | None,
    who: str | None,
) -> None:
    label = session.scalars(
        select(ClaimLabel).where(ClaimLabel.item_id == item_id, ClaimLabel.claim_idx == claim_index)
    ).one_or_none()
    if label is None:
        session.add(
            ClaimLabel(
                run_id=run_id,
                item_id=item_id,
                claim_idx=claim_index,
                verdict=verdict,
                note=note,
                labelled_by=who,
                labelled_at=utcnow(),
            )
        )
    else:
        label.verdict, label.note, label.labelled_by = verdict, note, who
        label.labelled_at = utcnow()
    session.flush()


def clear_label(session: Session, run_id: str, item_key: str, claim_index: int) -> bool:
    """Remove a claim's label; False when it had none."""
    item, claim = _claim(session, run_id, item_key, claim_index)
    result = session.execute(
        delete(ClaimLabel).where(ClaimLabel.item_id == item.id, ClaimLabel.claim_idx == claim.idx)
    )
    return bool(getattr(result, "rowcount", 0))


def label_view(
    item_key: str,
    claim: Claim,
    verdict: str,
    note: str | None,
    who: str | None,
    when: Any = None,
) -> dict[str, Any]:
    return {
        "item_id": item_key,
        "claim_index": claim.idx,
        "claim": claim.text,
        "judge_verdict": claim.verdict,
        "verdict": verdict,
        "note": note,
        "labelled_by": who,
        "labelled_at": (when or utcnow()).isoformat(),
    }


def list_labels(
    session: Session, run_id: str, after: tuple[int, int] | None = None, limit: int | None = None
) -> tuple[list[dict[str, Any]], tuple[int, int] | None]:
    """The run's labels in item order then claim order: `limit` of them after the position
    `after` (item index, claim index), and the position of the last one (None when none)."""
    query = (
        select(Item.idx, Item.key, Claim, ClaimLabel)
        .join(Item, Item.id == ClaimLabel.item_id)
        .join(Claim, (Claim.item_id == ClaimLabel.item_id) & (Claim.idx == ClaimLabel.claim_idx))
        .where(ClaimLabel.run_id == run_id)
        .order_by(Item.idx, ClaimLabel.claim_idx)
    )
    if after is not None:
        query = query.where(tuple_(Item.idx, ClaimLabel.claim_idx) > tuple_(*after))
    if limit is not None:
        query = query.limit(limit)
    rows = list(session.execute(query))
    found = [
        label_view(key, claim, label.verdict, label.note, label.labelled_by, label.labelled_at)
        for _, key, claim, label in rows
    ]
    return found, ((rows[-1][0], rows[-1][3].claim_idx) if rows else None)


def export_lines(
    labels: Iterable[dict[str, Any]], format: str, header: bool = True
) -> Iterator[str]:
    """The labels as JSONL or CSV text lines (`header`: the CSV's first line)."""
    if format == "jsonl":
        for label in labels:
            yield json.dumps(label, ensure_ascii=False) + "\n"
        return
    from recallq.core.export import spreadsheet_safe

    if header:
        yield csv_line(EXPORT_COLUMNS)
    for label in labels:
        yield csv_line([spreadsheet_safe(label[c]) for c in EXPORT_COLUMNS])


def csv_line(values: Sequence[Any]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(["" if v is None else v for v in values])
    return out.getvalue()


def has_labels(session: Session, run_id: str) -> bool:
    found = session.scalars(select(ClaimLabel.id).where(ClaimLabel.run_id == run_id).limit(1))
    return found.first() is not None


def item_labels(session: Session, run_id: str, item_key: str) -> dict[int, dict[str, Any]]:
    """An item's labels by claim index (the item page)."""
    rows = session.execute(
        select(ClaimLabel)
        .join(Item, Item.id == ClaimLabel.item_id)
        .where(Item.run_id == run_id, Item.key == item_key)
    )
    return {label.claim_idx: {"verdict": label.verdict, "note": label.note} for (label,) in rows}


@dataclass(frozen=True)
class Step:
    """One claim of the sample, in the order the labelling page walks them."""

    item_key: str
    item_position: int  # of the sample's items, from 0
    claim_index: int
    claims_of_item: int
    label: str | None


def walk(session: Session, run: Run, keys: Sequence[str]) -> list[Step]:
    """Every claim of the sample's items, items in the order drawn, with its label if any."""
    order = {key: position for position, key in enumerate(keys)}
    rows = session.execute(
        select(Item.key, Claim.idx, ClaimLabel.verdict)
        .join(Claim, Claim.item_id == Item.id)
        .outerjoin(
            ClaimLabel, (ClaimLabel.item_id == Claim.item_id) & (ClaimLabel.claim_idx == Claim.idx)
        )
        .where(Item.run_id == run.id, Item.key.in_(list(keys)))
    )
    found = sorted(rows, key=lambda r: (order[r[0]], r[1]))
    sizes: dict[str, int] = defaultdict(int)
    for key, _, _ in found:
        sizes[key] += 1
    return [Step(key, order[key], idx, sizes[key], verdict) for key, idx, verdict in found]
