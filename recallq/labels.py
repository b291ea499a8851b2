"""Human labels of claims: set, clear, list, import; the random sample drawn for labelling;
and the agreement view (recallq.agreement) read from them. Postgres and SQLite alike.

    draw_sample(run, N, seed)  -> N random items with claims, stored with the seed
    set_label / clear_label    -> one claim's human verdict (who: the key's id; when)
    parse_file + import_rows   -> a CSV or JSONL file of labels, problems reported by line
    agreement_view(run, by=)   -> the contract's agreement body, `corrected` for a sample

A label never changes the judge's verdict (claims.verdict): it is a row of its own, one per
claim. Every function takes the caller's session; the caller has already checked that the
run belongs to its project.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, delete, func, select, tuple_
from sqlalchemy.orm import Session

from recallq import agreement, kept
from recallq.agreement import JudgeTotals, LabelledClaim, LabelledItem
from recallq.groups import MISSING_GROUP, group_value
from recallq.inputs import text_problem
from recallq.status import ItemStatus
from recallq.tables import Claim, ClaimLabel, Item, LabelSample, Run, utcnow

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


# --- one label -------------------------------------------------------------------------------


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
    _store(session, run_id, item.id, claim.idx, verdict, note, who)
    return label_view(item.key, claim, verdict, note, who)


def _store(
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
    from recallq.export import spreadsheet_safe

    if header:
        yield _csv_line(EXPORT_COLUMNS)
    for label in labels:
        yield _csv_line([spreadsheet_safe(label[c]) for c in EXPORT_COLUMNS])


def _csv_line(values: Sequence[Any]) -> str:
    out = io.StringIO()
    csv.writer(out).writerow(["" if v is None else v for v in values])
    return out.getvalue()


# --- import ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One row of a labels file, by its line number (the header is line 1 of a CSV)."""

    line: int
    fields: dict[str, Any]


def parse_file(data: bytes, format: str | None = None) -> tuple[list[Row], list[dict[str, Any]]]:
    """The rows of a CSV or JSONL labels file (JSONL when the first non-blank character is
    `{`, unless `format` says), and the lines that are not rows at all."""
    if len(data) > MAX_IMPORT_BYTES:
        raise LabelError(f"a labels file may be at most {MAX_IMPORT_BYTES // 2**20} MB", 413)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise LabelError("a labels file must be UTF-8 text") from None
    if format is None:
        format = "jsonl" if text.lstrip().startswith("{") else "csv"
    rows: list[Row] = []
    problems: list[dict[str, Any]] = []
    if format == "jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):  # ValueError: an integer of 4,300+ digits
                problems.append({"line": number, "problem": "not a JSON object"})
                continue
            if not isinstance(value, dict):
                problems.append({"line": number, "problem": "not a JSON object"})
                continue
            rows.append(Row(number, value))
    else:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        try:
            for fields in reader:
                extra = fields.pop(None, None)
                if extra:
                    problems.append({"line": reader.line_num, "problem": "more cells than columns"})
                    continue
                rows.append(Row(reader.line_num, dict(fields)))
        except csv.Error as exc:
            problems.append({"line": reader.line_num, "problem": f"not CSV: {exc}"})
    if len(rows) > MAX_IMPORT_ROWS:
        raise LabelError(f"a labels file may have at most {MAX_IMPORT_ROWS} rows", 413)
    return rows, problems


