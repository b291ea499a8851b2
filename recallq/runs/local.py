"""Local mode: `recallq run FILE` (and `recallq.evaluate`) on SQLite, the engine driven by a
thread pool in this process.

The runner (recallq.execution.local_queue) is the engine's work queue and does what a
worker's tasks do.

A run of a file is found again by a digest of the file's bytes and the run's fields (its
idempotency key), so running the same command again resumes it: the items the stopped
process had handed out go back to the queue (RunStore.resume), claims already extracted are
reused, and items already scored are not sent again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recallq.core.status import PUBLIC_ITEM_ENDED, RUN_ENDED, PublicItemStatus, RunStatus
from recallq.judge import lanes
from recallq.judge.models import LEXICAL
from recallq.settings import DEFAULT_RETRY_DEADLINE, Settings
from recallq.viewer import text as display

if TYPE_CHECKING:
    from recallq.execution.local_queue import LocalRunner
    from recallq.execution.runtime import Runtime
    from recallq.runs.ingest import RunSpec

# The runtime, the engine and the run service are imported where a run is opened or scored:
# `recallq runs` and `status` read local runs without loading them.

log = logging.getLogger(__name__)

#: Longest pause between two progress polls of a local run.
POLL_MAX_SECONDS = 0.5
#: The local database's one project.
PROJECT = "default"
#: Idempotency keys of local runs of a file start with this (API keys are the client's own).
RUN_KEY_PREFIX = "local-run:"


def local_runtime(settings: Settings, concurrency: int) -> tuple[Runtime, LocalRunner]:
    from recallq.core.redact import install_log_redaction
    from recallq.execution.local_queue import LocalRunner
    from recallq.execution.runtime import Runtime
    from recallq.runs import run_views

    runner = LocalRunner(concurrency, settings.extraction_pack)
    runtime = Runtime.local(settings, runner)
    runtime.on_completed = run_views.keep_view
    install_log_redaction(runtime.redactor)
    runner.start(runtime.engine)
    return runtime, runner


def check_model(runtime: Runtime, model: str) -> None:
    """Before anything starts: the model is known and its settings resolve here (this process
    is the worker, so a key missing from its environment would fail every item), and litellm
    is installed (the `llm` extra) for an LLM judge: its lane calls through it, and the direct
    lane (recallq.judge.lanes) prices calls by its price map, without importing it."""
    from recallq import extras
    from recallq.runs import ingest

    runtime.models[ingest.require_known_model(model, runtime.models)].resolved_params()
    if model != LEXICAL and model not in runtime.judges_given:
        extras.require("litellm", f"the judge {model}")


# --- runs of a file: create, or find again and resume ----------------------------------------


def run_key(path: Path, spec: RunSpec, mapping: Mapping[str, str]) -> str:
    """The idempotency key of a local run of a file: a digest of the file's bytes, the run's
    fields and the field mapping. The same command on the same file finds the same run."""
    content = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            content.update(chunk)
    return content_key(content.hexdigest(), spec, mapping)


def items_key(items: Sequence[Mapping[str, Any]], spec: RunSpec) -> str:
    """The idempotency key of a local run of in-memory items (a list, a DataFrame): a digest
    of the canonical items and the run's fields, as run_key is of a file."""
    text = json.dumps(list(items), sort_keys=True, ensure_ascii=False, default=str)
    return content_key("items:" + hashlib.sha256(text.encode()).hexdigest(), spec, {})


def content_key(content: str, spec: RunSpec, mapping: Mapping[str, str]) -> str:
    fields = {
        "file": content,
        "model": spec.model,
        "name": spec.name,
        "scale": spec.scale,
        "context": spec.context,
        "context_extractor": spec.context_extractor,
        "mapping": dict(sorted(mapping.items())),
    }
    if spec.retry_deadline_s != DEFAULT_RETRY_DEADLINE:  # keys made before it stay valid
        fields["retry_deadline_s"] = spec.retry_deadline_s
    if spec.claims_from is not None:  # absent otherwise: earlier runs keep their keys
        fields["claims_from"] = spec.claims_from
    if spec.precision != "cited":  # the default is absent: earlier runs keep their keys
        fields["precision"] = spec.precision
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False)
    return RUN_KEY_PREFIX + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Opened:
    """The run a `recallq run` works on, and how it came to be: `created`, `resumed` (with
    `resent` items sent again) or `finished` (nothing left to score)."""

    run_id: str
    how: str
    resent: int = 0
    note: str | None = None


