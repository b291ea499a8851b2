"""What the CLI prints about runs: summaries, progress lines, run lists, comparisons. Pure
(views in, lines out); the words are the API's field names, so what a person reads in a
terminal is what a script reads in `--json`."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from recallq.core.gates import number
from recallq.core.redact import redact_url
from recallq.core.status import RUN_ACTIVE, PublicItemStatus
from recallq.judge.models import LEXICAL
from recallq.viewer.formatting import spend

BAR_WIDTH = 20
MAX_FAILURE_LINES = 10
#: The item counts a run's summary shows, in this order.
_SHOWN_ITEM_STATUSES = (
    PublicItemStatus.SUCCEEDED,
    PublicItemStatus.FAILED,
    PublicItemStatus.CANCELLED,
    PublicItemStatus.PENDING,
    PublicItemStatus.RUNNING,
)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 row`, `2 rows`: a number and its noun."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def database_label(url: str) -> str:
    """Where runs are, for people: a SQLite file's full path, else the URL without password."""
    if url.startswith("sqlite:///"):
        return str(Path(url.removeprefix("sqlite:///")).resolve())
    return redact_url(url)


def _score(value: float | None) -> str:
    return "-" if value is None else number(value)


def _fixed(value: float | None) -> str:
    """A mean in a table's column: always 4 decimals, so the column lines up and reads alike."""
    return "-" if value is None else f"{value:.4f}"


def _rows(rows: Sequence[tuple[str, str]], indent: str = "  ") -> list[str]:
    width = max(len(key) for key, _ in rows)
    return [f"{indent}{key:<{width}}  {value}" for key, value in rows]


def paused(view: dict[str, Any], now: datetime | None = None) -> str | None:
    """'paused: <reason>, next try in N s' while the run waits (`waiting` in its view: a
    provider incident, no live worker); None while it makes progress."""
    waiting = view.get("waiting")
    if not waiting:
        return None
    text = f"paused: {waiting.get('reason') or 'waiting'}"
    next_probe = waiting.get("next_probe_at")
    if next_probe:
        try:
            due = datetime.fromisoformat(next_probe)
        except (TypeError, ValueError):
            return text
        due = due if due.tzinfo else due.replace(tzinfo=UTC)
        seconds = max(0, round((due - (now or datetime.now(UTC))).total_seconds()))
        text += f", next try in {seconds} s"
    return text


_NUMBERS = re.compile(r"\d+")


class ProgressLine:
    """A line that says how far a run is. A terminal or a notebook redraws it in place (a
    carriage return, padded over the previous line: no terminal escapes, which notebooks show
    raw); a file or a pipe (a CI log) gets a line of its own when it says something new (a
    status, a pause, batches pending: at once) or its counts moved (at most every `every`
    seconds), and the last one."""

    def __init__(self, out: IO[str], every: float = 10.0) -> None:
        self.out = out
        self.every = every
        self.redraw = redraws(out)
        self.shown = ""
        self.at = -math.inf

    def show(self, line: str, last: bool = False) -> None:
        if self.redraw:
            print(
                f"\r{line:<{len(self.shown)}}", end="\n" if last else "", file=self.out, flush=True
            )
        elif line != self.shown and (
            last
            or _NUMBERS.sub("#", line) != _NUMBERS.sub("#", self.shown)
            or time.monotonic() - self.at >= self.every
        ):
            print(line, file=self.out, flush=True)
            self.at = time.monotonic()
        else:
            return
        self.shown = line


def redraws(out: IO[str]) -> bool:
    """Whether `out` shows a carriage return as a redraw: a terminal, or a notebook's stream."""
    try:
        if out.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return type(out).__module__.startswith("ipykernel")


def progress_line(view: dict[str, Any], now: datetime | None = None) -> str:
    counts = view["counts"]
    line = (
        f"{view['status']}: {counts['succeeded']} scored, {counts['failed']} failed, "
        f"{counts['pending'] + counts['running']} to go"
    )
    lane = view.get("batch")
    if lane and lane.get("batches_pending"):
        line += f", {lane['batches_pending']} provider batch(es) pending"
    pause = paused(view, now)
    return f"{line}; {pause}" if pause else line