def import_rows(
    session: Session, run_id: str, rows: Sequence[Row], who: str | None
) -> dict[str, Any]:
    """Store the good rows of a labels file; answer every other row's problem by line.

    A row names its claim by `item_id` and `claim_index`, or by `claim` (its text; with
    `item_id` within that item, else anywhere in the run where the text is unique), and
    carries `verdict` (or `human_verdict`: the sample file's column) and an optional `note`.
    A row whose verdict is empty is skipped (a sample file's rows left to fill in); a second
    row for a claim already labelled by this file is a problem, the first one stands.
    """
    cells = (_unescaped(r.fields.get("item_id")) for r in rows)
    keys = sorted({key for pair in cells for key in pair if key and text_problem(key) is None})
    claims: dict[int, dict[int, Claim]] = defaultdict(dict)
    by_text: dict[str, list[tuple[Item, Claim]]] = defaultdict(list)
    # rows that name a claim by its text alone: only the claims of those texts are read, not
    # every claim of the run (millions of rows for a large run, for a one-line file)
    texts = sorted(
        {
            text
            for r in rows
            if r.fields.get("item_id") in (None, "") and r.fields.get("claim_index") in (None, "")
            for text in _unescaped(r.fields.get("claim"))
            if text_problem(text) is None
        }
    )
    query = select(Item, Claim).join(Claim, Claim.item_id == Item.id).where(Item.run_id == run_id)
    items: dict[str, Item] = {}
    for start in range(0, len(keys), BIND_CHUNK):
        chunk = keys[start : start + BIND_CHUNK]
        named = select(Item).where(Item.run_id == run_id, Item.key.in_(chunk))
        items |= {item.key: item for item in session.scalars(named)}
        for item, claim in session.execute(query.where(Item.key.in_(chunk))):
            claims[item.id][claim.idx] = claim
    for start in range(0, len(texts), BIND_CHUNK):
        for item, claim in session.execute(
            query.where(Claim.text.in_(texts[start : start + BIND_CHUNK]))
        ):
            by_text[claim.text].append((item, claim))
    stored = skipped = 0
    problems: list[dict[str, Any]] = []
    seen: dict[tuple[int, int], int] = {}
    for row in rows:
        try:
            found = _row(row.fields, items, claims, by_text)
            if found is None:
                skipped += 1
                continue
            item, claim, verdict, note = found
        except LabelError as exc:
            problems.append({"line": row.line, "problem": exc.message})
            continue
        first = seen.get((item.id, claim.idx))
        if first is not None:
            problems.append(
                {"line": row.line, "problem": f"duplicate of line {first}: that row stands"}
            )
            continue
        seen[(item.id, claim.idx)] = row.line
        _store(session, run_id, item.id, claim.idx, verdict, note, who)
        stored += 1
    return {"stored": stored, "skipped": skipped, "problems": problems}


def _row(
    fields: dict[str, Any],
    items: dict[str, Item],
    claims: dict[int, dict[int, Claim]],
    by_text: dict[str, list[tuple[Item, Claim]]],
) -> tuple[Item, Claim, str, str | None] | None:
    raw = fields.get("verdict", fields.get("human_verdict"))
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    verdict, note = check_verdict(raw), check_note(fields.get("note"))
    key, index, text = fields.get("item_id"), fields.get("claim_index"), fields.get("claim")
    if key not in (None, ""):
        item = next((items[k] for k in _unescaped(key) if k in items), None)
        if item is None:
            raise LabelError(f"no item {str(key)[:80]!r} in this run")
        if index not in (None, ""):
            position = _index(index)
            claim = claims[item.id].get(position)
            if claim is None:
                raise LabelError(f"item {item.key[:80]!r} has no claim {position}")
            return item, claim, verdict, note
        if not isinstance(text, str) or not text:
            raise LabelError("a row needs claim_index or claim")
        texts = _unescaped(text)
        matches = [c for c in claims[item.id].values() if c.text in texts]
        if not matches:
            raise LabelError(f"item {item.key[:80]!r} has no claim {text[:80]!r}")
        return item, matches[0], verdict, note
    if not isinstance(text, str) or not text:
        raise LabelError("a row needs item_id and claim_index, or claim")
    found = next((by_text[t] for t in _unescaped(text) if t in by_text), [])
    if len(found) != 1:
        why = "no claim" if not found else f"{len(found)} claims"
        raise LabelError(f"{why} of this run reads {text[:80]!r} (add item_id)")
    return found[0][0], found[0][1], verdict, note


