"""Local mode: `recallq run FILE` on SQLite, the engine driven by a thread pool in this process.

The runner is the engine's work queue: an item sent to it runs every stage in one pool thread
(take, extract, attribute, settle), as a worker runs them in a Celery chain.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from recallq import ingest, queries
from recallq.db import is_sqlite
from recallq.engine import Engine
from recallq.models import Item, Run, as_utc, utcnow
from recallq.outcomes import Deferred
from recallq.redact import install_log_redaction, redact_url
from recallq.runtime import Runtime
from recallq.settings import Settings
from recallq.status import RUN_ENDED, ItemStatus

log = logging.getLogger(__name__)

BUCKETS = 5


class LocalRunner:
    """A thread pool as the engine's work queue. Deferred items are sent again when due."""

    def __init__(self, concurrency: int) -> None:
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="recallq-local")
        self._engine: Engine | None = None
        self._busy = 0  # work submitted or scheduled and not finished
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    def start(self, engine: Engine) -> None:
        self._engine = engine

    def send_items(self, item_ids: Sequence[int]) -> None:
        for item_id in item_ids:
            self._submit(self._run_item, item_id)

    def send_dispatch(self, run_id: str) -> None:
        self._submit(self._dispatch, run_id)

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._busy == 0

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, work: Callable[[Any], object], argument: Any) -> None:
        with self._lock:
            self._busy += 1
        self._pool.submit(self._done_after, work, argument)

    def _done_after(self, work: Callable[[Any], object], argument: Any) -> None:
        try:
            work(argument)
        except Exception:  # noqa: BLE001  (one item's bug must not stop the others)
            log.exception("local runner: %s(%r) failed", getattr(work, "__name__", work), argument)
        finally:
            with self._lock:
                self._busy -= 1

    def _run_item(self, item_id: int) -> None:
        assert self._engine is not None, "start() the runner with its engine first"
        outcome = self._engine.run_item(item_id)
        if isinstance(outcome, Deferred):
            self._later(outcome.until, item_id)

    def _dispatch(self, run_id: str) -> None:
        assert self._engine is not None, "start() the runner with its engine first"
        self._engine.dispatch(run_id)

    def _later(self, until: datetime, item_id: int) -> None:
        delay = max(0.0, (as_utc(until) - utcnow()).total_seconds())
        with self._lock:
            self._busy += 1
        timer = threading.Timer(delay, self._resend, args=(item_id,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _resend(self, item_id: int) -> None:
        self.send_items([item_id])
        with self._lock:
            self._busy -= 1


def local_runtime(settings: Settings, concurrency: int) -> tuple[Runtime, LocalRunner]:
    runner = LocalRunner(concurrency)
    runtime = Runtime.local(settings, runner)
    install_log_redaction(runtime.redactor)
    runner.start(runtime.engine)
    return runtime, runner


def read_jsonl(path: Path, max_item_bytes: int) -> Iterator[Any]:
    with path.open("rb") as handle:
        yield from ingest.parse_ndjson_lines(handle, max_item_bytes)


def check_model(runtime: Runtime, model: str) -> None:
    """Before anything starts: the model is known and its settings resolve here (this process
    is the worker, so a key missing from its environment would fail every item)."""
    runtime.models[ingest.require_known_model(model, runtime.models)].resolved_params()


def submit_local(
    runtime: Runtime,
    path: Path,
    model: str | None,
    scale: float,
    name: str | None,
    context: Any = None,
    context_extractor: Any = None,
) -> str:
    settings = runtime.settings
    spec = ingest.build_spec(
        model=model,
        default_model=settings.default_model,
        default_retry_deadline=settings.retry_deadline,
        known_models=runtime.models,
        name=name or path.name,
        scale=scale,
        context=context,
        context_extractor=context_extractor,
    )
    with runtime.database.session() as session:
        run = ingest.create_run(
            session, runtime.runs, spec, read_jsonl(path, settings.max_item_bytes), settings
        )
        return run.id


def run_view(runtime: Runtime, run_id: str) -> dict[str, Any]:
    with runtime.database.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        return runtime.run_view(session, run)


def process(
    runtime: Runtime, runner: LocalRunner, run_id: str, progress: bool = True
) -> dict[str, Any]:
    """Score a stored run with the local runner; returns the finished run view."""
    from tqdm import tqdm

    view = run_view(runtime, run_id)
    bar = tqdm(total=view["counts"]["total"], unit="item", disable=not progress, file=sys.stderr)
    runner.send_dispatch(run_id)
    try:
        while True:
            time.sleep(0.05)
            idle = runner.idle  # before the view: work that ended by now shows in it
            view = run_view(runtime, run_id)
            counts = view["counts"]
            bar.n = counts["succeeded"] + counts["failed"] + counts["cancelled"]
            bar.set_postfix(failed=counts["failed"], refresh=False)
            bar.refresh()
            if view["status"] in RUN_ENDED:
                break
            if idle:  # nothing in flight, yet the run has not ended: say so, do not hang
                log.error("run %s stopped with items unended: %s", run_id, counts)
                break
    finally:
        bar.close()
        runner.stop()
    return view


def write_results(runtime: Runtime, run_id: str, out: Path) -> int:
    """Per-item results with claims: CSV if the file name ends in .csv, else JSONL."""
    lines = queries.csv_lines if out.suffix.lower() == ".csv" else queries.jsonl_lines
    count = 0
    with runtime.database.session() as session, out.open("w") as handle:
        for line in lines(queries.iter_results(session, run_id)):
            handle.write(line)
            count += 1
    return count


def print_summary(
    runtime: Runtime, view: dict[str, Any], run_id: str, out: Path | None, stream: TextIO
) -> None:
    counts, summary, usage = view["counts"], view["summary"], view["usage"]
    scores, failures = _scores_and_failures(runtime, run_id)
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
    url = runtime.database.url
    where = (
        str(Path(url.removeprefix("sqlite:///")).resolve()) if is_sqlite(url) else redact_url(url)
    )
    print(f"\nresults: {where} (run {run_id})", file=stream)
    if out is not None:
        print(f"per-item results with claims: {out}", file=stream)


def _scores_and_failures(
    runtime: Runtime, run_id: str
) -> tuple[list[float], list[tuple[str, str]]]:
    from sqlalchemy import select

    with runtime.database.session() as session:
        rows = session.execute(
            select(Item.key, Item.status, Item.score, Item.error)
            .where(Item.run_id == run_id)
            .order_by(Item.idx)
        ).all()
    scores = [r.score for r in rows if r.status == ItemStatus.SUCCEEDED and r.score is not None]
    failures = [(r.key, r.error or "") for r in rows if r.status == ItemStatus.FAILED]
    return scores, failures


def default_concurrency(settings: Settings, model: str) -> int:
    return 2 if model == "local/lexical" else min(32, settings.worker_concurrency)
