"""The CLI's local runs: `recallq run FILE`, and `recallq resume|retry RUN` without an API.

One process scores the run (SQLite by default, an in-process runner), prints a summary and
exits with the code of recallq.core.gates. Ctrl-C stops it cleanly: the run stays resumable, the
command to resume it is printed, and the exit code is 130.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from recallq.cli.backends import LocalBackend, not_found, open_local_database
from recallq.cli.reports import REPORT_LOWEST, write_report
from recallq.core import gates
from recallq.core.exits import CommandError, Exit
from recallq.core.groups import MISSING_GROUP, UnknownField, check_field
from recallq.core.status import RUN_ENDED, PublicItemStatus
from recallq.execution.local_queue import LocalRunner
from recallq.execution.runtime import Runtime
from recallq.runs import dataset, local
from recallq.runs import service as runs
from recallq.runs.ingest import SubmissionError
from recallq.runs.reads import RunReads
from recallq.runs.service import RunConflict, RunService
from recallq.settings import Settings
from recallq.state import migrate
from recallq.state.db import is_sqlite
from recallq.state.runs import RunNotFound
from recallq.viewer import text as display
from recallq.viewer.text import database_label

LOCAL_BATCH_REFUSED = (
    "--batch needs the service: a provider batch can take up to 24 hours, and a worker polls "
    "it (`recallq api` and `recallq worker` on Postgres and Redis; then "
    "`recallq submit FILE --model M --batch`). Local mode makes online calls only."
)

#: After Ctrl-C, how long the items already in flight get to finish (and be stored, so a
#: resume does not pay for them again) before they are abandoned.
INTERRUPT_GRACE_SECONDS = 5.0


def report(
    view: dict[str, Any],
    gate: gates.Gate,
    out: TextIO,
    *,
    by: str | None = None,
    groups: dict[str, dict[str, Any]] | None = None,
    footer: list[str] | None = None,
) -> Exit:
    """Print a finished run's summary and gate verdict; returns the exit code."""
    print("", file=out)
    for line in display.summary_lines(view, by=by, groups=groups):
        print(line, file=out)
    for line in footer or []:
        print(line, file=out)
    code, reasons = gates.exit_code(view, gate)
    for reason in reasons:
        print(f"recallq: {reason}", file=sys.stderr)
    if code == Exit.OK and gate.has_thresholds:
        print(gates.passed_line(view, gate), file=out)
    return code


def rejected_file(path: Path, code: str, message: str) -> str | None:
    """The line for a file none of whose items has a context: named by the file, with the
    fields it has. None for any other refusal (an empty file is recallq.runs.dataset's)."""
    if code != "no_context":
        return None
    try:
        first = next(dataset.read_records(path), {})
    except dataset.DatasetError:
        first = {}
    fields = ", ".join(str(name) for name in first) or "none"
    return (
        f"{path}: no item has a context (its fields: {fields}); name the field that holds the "
        "retrieved passages with --map context=FIELD, give the run --context, or "
        "--context-extractor for agent-shaped items"
    )


def stored_where(settings: Settings) -> str | None:
    """Where a local run goes when that is not where a newcomer looks: a service's database
    (RECALLQ_DATABASE_URL names one), under the local project, which the service's API and
    pages (a key's project) never show; or, with RECALLQ_API_URL set, a file the client
    commands do not read unless told to (--local). None for the plain local case."""
    url = settings.database_url
    if not is_sqlite(url):
        return (
            f"this run is local: stored in {database_label(url)} (RECALLQ_DATABASE_URL) under "
            f"the local project {local.PROJECT!r}, which the service's API and pages do not "
            "show (`recallq runs --local` lists it); to score on the service: "
            "`recallq submit FILE --wait`"
        )
    if settings.api_url:
        return (
            f"this run is local: stored in {database_label(url)}; with RECALLQ_API_URL set the "
            "client commands ask the API, so pass them --local to read it (`recallq runs "
            "--local`); to score on the service: `recallq submit FILE --wait`"
        )
    return None


