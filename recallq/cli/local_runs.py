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
from pathlib import Path
from typing import Any, TextIO

from recallq.cli.backends import LocalBackend, not_found, open_local_database
from recallq.cli.reports import REPORT_LOWEST, write_report
from recallq.core import gates
from recallq.core.exits import CommandError, Exit
from recallq.core.groups import UnknownField
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
from recallq.state.runs import RunNotFound
from recallq.viewer import text as display

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
    status = None
    try:
        view = local.run_view(runtime, run_id, details=False)
        counts, status = view["counts"], view["status"]
        done = counts[PublicItemStatus.SUCCEEDED] + counts[PublicItemStatus.FAILED]
        progress = f": {done} of {counts['total']} items done, and not sent again"
    except Exception:  # the message below matters more than the counts
        progress = ""
    if status in RUN_ENDED and not left:  # the items in flight were its last ones
        print(
            f"recallq: run {run_id} {status} meanwhile: recallq status {run_id}{here}",
            file=sys.stderr,
        )
        return Exit.INTERRUPTED
    with contextlib.suppress(Exception):  # a resume sends them again all the same
        local.release(runtime, run_id)
    print(f"recallq: run {run_id} is kept{progress}", file=sys.stderr)
    if resume_argv is not None:
        argv = [arg for arg in resume_argv if arg != "--fresh"]
        print(f"recallq: resume with: {shlex.join(['recallq', *argv])}", file=sys.stderr)
    print(f"recallq:          or: recallq resume {run_id}{here}", file=sys.stderr)
    if left:
        # Pool threads still inside a judge call would hold the interpreter's exit until the
        # call returns (up to the request timeout, retries included). Their items are
        # `running` in the database, which a resume sends again; SQLite survives the exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(Exit.INTERRUPTED)
    return Exit.INTERRUPTED
