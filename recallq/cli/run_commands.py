"""The CLI's commands about runs: submit, runs, status, results, compare, report, gate,
cancel, retry, resume, delete and estimate.

They talk to the API when one is configured and otherwise to the local database (see
recallq.cli.backends). `submit` and `delete` always need an API (by default on
127.0.0.1:8000); `estimate` reads the file and the models file here and sends nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recallq.cli.backends import (
    DEFAULT_API_URL,
    api_url,
    nothing_found,
    open_backend,
    wait_for_service_run,
)
from recallq.cli.output import output_file, print_json, print_run
from recallq.cli.reports import write_report
from recallq.core import gates
from recallq.core.exits import CommandError, Exit
from recallq.core.status import RUN_ACTIVE, RunStatus
from recallq.settings import Settings
from recallq.viewer import text as display

if TYPE_CHECKING:
    from recallq.client import Client

# The HTTP client and the local runner are imported by the commands that use them: `recallq
# runs` and `status` on the local database load neither.

# --- commands --------------------------------------------------------------------------------


def submit(args: argparse.Namespace) -> int:
    """Send a file to the API as a new run; with --wait, poll until it ends and exit as
    `recallq run` does (run id on stderr, the final run object on stdout)."""
    from recallq.cli.local_runs import rejected_file
    from recallq.client import ApiError, Client
    from recallq.runs import dataset
    from recallq.runs.ingest import SubmissionError

    if not args.file.exists():
        raise CommandError(f"no such file: {args.file}")
    if args.file.is_dir():
        raise CommandError(f"{args.file} is a directory, not a dataset file")
    mapping = dataset.parse_mapping(args.map or [])
    settings: Settings = args.settings
    with Client(api_url(args, settings) or DEFAULT_API_URL, settings.api_key) as client:
        try:
            run = _submitted(client, args, mapping)
        except (ApiError, SubmissionError) as exc:
            line = rejected_file(args.file, exc.code, exc.message)
            if line is None:
                raise
            status = f"{exc.status} {exc.code}: " if isinstance(exc, ApiError) else ""
            raise CommandError(status + line) from None
        if not args.wait:
            print(run.id)
            return Exit.OK
        view = wait_for_service_run(run, args.quiet)
        if view is None:
            return Exit.INTERRUPTED
    print_run(view, args.json)  # as `recallq status` prints it (tests/e2e/test_cli_client.py)
    thresholds = gates.Gate.of(args)
    code, reasons = gates.exit_code(view, thresholds)
    for reason in reasons:
        print(f"recallq: {reason}", file=sys.stderr)
    if code == Exit.OK and thresholds.has_thresholds:
        print(gates.passed_line(view, thresholds), file=sys.stderr)
    return code


def _submitted(client: Client, args: argparse.Namespace, mapping: dict[str, str]) -> Any:
    return client.submit(
        args.file,
        model=args.model,
        name=args.name,
        scale=args.scale,
        context=args.context,
        context_extractor=args.context_extractor,
        mapping=mapping,
        progress=not args.quiet,
        mode="batch" if args.batch else None,
        claims_from=args.claims_from,
        retry_deadline_s=args.retry_deadline,
        precision=args.precision,
    )


def runs(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        views = backend.runs(args.status, args.name, args.limit)
    if args.json:
        print_json(views)
    elif not views:
        filtered = " ".join(
            f"--{name} {value}"
            for name, value in (("status", args.status), ("name", args.name))
            if value
        )
        print(nothing_found(backend, "runs" + (f" matching {filtered}" if filtered else "")))
    else:
        for line in display.runs_table(views):
            print(line)
    return Exit.OK


def status(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        view = backend.view(args.run_id, args.by)
    print_run(view, args.json, by=args.by, groups=view.get("by_group"))
    return Exit.OK


def results(args: argparse.Namespace) -> int:
    with open_backend(args) as backend, output_file(args.out) as out:
        for chunk in backend.results(args.run_id, args.format, not args.no_item_data):
            out.write(chunk)
        out.flush()  # here, where a closed pipe is caught, not at interpreter exit
    return Exit.OK


def compare(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        result = backend.compare(args.base, args.candidate, args.by)
    if args.json:
        print_json(result)
    else:
        for line in display.compare_lines(result, args.by):
            print(line)
    return Exit.OK


def report(args: argparse.Namespace) -> int:
    """Write a run's self-contained HTML report (with --compare, against that run as base)."""
    with open_backend(args) as backend:
        path = write_report(backend, args.run_id, args.out, base=args.compare, lowest=args.lowest)
    print(f"recallq: report written to {path} (one file; open it in a browser, no server needed)")
    return Exit.OK


def gate(args: argparse.Namespace) -> int:
    """Exit 0 when the run passes, 1 (saying which threshold it missed) when it does not."""
    with open_backend(args) as backend:
        view = backend.view(args.run_id)
    thresholds = gates.Gate.of(args)
    code, reasons = gates.exit_code(view, thresholds)
    for reason in reasons:
        print(f"recallq: gate failed: {reason}", file=sys.stderr)
    if code == Exit.OK:
        print(gates.passed_line(view, thresholds))
    return code