def create_run(runtime: Runtime, spec: RunSpec, items: Iterable[Any]) -> str:
    """A new local run: the run service's submission, with its checks and messages."""
    from recallq.runs.service import RunService

    return str(RunService(runtime, local=True).submit(spec, items).view["id"])


def open_file_run(
    runtime: Runtime,
    path: Path,
    spec: RunSpec,
    mapping: Mapping[str, str],
    fresh: bool = False,
) -> Opened:
    """The run of this file with these fields: the one made before (resumed), or a new one.
    `fresh`, or a run that was cancelled, starts over: the old run keeps its results but
    hands its key to the new one, so the next plain `recallq run` resumes the new one."""
    from recallq.runs.dataset import items_from

    return open_run(
        runtime,
        _keyed(path, spec, mapping),
        lambda: items_from(path, mapping=mapping),
        fresh,
    )


def _keyed(path: Path, spec: RunSpec, mapping: Mapping[str, str]) -> RunSpec:
    """The spec with the idempotency key of a local run of this file (run_key)."""
    return dataclasses.replace(spec, idempotency_key=run_key(path, spec, mapping))


def file_run_id(
    runtime: Runtime, path: Path, spec: RunSpec, mapping: Mapping[str, str]
) -> str | None:
    """The id of the run open_file_run makes or resumes for this file, once it is stored."""
    from recallq.runs.ingest import find_by_idempotency_key

    keyed = _keyed(path, spec, mapping)
    with runtime.database.session() as session:
        found = find_by_idempotency_key(session, keyed)
        return None if found is None else found.id


def open_run(
    runtime: Runtime, spec: RunSpec, items: Callable[[], Iterable[Any]], fresh: bool
) -> Opened:
    """The run with `spec`'s idempotency key (see open_file_run), or a new one of `items`."""
    from recallq.runs.ingest import find_by_idempotency_key

    with runtime.database.session() as session:
        found = find_by_idempotency_key(session, spec)
        status = None if found is None else found.status
    note = None
    if found is not None and (fresh or status == RunStatus.CANCELLED):
        runtime.runs.forget_idempotency_key(found.id)
        why = "--fresh" if fresh else "it was cancelled"
        note = f"run {found.id} of this file is kept as it is ({why}); starting a new run"
        found = None
    if found is None:
        return Opened(create_run(runtime, spec, items()), "created", note=note)
    if status in RUN_ENDED:
        return Opened(found.id, "finished")
    return Opened(found.id, "resumed", runtime.runs.resume(found.id, spec.project))


def release(runtime: Runtime, run_id: str) -> None:
    """After Ctrl-C: the items this process handed out go back to pending, so the run reads
    as interrupted at once (not when their leases run out) and a resume sends them again."""
    runtime.runs.resume(run_id, PROJECT)


# --- scoring ---------------------------------------------------------------------------------


def run_view(runtime: Runtime, run_id: str, details: bool = True) -> dict[str, Any]:
    """The run object, read as every front end reads it (recallq.runs.reads), by the process
    that scores the run (so never `interrupted`), whatever its project."""
    from recallq.runs.reads import RunReads
    from recallq.state.runs import RunNotFound
    from recallq.state.tables import Run

    with runtime.database.session() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(run_id)
        return RunReads.of(runtime).view_of(session, run, details)


class JudgeClientLoad:
    """The LLM judge's client loaded on a thread of its own: importing litellm and building the
    judge (its first, offline call) cost 6-10 s of CPU, and meanwhile the progress line shows
    and Ctrl-C stops the command at once. The thread is the one importer of litellm: `process`
    hands the runner no item before the load is done, so no judge call can find a module
    half-imported. A model on the direct lane (recallq.judge.lanes) needs no litellm: its
    load is milliseconds."""

    def __init__(self, build: Callable[[], object], litellm: bool = True) -> None:
        self._build = build
        self._litellm = litellm
        self._done = threading.Event()
        self._error: Exception | None = None
        # No garbage collection until it is loaded: litellm's import makes hundreds of
        # thousands of objects that all live on, and collecting among them cost 15-40% of its
        # CPU (here 3.6-4.0 s with, 2.4-3.1 s without). Nor can the waiting thread run a
        # collection then (the count is the interpreter's), where a Ctrl-C could land in an
        # object's finaliser and be lost: Python ignores an exception raised there.
        self._collecting = gc.isenabled() and litellm
        if litellm:
            gc.disable()
        threading.Thread(target=self._load, name="recallq-judge-client", daemon=True).start()

    def _load(self) -> None:
        try:
            self._import_and_build()
        finally:
            if self._collecting:
                gc.enable()
            self._done.set()

    def _import_and_build(self) -> None:
        try:
            if self._litellm:
                import recallq.judge.litellm_transport  # litellm, patched
            import recallq.judge.llm  # noqa: F401
        except Exception as exc:  # raised in the thread that waits for it
            self._error = exc
        else:
            # A judge that cannot be built (a key gone from the environment since the check)
            # fails again, and is told, with the first item: as when it is built there.
            with contextlib.suppress(Exception):
                self._build()

    def wait(self, timeout: float) -> bool:
        """Whether the client is loaded (False: not within `timeout` seconds). A load that
        failed raises its error here, as the import would have where the client is used."""
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True