def _unescaped(value: Any) -> tuple[str, ...]:
    """What a cell may name: itself, and for a cell our CSV made spreadsheet-safe (`'=x`) also
    the text before that (`=x`), so a sample file filled in and imported back finds its items."""
    if value in (None, ""):
        return ()
    from recallq.export import spreadsheet_original

    text = str(value)
    original = spreadsheet_original(text)
    return (text,) if original == text else (text, original)


def _index(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400 is infinity
        raise LabelError(f"claim_index must be a whole number, not {str(value)[:40]!r}") from None
    if isinstance(value, float | bool) or not 0 <= number < 2**31:
        raise LabelError(f"claim_index must be a whole number, not {str(value)[:40]!r}")
    return number


# --- the sample ------------------------------------------------------------------------------


def draw_sample(session: Session, run: Run, size: int, seed: int, who: str | None) -> list[str]:
    """Draw `size` items at random among the run's scored items with claims, and keep the
    draw (a new one replaces it). Returns their ids in the order drawn."""
    if not 1 <= size <= MAX_SAMPLE:
        raise LabelError(f"a sample has 1 to {MAX_SAMPLE} items")
    if not 0 <= seed <= MAX_SEED:
        raise LabelError(f"a sample's seed is 0 to {MAX_SEED}")
    keys = list(
        session.scalars(
            select(Item.key)
            .where(
                Item.run_id == run.id,
                Item.status == ItemStatus.SUCCEEDED,
                Item.claims_total > 0,
            )
            .order_by(Item.idx)
        )
    )
    if not keys:
        raise LabelError(f"run {run.id} has no scored item with claims to label")
    chosen = random.Random(seed).sample(keys, min(size, len(keys)))
    existing = session.get(LabelSample, run.id)
    if existing is None:
        session.add(LabelSample(run_id=run.id, seed=seed, item_keys=chosen, drawn_by=who))
    else:
        existing.seed, existing.item_keys, existing.drawn_by = seed, chosen, who
        existing.drawn_at = utcnow()
    session.flush()
    return chosen


def sample_of(session: Session, run_id: str) -> LabelSample | None:
    return session.get(LabelSample, run_id)


def sample_rows(session: Session, run: Run, keys: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Every claim of these items as rows to fill in (SAMPLE_COLUMNS), in the sample's
    order; the context is the item's passages, numbered as the judge saw them."""
    order = {key: position for position, key in enumerate(keys)}
    items = sorted(
        session.scalars(select(Item).where(Item.run_id == run.id, Item.key.in_(list(keys)))),
        key=lambda item: order[item.key],
    )
    by_item: dict[int, list[Claim]] = defaultdict(list)
    for claim in session.scalars(
        select(Claim).where(Claim.item_id.in_([i.id for i in items])).order_by(Claim.idx)
    ):
        by_item[claim.item_id].append(claim)
    for item in items:
        passages = item.contexts if item.contexts is not None else (run.context or [])
        context = "\n".join(f"[{i}] {text}" for i, text in enumerate(passages))
        for claim in by_item[item.id]:
            yield {
                "item_id": item.key,
                "claim_index": claim.idx,
                "claim": claim.text,
                "context": context,
                "judge_verdict": claim.verdict or "",
                "judge_reason": claim.reason or "",
                "human_verdict": "",
                "note": "",
            }


def sample_lines(rows: Iterable[dict[str, Any]], header: bool = True) -> Iterator[str]:
    """The sample as CSV lines (cells that a spreadsheet would run as formulas made safe)."""
    from recallq.export import spreadsheet_safe

    if header:
        yield _csv_line(SAMPLE_COLUMNS)
    for row in rows:
        yield _csv_line([spreadsheet_safe(row[c]) for c in SAMPLE_COLUMNS])


# --- agreement -------------------------------------------------------------------------------


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


# --- the labelling page ----------------------------------------------------------------------


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