def run(args: argparse.Namespace) -> int:
    """`recallq run FILE`: score a file in this process; the same command again resumes."""
    if args.batch:
        raise CommandError(LOCAL_BATCH_REFUSED)
    mapping = dataset.parse_mapping(args.map or [])
    if args.format and not args.out:
        raise CommandError("--format is the format of --out: give --out FILE too")
    if not args.file.exists():
        raise CommandError(f"no such file: {args.file}")
    if args.file.is_dir():
        raise CommandError(f"{args.file} is a directory, not a dataset file")
    settings: Settings = args.settings
    model = args.model or settings.default_model
    concurrency = args.concurrency or local.default_concurrency(settings, model)
    runtime, runner = local.local_runtime(settings, concurrency)
    try:
        local.check_model(runtime, model)
        fields = {
            "model": model,
            "name": args.name or args.file.name,
            "scale": args.scale,
            "context": args.context,
            "context_extractor": args.context_extractor,
            "claims_from": getattr(args, "claims_from", None),
            "retry_deadline_s": getattr(args, "retry_deadline", None),
            "precision": getattr(args, "precision", None),
        }
        spec = runs.RunService(runtime, local=True).spec(fields, local.PROJECT)
        migrate.upgrade(settings.database_url)
        if args.by:
            _check_by(args.file, mapping, args.by)
        note = stored_where(settings)
        if note is not None:
            print(f"recallq: {note}", file=sys.stderr)
        argv = getattr(args, "argv", None) or sys.argv[1:]
        try:
            opened = local.open_file_run(runtime, args.file, spec, mapping, fresh=args.fresh)
        except SubmissionError as exc:
            line = rejected_file(args.file, exc.code, exc.message)
            if line is None:
                raise
            raise CommandError(line) from None
        except KeyboardInterrupt:
            # the submission stores a run whole or not at all; the signal may land just
            # after it committed
            stored = local.file_run_id(runtime, args.file, spec, mapping)
            if stored is not None:
                return _interrupted(runtime, runner, stored, argv)
            print(
                "\nrecallq: interrupted before the run was stored: nothing was kept; run the "
                "same command again",
                file=sys.stderr,
            )
            return Exit.INTERRUPTED
        try:
            if opened.note:
                print(f"recallq: {opened.note}", file=sys.stderr)
            if opened.how == "resumed":
                still = _still_to_score(runtime, opened.run_id)
                print(
                    f"recallq: resuming run {opened.run_id}: {still} (--fresh starts over)",
                    file=sys.stderr,
                )
            elif opened.how == "finished":
                print(
                    f"recallq: this file was scored already in run {opened.run_id}; showing it "
                    "(--fresh scores it again)",
                    file=sys.stderr,
                )
        except KeyboardInterrupt:  # the run is stored: say how to go on
            return _interrupted(runtime, runner, opened.run_id, argv)
        return _score(
            runtime,
            runner,
            opened.run_id,
            args,
            resume_argv=argv,
            progress=opened.how != "finished" and not args.quiet,
        )
    finally:
        runner.stop(wait=False)
        runtime.close()


def _check_by(path: Path, mapping: dict[str, str], by: str) -> None:
    """--by a field no item of the file has: an error (exit 2) before anything is stored or
    scored, not a note after the whole run. Reads the file up to the first item that has it."""
    fields: set[str] = set()
    for item in dataset.items_from(path, mapping=mapping):
        metadata = item.get("metadata") or {}
        if by in metadata:
            return
        fields.update(str(name) for name in metadata)
    try:
        check_field({MISSING_GROUP: {}}, by, lambda: fields)
    except UnknownField as exc:
        raise CommandError(f"--by: {exc} (nothing was scored)") from None


def _still_to_score(runtime: Runtime, run_id: str) -> str:
    """How many of a run's items a resume scores: every item not ended, whether it was
    handed out before (and sent again) or never was."""
    counts = local.run_view(runtime, run_id, details=False)["counts"]
    ended = counts[PublicItemStatus.SUCCEEDED] + counts[PublicItemStatus.FAILED]
    return f"{counts['total'] - ended} of {counts['total']} items still to score"


def continue_run(args: argparse.Namespace, settings: Settings, action: str) -> int:
    """`recallq resume RUN` / `recallq retry RUN` on the local database: send the run's
    unended or cancelled (resume) or failed (retry) items again, and score them here."""
    database = open_local_database(settings)
    try:
        model = RunReads(database, local=True).run(args.run_id, local.PROJECT).model
    except RunNotFound:
        raise CommandError(not_found(args.run_id, settings)) from None
    finally:
        database.dispose()
    concurrency = args.concurrency or local.default_concurrency(settings, model)
    runtime, runner = local.local_runtime(settings, concurrency)
    try:
        local.check_model(runtime, model)
        service = RunService(runtime, local=True)
        try:
            if action == "retry":
                # The run's unended items go back to the queue too: no other process scores
                # a local run, so items left queued or running by an interrupted one would
                # never end.
                runtime.runs.resume(args.run_id, local.PROJECT)
                failed = service.retry(args.run_id, local.PROJECT)
                what = f"{failed} failed items sent again; " + _still_to_score(runtime, args.run_id)
            else:
                count, which = service.resume_local(args.run_id, local.PROJECT)
                # the unended count is what was handed out (the dispatch window), not the rest
                what = f"{count} cancelled items sent again; " if which == "cancelled" else ""
                what += _still_to_score(runtime, args.run_id)
        except RunConflict as exc:
            raise CommandError(exc.message) from None
        print(f"recallq: {action} run {args.run_id}: {what}", file=sys.stderr)
        return _score(runtime, runner, args.run_id, args, resume_argv=None, progress=not args.quiet)
    finally:
        runner.stop(wait=False)
        runtime.close()


