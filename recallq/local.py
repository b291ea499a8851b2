"""Local mode: `recallq run FILE.jsonl` on SQLite with an in-process Celery worker."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from recallq import ingest, queries
from recallq.db import session_scope
from recallq.model_registry import load_models
from recallq.models import Run, RunStatus
from recallq.settings import get_settings

BUCKETS = 5


def read_jsonl(path: Path) -> Iterator[Any]:
    with path.open("rb") as handle:
        yield from ingest.parse_ndjson_lines(handle)


def check_model(model: str) -> None:
    """Before anything starts: the model is known and its settings resolve here (this process
    is the worker, so a key missing from its environment would fail every item)."""
    known = load_models(get_settings().models_file)
    known[ingest.require_known_model(model, known)].resolved_params()


def submit_local(
    path: Path,
    model: str | None,
    scale: float,
    name: str | None,
    context: Any = None,
    context_extractor: Any = None,
) -> str:
    settings = get_settings()
    spec = ingest.build_spec(
        model=model,
        known_models=load_models(settings.models_file),
        name=name or path.name,
        scale=scale,
        context=context,
        context_extractor=context_extractor,
    )
    with session_scope() as session:
        run = ingest.create_run(session, spec, read_jsonl(path))
        return run.id


def run_view(run_id: str) -> dict[str, Any]:
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return queries.run_view(session, run)


def process(run_id: str, concurrency: int, progress: bool = True) -> dict[str, Any]:
    """Score a stored run with an in-process worker; returns the finished run view."""
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state as worker_state
    from tqdm import tqdm

    from worker import tasks
    from worker.celery_app import app
    from worker.judges import use_local_mode

    use_local_mode()
    app.conf.broker_url = "memory://localhost/"
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    view = run_view(run_id)
    bar = tqdm(total=view["counts"]["total"], unit="item", disable=not progress, file=sys.stderr)
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=60,
    ):
        tasks.dispatch.delay(run_id)
        while True:
            view = run_view(run_id)
            counts = view["counts"]
            bar.n = counts["succeeded"] + counts["failed"] + counts["cancelled"]
            bar.set_postfix(failed=counts["failed"], refresh=False)
            bar.refresh()
            if view["status"] in RunStatus.ENDED:
                bar.close()
                break
            time.sleep(0.2)
        # The in-memory broker's consumer looks at the stop flag only between polls of up to
        # 2 s, and polls once more after seeing it: raise the flag (as leaving start_worker
        # does) and end both polls with no-op messages, so the command exits without waiting.
        worker_state.should_terminate = 0
        for _ in range(2):
            app.send_task("celery.accumulate")
    return view


def write_results(run_id: str, out: Path) -> int:
    """Per-item results with claims: CSV if the file name ends in .csv, else JSONL."""
    lines = queries.csv_lines if out.suffix.lower() == ".csv" else queries.jsonl_lines
    count = 0
    with session_scope() as session, out.open("w") as handle:
        for line in lines(queries.iter_results(session, run_id)):
            handle.write(line)
            count += 1
    return count


def print_summary(view: dict[str, Any], run_id: str, out: Path | None, stream: TextIO) -> None:
    counts, summary, usage = view["counts"], view["summary"], view["usage"]
    scores, failures = _scores_and_failures(run_id)
    mean = summary["mean_score"]
    rows = [
        ("run", run_id),
        ("model", view["model"]),
        ("items", str(counts["total"])),
        ("scored", str(counts["succeeded"])),
        ("failed", str(counts["failed"])),
        ("mean score", "-" if mean is None else f"{mean:.2f}"),
        ("claims supported", f"{summary['claims_attributed']} of {summary['claims_total']}"),
        ("llm calls", str(usage["llm_calls"])),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nrecallq summary", file=stream)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}", file=stream)
    print("\nscore distribution", file=stream)
    scale = view["scale"] or 1.0
    histogram = [0] * BUCKETS
    for score in scores:
        histogram[min(BUCKETS - 1, int(score / scale * BUCKETS))] += 1
    top = max(histogram) or 1
    for i, n in enumerate(histogram):
        low, high = scale * i / BUCKETS, scale * (i + 1) / BUCKETS
        label = f"{low:g}-{high:g}" + ("]" if i == BUCKETS - 1 else ")")
        print(f"  {label:<9} {'#' * round(20 * n / top):<20} {n}", file=stream)
    if failures:
        print("\nfailures", file=stream)
        for key, error in failures[:10]:
            print(f"  {key}: {error}", file=stream)
        if len(failures) > 10:
            print(f"  ... and {len(failures) - 10} more", file=stream)
    db = get_settings().database_url
    where = (
        str(Path(db.removeprefix("sqlite:///")).resolve()) if db.startswith("sqlite:///") else db
    )
    print(f"\nresults: {where} (run {run_id})", file=stream)
    if out is not None:
        print(f"per-item results with claims: {out}", file=stream)


def _scores_and_failures(run_id: str) -> tuple[list[float], list[tuple[str, str]]]:
    from sqlalchemy import select

    from recallq.models import Item, ItemStatus

    with session_scope() as session:
        rows = session.execute(
            select(Item.key, Item.status, Item.score, Item.error)
            .where(Item.run_id == run_id)
            .order_by(Item.idx)
        ).all()
    scores = [r.score for r in rows if r.status == ItemStatus.SUCCEEDED and r.score is not None]
    failures = [(r.key, r.error or "") for r in rows if r.status == ItemStatus.FAILED]
    return scores, failures


def default_concurrency(model: str) -> int:
    return 2 if model == "local/lexical" else min(32, get_settings().worker_concurrency)