def cancel(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        before = backend.view(args.run_id)["status"]
        view = backend.cancel(args.run_id)
    if before == RunStatus.CANCELLED:
        said = f"run {args.run_id} was already cancelled: nothing changed"
    elif before not in RUN_ACTIVE:
        said = f"run {args.run_id} had already ended ({before}): nothing to cancel"
    else:
        said = f"run {args.run_id} cancelled"
        if view.get("calls_stopped") is False:
            said += " (the calls already sent were not stopped: Redis unreachable)"
    print(f"recallq: {said}", file=sys.stderr)
    print_run(view, args.json, "cancel")
    return Exit.OK


def retry(args: argparse.Namespace) -> int:
    """Re-queue failed items: on the service, or scored here for a local run."""
    settings: Settings = args.settings
    url = api_url(args, settings)
    if url is None:
        from recallq.cli import local_runs

        return local_runs.continue_run(args, settings, "retry")
    from recallq.client import Client

    with Client(url, settings.api_key) as client:
        view = client.post(f"/v1/runs/{args.run_id}/retry")
    print(
        f"recallq: retry run {args.run_id}: {view['retried_items']} failed items queued again",
        file=sys.stderr,
    )
    print_run(view, False, "retry")
    return Exit.OK


def resume(args: argparse.Namespace) -> int:
    """Continue a cancelled run (its cancelled items are queued again), or a local run that
    was interrupted (the same as running its command again)."""
    settings: Settings = args.settings
    url = api_url(args, settings)
    if url is not None:
        from recallq.client import Client

        with Client(url, settings.api_key) as client:
            budget = {"budget_usd": args.budget_usd, "budget_tokens": args.budget_tokens}
            body = {name: value for name, value in budget.items() if value is not None}
            view = client.post(f"/v1/runs/{args.run_id}/resume", body)
        print(
            f"recallq: resume run {args.run_id}: {view['resumed_items']} items queued again",
            file=sys.stderr,
        )
        print_run(view, False, "resume")
        return Exit.OK
    from recallq.cli import local_runs

    return local_runs.continue_run(args, settings, "resume")


def delete(args: argparse.Namespace) -> int:
    """Delete an ended run on the service (an admin key)."""
    from recallq.client import Client

    settings: Settings = args.settings
    with Client(api_url(args, settings) or DEFAULT_API_URL, settings.api_key) as client:
        client.delete_run(args.run_id)
    print(f"recallq: run {args.run_id} deleted", file=sys.stderr)
    return Exit.OK


def estimate(args: argparse.Namespace) -> int:
    """Items, judge calls, tokens and cost of a run of this file, without running it."""
    from recallq.judge.models import JudgeModelsError, load_models
    from recallq.runs import dataset, ingest
    from recallq.runs import service as runs
    from recallq.state.db import Database, is_sqlite

    settings: Settings = args.settings
    if not args.file.exists():
        print(f"recallq: no such file: {args.file}", file=sys.stderr)
        return 2
    try:
        mapping = dataset.parse_mapping(args.map or [])
        models = load_models(settings.models_file)
        fields = {
            "model": args.model,
            "context": args.context,
            "context_extractor": args.context_extractor,
            "precision": args.precision,
        }
        spec = runs.spec_of(fields, settings, models)
    except (ingest.SubmissionError, JudgeModelsError, dataset.DatasetError) as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    # the claim cache of the local database, when there is one (an estimate makes none)
    url = settings.database_url
    database_file = Path(url.removeprefix("sqlite:///")) if is_sqlite(url) else None
    use_database = database_file is None or database_file.exists()
    try:
        items = dataset.items_from(args.file, mapping=mapping)
        if use_database:
            database = Database(url)
            try:
                with database.session() as session:
                    result = ingest.estimate_run(session, spec, items, settings, models)
            finally:
                database.dispose()
        else:
            result = _estimate_without_database(spec, items, settings, models)
    except ingest.SubmissionError as exc:
        # a reader's error names the file and line already ("data.jsonl line 1: ...")
        named = isinstance(exc.__cause__, dataset.DatasetError)
        line = exc.message if named else f"{args.file}: {exc.message}"
        print(f"recallq: {line}", file=sys.stderr)
        return 2
    except dataset.DatasetError as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    _print_estimate(result.as_dict(), args.json)
    return 0


def _estimate_without_database(spec: Any, items: Any, settings: Any, models: Any) -> Any:
    """An estimate with no claim cache to look in (no local database yet)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from recallq.runs import ingest
    from recallq.state.tables import Base

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    try:
        with Session(engine) as session:
            return ingest.estimate_run(session, spec, items, settings, models)
    finally:
        engine.dispose()


def _print_estimate(estimate: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(estimate))
        return
    cost = estimate["cost_usd"]
    rows = [
        ("model", estimate["model"]),
        ("items", str(estimate["items"])),
        ("judge calls", f"{estimate['calls']} ({estimate['cache_hits']} claim-cache hits)"),
        *(
            [("relevance calls", str(estimate["relevance_calls"]))]
            if estimate.get("relevance_calls")
            else []
        ),
        ("prompt tokens", str(estimate["prompt_tokens"])),
        ("completion tokens", str(estimate["completion_tokens"])),
        ("cost", "unknown (no price for this model)" if cost is None else f"${cost:.4f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print("recallq estimate (nothing was run)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