def _score(
    runtime: Runtime,
    runner: LocalRunner,
    run_id: str,
    args: argparse.Namespace,
    resume_argv: list[str] | None,
    progress: bool,
) -> int:
    try:
        view = local.process(runtime, runner, run_id, progress=progress)
    except KeyboardInterrupt:
        return _interrupted(runtime, runner, run_id, resume_argv)
    out = getattr(args, "out", None)
    footer = [""]
    # with RECALLQ_API_URL set, the client commands ask the API, which has not this run
    here = " --local" if runtime.settings.api_url else ""
    if out is not None:
        local.write_results(runtime, run_id, out, getattr(args, "format", None))
        footer.append(f"per-item results with claims: {out}")
    else:
        footer.append(
            f"per-item results with claims: recallq results {run_id}{here} --out results.jsonl "
            "(or --out FILE on this command)"
        )
    report_to = getattr(args, "report", None)
    if report_to is not None:
        backend = LocalBackend(runtime.settings, runtime.database)
        to = Path(report_to) if report_to else None
        path = write_report(backend, run_id, to, base=None, lowest=REPORT_LOWEST)
        footer.append(f"HTML report: {path}")
    else:
        footer.append(f"HTML report: recallq report {run_id}{here} --out report.html")
    by = getattr(args, "by", None)
    groups = None
    if by:
        try:
            groups = RunReads.of(runtime).group_summary(run_id, local.PROJECT, by)
        except UnknownField as exc:  # the run is scored: say so, and show the rest
            print(f"recallq: --by: {exc}", file=sys.stderr)
    return report(view, gates.Gate.of(args), sys.stdout, by=by, groups=groups, footer=footer)


#: How long Ctrl-C's bookkeeping (the counts, the items handed back) may take.
HAND_BACK_SECONDS = 10.0


def _hand_back(runtime: Runtime, run_id: str) -> tuple[str, str | None, bool]:
    """After Ctrl-C: the run's counts and status, and its handed-out items given back
    (local.release), within HAND_BACK_SECONDS. The interrupt may have landed anywhere, even in
    the middle of a transaction whose lock the database then waits out (SQLite: a minute), so
    this runs on a thread of its own and the message that says how to resume never waits for
    it. What it could not do, a resume does all the same. Returns the counts' text, the
    status, and whether it finished in time."""
    found: dict[str, Any] = {"progress": "", "status": None}

    def hand_back() -> None:
        with contextlib.suppress(Exception):  # the message matters more than the counts
            view = local.run_view(runtime, run_id, details=False)
            counts = view["counts"]
            done = counts[PublicItemStatus.SUCCEEDED] + counts[PublicItemStatus.FAILED]
            found["progress"] = f": {done} of {counts['total']} items done, and not sent again"
            found["status"] = view["status"]
        if found["status"] not in RUN_ENDED:
            with contextlib.suppress(Exception):
                local.release(runtime, run_id)

    worker = threading.Thread(target=hand_back, name="recallq-hand-back", daemon=True)
    worker.start()
    worker.join(HAND_BACK_SECONDS)
    if worker.is_alive():
        return "", None, False
    return found["progress"], found["status"], True


def _interrupted(
    runtime: Runtime, runner: LocalRunner, run_id: str, resume_argv: list[str] | None
) -> int:
    """Ctrl-C: the runner takes no more work; items in flight get a short grace to finish
    (a second Ctrl-C abandons them); the run stays as it is, and the way to resume is
    printed. Abandoned items are sent again on resume."""
    print("\nrecallq: interrupted", file=sys.stderr)
    left = runner.in_flight
    if left:
        print(
            f"recallq: waiting up to {INTERRUPT_GRACE_SECONDS:g} s for {left} item(s) in flight "
            "(Ctrl-C again to abandon them)",
            file=sys.stderr,
        )
        try:
            left = runner.wait_for_in_flight(INTERRUPT_GRACE_SECONDS)
        except KeyboardInterrupt:
            left = runner.in_flight
    if left:
        print(
            f"recallq: {left} item(s) in flight abandoned: a resume sends them again",
            file=sys.stderr,
        )
    here = " --local" if runtime.settings.api_url else ""  # see _score
    progress, status, handed_back = _hand_back(runtime, run_id)
    if status in RUN_ENDED and not left:  # the items in flight were its last ones
        print(
            f"recallq: run {run_id} {status} meanwhile: recallq status {run_id}{here}",
            file=sys.stderr,
        )
        return Exit.INTERRUPTED
    print(f"recallq: run {run_id} is kept{progress}", file=sys.stderr)
    if resume_argv is not None:
        argv = [arg for arg in resume_argv if arg != "--fresh"]
        print(f"recallq: resume with: {shlex.join(['recallq', *argv])}", file=sys.stderr)
    print(f"recallq:          or: recallq resume {run_id}{here}", file=sys.stderr)
    if left or not handed_back:
        # Pool threads still inside a judge call would hold the interpreter's exit until the
        # call returns (up to the request timeout, retries included), as would a hand-back
        # still waiting on the database. Their items are `running` in the database, which a
        # resume sends again; SQLite survives the exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(Exit.INTERRUPTED)
    return Exit.INTERRUPTED