def histogram_lines(view: dict[str, Any], key: str = "histogram") -> list[str]:
    histogram = view["summary"].get(key)
    if not histogram:
        return []
    edges, counts = histogram["edges"], histogram["counts"]
    top = max(counts) or 1
    lines = []
    for i, n in enumerate(counts):
        label = f"{edges[i]:g}-{edges[i + 1]:g}" + ("]" if i == len(counts) - 1 else ")")
        lines.append(f"  {label:<9} {'#' * round(BAR_WIDTH * n / top):<{BAR_WIDTH}} {n}")
    return lines


def failure_lines(view: dict[str, Any]) -> list[str]:
    """Failed items grouped by error, most frequent first."""
    failures = view.get("failures") or []
    lines = []
    for group in failures[:MAX_FAILURE_LINES]:
        example = f" (e.g. item {group['example_id']})" if group.get("example_id") else ""
        lines.append(f"  {group['count']} x {group['error']}{example}")
    listed = sum(group["count"] for group in failures[:MAX_FAILURE_LINES])
    if view["counts"][PublicItemStatus.FAILED] > listed:
        lines.append(f"  ... and {view['counts']['failed'] - listed} more with other errors")
    return lines


def group_lines(by: str, groups: dict[str, dict[str, Any]]) -> list[str]:
    if not groups:
        return []
    width = max(len(by), *(len(name) for name in groups))
    precision = any(group.get("mean_context_precision") is not None for group in groups.values())
    head = f"  {by:<{width}}  {'items':>6}  {'scored':>6}  {'failed':>6}  mean_score"
    lines = [head + ("  context_precision" if precision else "")]
    for name, group in groups.items():
        line = (
            f"  {name:<{width}}  {group['items']:>6}  {group['scored_items']:>6}  "
            f"{group['failed']:>6}  {_fixed(group['mean_score']):>10}"
        )
        if precision:
            mean, ci95 = group.get("mean_context_precision"), group.get("context_precision_ci95")
            line += f"  {precision_text(mean, ci95, _fixed)}"
        lines.append(line.rstrip())
    return lines


def precision_text(
    mean: float | None, ci95: list[float] | None, shown: Callable[[float], str] = number
) -> str:
    """A mean context precision with its 95% interval: `0.83 [0.71, 0.95]` (`shown` writes
    each number: a table's column has 4 decimals)."""
    if mean is None:
        return "-"
    return f"{shown(mean)} [{shown(ci95[0])}, {shown(ci95[1])}]" if ci95 else shown(mean)


