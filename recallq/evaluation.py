"""`recallq.evaluate(data, ...)`: score a dataset in this process, as `recallq run` does.

It needs no server, Redis, Celery or litellm (litellm is imported only when the judge is an
LLM). Runs are stored where `recallq run` stores them: RECALLQ_DATABASE_URL, by default the
SQLite file `recallq.db` in the working directory, so they can be listed, compared and gated
from the CLI afterwards (`recallq runs`), and the claim cache makes a second evaluation of the
same ground truths with an LLM judge cost one call per item instead of two. Pass
`database_url=` to keep them elsewhere. The Result holds everything in memory.
"""

from __future__ import annotations

import dataclasses
import sys
from os import PathLike
from pathlib import Path
from typing import Any

from recallq.judge.models import LEXICAL
from recallq.results import Result

RUN_FIELDS = (
    "name",
    "scale",
    "context",
    "context_extractor",
    "retry_deadline_s",
    "claims_from",
    "precision",
)


def evaluate(
    data: Any,
    model: str = LEXICAL,
    *,
    mapping: dict[str, str] | None = None,
    progress: bool = True,
    database_url: str | None = None,
    concurrency: int | None = None,
    fresh: bool = False,
    **run_fields: Any,
) -> Result:
    """Score `data` in-process and return the Result.

    `data` is a file path (JSONL, JSON array, CSV, or Parquet with pandas/pyarrow), a list of
    dicts, or a pandas DataFrame, with recallq's field names or RAGAS's, DeepEval's and the
    like (`reference`, `retrieved_contexts`, ...); other fields become each item's metadata.
    `mapping` renames fields (`{"gold": "ground_truth"}`, `{"context": "metadata"}`).
    `run_fields` are the run's: `name`, `scale`, `context` (static passages for every item),
    `context_extractor` (for agent-shaped items), `claims_from` (an earlier local run: items
    of the same id and ground truth take its claims and are only attributed), `precision`
    (`cited`, the default, `judged` or `off`: how passages are known relevant).

    As `recallq run` does, the same data (a file's bytes, or the items) with the same model,
    run fields and mapping finds its run again: a finished run is returned as it is (no judge
    call), an interrupted one is resumed. `fresh=True` scores it again in a new run.

    Raises ValueError (recallq.runs.dataset.DatasetError or recallq.runs.ingest.SubmissionError) for
    input it cannot use, before any judge call. On KeyboardInterrupt the run is kept, and
    `recallq resume RUN` continues it.
    """
    from recallq.runs import dataset, ingest, local
    from recallq.runs import service as runs
    from recallq.runs.reads import RunReads
    from recallq.settings import read_settings
    from recallq.state import migrate

    unknown = set(run_fields) - set(RUN_FIELDS)
    if unknown:
        raise TypeError(
            f"evaluate() got unknown run field(s) {', '.join(sorted(unknown))}; "
            f"run fields are {', '.join(RUN_FIELDS)}"
        )
    # a library entry point: this call's settings, read here and passed down
    settings = read_settings() if database_url is None else read_settings(database_url=database_url)
    runtime, runner = local.local_runtime(
        settings, concurrency or local.default_concurrency(settings, model)
    )
    try:
        local.check_model(runtime, model)
        name = run_fields.get("name")
        if name is None and isinstance(data, str | PathLike):
            name = Path(data).name
        fields = {**run_fields, "model": model, "name": name}
        spec = runs.RunService(runtime, local=True).spec(fields, local.PROJECT)
        migrate.upgrade(settings.database_url)
        if isinstance(data, str | PathLike):
            path = Path(data)
            if not path.exists():
                raise dataset.DatasetError(f"{path}: no such file")
            opened = local.open_file_run(runtime, path, spec, mapping or {}, fresh=fresh)
        else:
            try:  # read whole here to find its run again: as the submission reports a reader's
                items = list(dataset.items_from(data, mapping=mapping))
            except dataset.DatasetError as exc:
                raise ingest.SubmissionError(str(exc)) from exc
            keyed = dataclasses.replace(spec, idempotency_key=local.items_key(items, spec))
            opened = local.open_run(runtime, keyed, lambda: items, fresh)
        run_id = opened.run_id
        if opened.how == "finished":
            progress = False
        try:
            view = local.process(runtime, runner, run_id, progress=progress)
        except KeyboardInterrupt:
            print(
                f"recallq: interrupted; run {run_id} is kept: `recallq resume {run_id}` "
                "continues it",
                file=sys.stderr,
            )
            raise
        return Result(view, list(RunReads.of(runtime).iter_results(run_id, local.PROJECT)))
    finally:
        runner.stop(wait=False)
        runtime.close()