#: What the progress line says while the judge client loads.
LOADING_JUDGE_CLIENT = "loading the LLM client (litellm)"


def process(
    runtime: Runtime, runner: LocalRunner, run_id: str, progress: bool = True
) -> dict[str, Any]:
    """Score a stored run with the local runner; returns the finished run view.

    The first progress line shows at once; a run with an LLM judge then waits for its client
    (JudgeClientLoad) before the runner takes an item. On Ctrl-C (KeyboardInterrupt) the
    runner stops taking work, without waiting for the items in flight, and the interrupt goes
    on to the caller: the run stays as it is, resumable."""
    from tqdm import tqdm

    view = run_view(runtime, run_id, details=False)
    # a bar redrawn in place on a terminal; in a log file a line now and then (display.ProgressLine)
    lines = (
        display.ProgressLine(sys.stderr) if progress and not display.redraws(sys.stderr) else None
    )
    bar = tqdm(
        total=view["counts"]["total"],
        unit="item",
        disable=not progress or lines is not None,
        file=sys.stderr,
    )

    def show(view: dict[str, Any], note: str | None = None) -> bool:
        """Show how far the run is; whether it has ended."""
        counts = view["counts"]
        bar.n = sum(counts[status] for status in PUBLIC_ITEM_ENDED)
        bar.set_postfix(failed=counts[PublicItemStatus.FAILED], refresh=False)
        bar.set_description_str(note or display.paused(view) or "", refresh=False)
        bar.refresh()
        ended = view["status"] in RUN_ENDED
        if lines is not None:
            line = display.progress_line(view)
            lines.show(f"{line}; {note}" if note else line, last=ended)
        return ended

    try:
        if _calls_a_model(runtime, view):
            config = runtime.models.get(view["model"])
            litellm = config is None or lanes.needs_litellm([config])
            client = JudgeClientLoad(partial(runtime.judges.get, view["model"]), litellm)
            show(view, LOADING_JUDGE_CLIENT if litellm else None)
            while not client.wait(0.5):
                bar.refresh()  # its clock moves on
        runner.send_dispatch(run_id)
        pause = 0.05  # small runs end fast; a long one is polled less often (each poll is a scan)
        while True:
            time.sleep(pause)
            pause = min(POLL_MAX_SECONDS, pause * 1.25)
            idle = runner.idle  # before the view: work that ended by now shows in it
            view = run_view(runtime, run_id, details=False)
            if show(view):
                break
            if idle:  # nothing in flight, yet the run has not ended: say so, do not hang
                log.error("run %s stopped with items unended: %s", run_id, view["counts"])
                break
    except KeyboardInterrupt:
        runner.stop(wait=False)
        raise
    finally:
        bar.close()
    runner.stop()
    return run_view(runtime, run_id)


def _calls_a_model(runtime: Runtime, view: dict[str, Any]) -> bool:
    """Whether scoring this run calls a model: it has not ended, and its judge
    is neither the offline one nor one given ready-made (tests' doubles)."""
    model = view["model"]
    return (
        view["status"] not in RUN_ENDED and model != LEXICAL and model not in runtime.judges_given
    )


def write_results(runtime: Runtime, run_id: str, out: Path, format: str | None = None) -> int:
    """Per-item results with claims, in `format` (by default from the file name, as
    export.format_for says); the same export as `recallq results`."""
    from recallq.core import export
    from recallq.runs.reads import RunReads

    reads = RunReads.of(runtime)
    results = reads.iter_results(run_id, PROJECT)
    format = format or export.format_for(out)
    fields = reads.metadata_fields(run_id, PROJECT, every=True) if format == "csv" else []
    with out.open("w", encoding="utf-8") as handle:
        return export.write(results, format, handle, fields)


def default_concurrency(settings: Settings, model: str) -> int:
    return 2 if model == LEXICAL else min(32, settings.worker_concurrency)