def precision_rows(view: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's context precision rows: the mean with its interval, the mode and how
    many items it is over, where the first relevant passage was, and the ids scores."""
    summary = view["summary"]
    mode = view.get("precision", "cited")
    if mode == "off":
        return [("context_precision", "off")]
    mean = summary.get("mean_context_precision")
    text = precision_text(mean, summary.get("context_precision_ci95"))
    rows = [("context_precision", f"{text} ({mode}, {summary.get('precision_items', 0)} items)")]
    first = summary.get("first_relevant_rank")
    if first and mean is not None:
        shown = ", ".join(f"{rank}: {n}" for rank, n in first.items() if n)
        rows.append(("first_relevant", shown or "-"))
    for key in ("mean_id_precision", "mean_id_recall"):
        if key in summary:
            rows.append((key.removeprefix("mean_"), _score(summary[key])))
    return rows


def summary_lines(
    view: dict[str, Any],
    *,
    title: str = "recallq summary",
    by: str | None = None,
    groups: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """A run's summary: counts, mean score, claims, usage, score distribution, failures by
    error and, with `by`, the summary per metadata group."""
    counts, summary, usage = view["counts"], view["summary"], view["usage"]
    rows = [("run", view["id"])]
    if view.get("name"):
        rows.append(("name", view["name"]))
    rows += [("status", run_status(view)), ("model", view["model"])]
    rows.append(("total", str(counts["total"])))
    rows += [
        (key, str(counts[key]))
        for key in _SHOWN_ITEM_STATUSES
        if counts[key] or key in (PublicItemStatus.SUCCEEDED, PublicItemStatus.FAILED)
    ]
    rows.append(("mean_score", _score(summary["mean_score"])))
    rows += precision_rows(view)
    if view.get("scale", 1) != 1:
        rows.append(("scale", f"{view['scale']:g}"))
    for key, why in (
        ("no_ground_truth", "no ground truth to check against"),
        ("no_context", "no context was retrieved (check what feeds the contexts)"),
    ):
        if summary.get(key):
            items = "item" if summary[key] == 1 else "items"
            rows.append((key, f"{summary[key]} {items} scored 0: {why}"))
    rows.append(
        (
            "claims_attributed",
            f"{summary['claims_attributed']} of {summary['claims_total']} (claims_total)",
        )
    )
    rows.append(("llm_calls", str(usage["llm_calls"])))
    if usage.get("prompt_tokens") or usage.get("completion_tokens"):
        rows.append(
            ("tokens", f"{usage['prompt_tokens']} prompt, {usage['completion_tokens']} completion")
        )
    rows += _spend_rows(usage)
    if usage.get("claim_cache_hits"):
        rows.append(("claim_cache_hits", _cache_hits(usage["claim_cache_hits"], counts)))
    pause = paused(view)
    if pause:
        rows.append(("waiting", pause))
    lines = [title, *_notice_lines(view), *_rows(rows)]
    histogram = histogram_lines(view)
    if histogram:
        lines += ["", "score distribution", *histogram]
    precision_histogram = histogram_lines(view, "precision_histogram")
    if precision_histogram:
        lines += ["", "context precision distribution", *precision_histogram]
    failures = failure_lines(view)
    if failures:
        lines += ["", "failures (by error)", *failures]
    if by is not None and groups is not None:
        lines += ["", f"by {by}", *group_lines(by, groups)]
    return lines


def _cache_hits(hits: int, counts: dict[str, int]) -> str:
    """Items whose claims came from the claim cache: taken when an item's extraction ran, so
    a run stopped early counts items it never scored (200 hits beside 8 scored); say so."""
    said = f"{count(hits, 'item')} took claims from the claim cache (no extraction call)"
    ended = counts[PublicItemStatus.SUCCEEDED] + counts[PublicItemStatus.FAILED]
    if hits > ended:
        said += ", scored or not"
    return said


def _spend_rows(usage: dict[str, Any]) -> list[tuple[str, str]]:
    """What the run cost, in all and per stage, as the run page says it ("not priced" for a
    model the models file gives no price, "no calls" for a stage that made none)."""
    if not usage.get("llm_calls") and not usage.get("cost_usd"):
        return []

    def cost(spent: dict[str, Any]) -> str:
        return f"{spent['cost_usd']:.4f}" if spent.get("cost_usd") else spend(spent)

    rows = [("cost_usd", cost(usage))]
    for stage, spent in (usage.get("by_stage") or {}).items():
        if not spent.get("llm_calls") and not spent.get("cost_usd"):
            rows.append((f"  {stage}", "no calls"))  # a stage the claim cache served, say
            continue
        tokens = spent.get("prompt_tokens", 0) + spent.get("completion_tokens", 0)
        calls = count(spent.get("llm_calls", 0), "call")
        rows.append((f"  {stage}", f"{calls}, {tokens} tokens, cost_usd {cost(spent)}"))
    return rows


#: The judge of `recallq run` without --model: words matched, no model asked.
LEXICAL_BASELINE = (
    "  note: local/lexical is a word-matching baseline, not an LLM judge: pass --model "
    "(see examples/models.yaml) for a real recall score"
)


def _notice_lines(view: dict[str, Any]) -> list[str]:
    """What to read before the numbers: a run whose every item failed (its score means
    nothing), a baseline judge taken for a real one."""
    lines = []
    counts = view["counts"]
    failed = counts[PublicItemStatus.FAILED]
    if counts["total"] and failed == counts["total"]:
        failures = view.get("failures") or []
        why = f": {failures[0]['error']}" if failures else ""
        lines.append(f"  every item failed ({failed} of {counts['total']}){why}")
    if view.get("model") == LEXICAL:
        lines.append(LEXICAL_BASELINE)
    return lines


def interrupted_hint(run_id: str) -> str:
    return f"interrupted: resume with recallq resume {run_id}"


def run_status(view: dict[str, Any]) -> str:
    """A run's status as shown: a local run that no process scores says how to go on."""
    if view.get("interrupted"):
        return f"{view['status']} ({interrupted_hint(view['id'])})"
    return str(view["status"])


def _when(iso: str | None) -> str:
    if not iso:
        return "-"
    moment = datetime.fromisoformat(iso)
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def runs_table(views: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run, newest first as given."""
    if not views:
        return ["no runs"]
    header = ("created (UTC)", "id", "status", "total", "failed", "mean_score", "model", "name")
    rows = [
        (
            _when(view["created_at"]),
            view["id"],
            f"{view['status']} (interrupted)" if view.get("interrupted") else view["status"],
            str(view["counts"]["total"]),
            str(view["counts"][PublicItemStatus.FAILED]),
            _score(view["summary"]["mean_score"]),
            view["model"],
            view.get("name") or "-",
        )
        for view in views
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in (header, *rows)
    ]
    stopped = [view["id"] for view in views if view.get("interrupted")]
    if stopped:
        lines += ["", *(interrupted_hint(run_id) for run_id in stopped)]
    return lines


def compare_lines(result: dict[str, Any], by: str | None = None) -> list[str]:
    """A comparison of a candidate run with a base run (the body of GET /v1/compare); `by`:
    the metadata field of its `by_group` table."""
    base, candidate = result.get("base_run") or {}, result.get("candidate_run") or {}
    unmatched = result["unmatched"]
    ci = result["ci95"]
    difference = result["mean_difference"]
    rows = [
        ("base", _run_label(base)),
        ("candidate", _run_label(candidate)),
        ("matched", str(result["matched"])),
        (
            "unmatched",
            f"{unmatched['base_only']} base_only, {unmatched['candidate_only']} candidate_only, "
            f"{unmatched['unscored']} unscored",
        ),
        ("base_mean", _score(result["base_mean"])),
        ("candidate_mean", _score(result["candidate_mean"])),
        (
            "mean_difference",
            "-"
            if difference is None
            else f"{difference:+.4f}  (95% CI {ci[0]:+.4f} to {ci[1]:+.4f})",
        ),
        (
            "items",
            f"{result['improved']} improved, {result['regressed']} regressed, "
            f"{result['unchanged']} unchanged",
        ),
    ]
    corrected = result.get("corrected")
    if corrected:
        low, high = corrected["ci95"]
        counts = corrected["labelled_items"]
        rows.append(
            (
                "corrected_difference",
                f"{corrected['mean_difference']:+.4f}  (95% CI {low:+.4f} to {high:+.4f}; "
                f"{counts['base']} + {counts['candidate']} labelled items)",
            )
        )
    precision = result.get("precision")
    if precision and precision.get("mean_difference") is not None:
        low, high = precision["ci95"]
        rows.append(
            (
                "precision_difference",
                f"{precision['mean_difference']:+.4f}  (95% CI {low:+.4f} to {high:+.4f}; "
                f"{_score(precision['base_mean'])} -> {_score(precision['candidate_mean'])}, "
                f"{precision['paired']} items)",
            )
        )
    flipped = result.get("claims_flipped")
    if flipped:
        rows.append(
            (
                "claims_flipped",
                f"{flipped['no_to_yes']} no to yes, {flipped['yes_to_no']} yes to no",
            )
        )
    lines = ["recallq compare", *_rows(rows)]
    if ci is not None and ci[0] <= 0 <= ci[1]:
        lines.append("  (the interval contains 0: no difference shown at 95%)")
    for base_status, run in (("base", base), ("candidate", candidate)):
        if run.get("status") in RUN_ACTIVE:
            lines.append(f"  note: the {base_status} run is still {run['status']}")
    changes = result["largest_changes"]
    if changes:
        lines += ["", "largest changes"]
        for change in changes:
            lines.append(
                f"  {change['key']}: {_score(change['base'])} -> {_score(change['candidate'])} "
                f"({change['difference']:+.2f})"
            )
            for flip in change["flipped"]:
                lines.append(f"      {flip['base']} -> {flip['candidate']}: {flip['claim']}")
    by_group = result.get("by_group")
    if by_group:
        field = by or "group"
        width = max(len(field), *(len(name) for name in by_group))
        lines += ["", f"by {field}", f"  {field:<{width}}  matched  base_mean  candidate_mean"]
        for name, group in by_group.items():
            lines.append(
                f"  {name:<{width}}  {group['matched']:>7}  {_fixed(group['base_mean']):>9}  "
                f"{_fixed(group['candidate_mean']):>14}"
            )
    return lines


def _run_label(run: dict[str, Any]) -> str:
    if not run:
        return "-"
    name = f" ({run['name']})" if run.get("name") else ""
    return f"{run['id']}{name}, {run['model']}"
