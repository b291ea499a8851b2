"""The `recallq` command.

Exit codes (recallq.gates): 0 ok; 1 items failed, a gate was missed, or the run did not end;
2 the command could not run (usage, input, unknown run, unreachable API or database); 130
interrupted. Every error is one line on stderr (`recallq --debug ...` shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from recallq.status import RunStatus

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def cmd_run(args: argparse.Namespace) -> int:
    from recallq import local_commands

    if args.batch:
        print(f"recallq: {LOCAL_BATCH_REFUSED}", file=sys.stderr)
        return 2
    return local_commands.run(args)


LOCAL_BATCH_REFUSED = (
    "--batch needs the service: a provider batch can take up to 24 hours, and a worker polls "
    "it (`recallq api` and `recallq worker` on Postgres and Redis; then "
    "`recallq submit FILE --model M --batch`). Local mode makes online calls only."
)


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="info",
        # a request's head (line and headers) may be this long: room for run fields as
        # query parameters of an NDJSON upload, a bound for everything else
        h11_max_incomplete_event_size=64 * 1024,
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from recallq.broker import QUEUE
    from recallq.settings import Settings
    from worker import celery_app

    settings = Settings()
    concurrency = args.concurrency or settings.worker_concurrency
    address = (args.metrics_host, args.metrics_port) if args.metrics_port else None
    celery_app.start(settings, address).worker_main(
        [
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--queues",
            QUEUE,
            "--loglevel",
            args.loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from recallq import migrate
    from recallq.display import database_label
    from recallq.settings import Settings

    url = Settings().database_url
    if args.downgrade:
        migrate.downgrade(url, revision=args.downgrade)
        print(f"recallq: database downgraded to {args.downgrade} ({database_label(url)})")
    else:
        print(f"recallq: {migrate.upgrade_and_say(url)} ({database_label(url)})")
    return 0


def _client_command(name: str) -> Any:
    def command(args: argparse.Namespace) -> int:
        from recallq import client

        result: int = getattr(client, name)(args)
        return result

    command.__name__ = f"cmd_{name}"
    return command


def _json_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg} at column {exc.colno}") from exc


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


REPORT_LOWEST = 25
MAX_REPORT_LOWEST = 500  # each shown item is read in full: a bound on the report's size


def _report_size(text: str) -> int:
    value = _non_negative_int(text)
    if not 1 <= value <= MAX_REPORT_LOWEST:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_REPORT_LOWEST}")
    return value


def _add_run_fields(parser: argparse.ArgumentParser) -> None:
    """Options of a new run, shared by `run` and `submit`."""
    parser.add_argument("file", type=Path, help="JSONL, JSON array, CSV or Parquet")
    parser.add_argument(
        "--model", help="judge model (default: RECALLQ_DEFAULT_MODEL or local/lexical)"
    )
    parser.add_argument("--name", help="run name (default: the file's name)")
    parser.add_argument(
        "--context", type=_json_argument, help="static context for every item, a JSON list"
    )
    parser.add_argument(
        "--context-extractor",
        type=_json_argument,
        help='for agent-shaped items, JSON: \'{"type": "tool_results", "tools": ["search"]}\'',
    )
    parser.add_argument(
        "--map",
        action="append",
        metavar="FIELD=TARGET",
        help="read FIELD as TARGET (an item field, metadata[.NAME], or - to drop it); "
        "repeat or separate with commas",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_gate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-score", type=float, help="exit 1 when the mean score is below this")
    parser.add_argument(
        "--max-failed",
        type=_non_negative_int,
        help="exit 1 when more items than this failed (default 0)",
    )
    parser.add_argument(
        "--max-no-context",
        type=_non_negative_int,
        help="exit 1 when more items than this were scored without any context",
    )


def _add_api(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api",
        metavar="URL",
        help="the API to ask (default RECALLQ_API_URL; without either, the local database)",
    )


def build_parser() -> argparse.ArgumentParser:
    from recallq import __version__

    parser = argparse.ArgumentParser(prog="recallq", description="Context-recall scoring at scale.")
    parser.add_argument("--version", action="version", version=f"recallq {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="score a file locally (SQLite, in-process worker)")
    _add_run_fields(run)
    run.add_argument(
        "--scale", type=float, default=1.0, help="scores run from 0 to this (default 1)"
    )
    run.add_argument(
        "--out", type=Path, help="write per-item results with claims (CSV if *.csv, else JSONL)"
    )
    run.add_argument(
        "--format",
        choices=["jsonl", "csv", "claims.csv"],
        help="format of --out (default: from its name; *.claims.csv is one row per claim)",
    )
    run.add_argument("--concurrency", type=int, help="judge calls in flight (threads)")
    run.add_argument(
        "--fresh", action="store_true", help="start over instead of resuming this file's run"
    )
    run.add_argument("--by", metavar="FIELD", help="summary per value of this metadata field")
    run.add_argument(
        "--report",
        nargs="?",
        const="",  # --report alone: the default file
        metavar="FILE",
        help="also write the run's HTML report (default file: recallq-report-RUN.html)",
    )
    run.add_argument("--batch", action="store_true", help="refused: batch mode needs the service")
    _add_gate(run)
    run.set_defaults(func=cmd_run)

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on")
    api.add_argument("--port", type=int, default=8000, help="port to listen on")
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run a Celery worker")
    worker.add_argument("--concurrency", type=int, help="LLM calls in flight (threads)")
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    worker.set_defaults(func=cmd_worker)

    migrate = sub.add_parser("migrate", help="create or upgrade the database schema")
    migrate.add_argument("--downgrade", metavar="REVISION", help="downgrade instead")
    migrate.set_defaults(func=cmd_migrate)

    submit = sub.add_parser("submit", help="send a file to the API as a new run")
    _add_run_fields(submit)
    submit.add_argument("--scale", type=float, help="scores run from 0 to this (default 1)")
    submit.add_argument(
        "--wait", action="store_true", help="wait for the run to end; exit as `recallq run`"
    )
    submit.add_argument(
        "--batch",
        action="store_true",
        help="through the provider's Batch API (a model marked `batch: true`): about half the "
        "price, results within 24 h",
    )
    _add_gate(submit)
    _add_api(submit)
    submit.set_defaults(func=_client_command("submit"))

    runs = sub.add_parser("runs", help="list runs, newest first")
    _add_api(runs)
    runs.add_argument("--status", choices=list(RunStatus), help="only these")
    runs.add_argument("--name", help="only runs of this name")
    runs.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    runs.add_argument("--json", action="store_true", help="the run objects as JSON")
    runs.set_defaults(func=_client_command("runs"))

    status = sub.add_parser("status", help="a run's summary")
    status.add_argument("run_id")
    _add_api(status)
    status.add_argument("--json", action="store_true", help="the run object as JSON")
    status.add_argument("--by", metavar="FIELD", help="summary per value of this metadata field")
    status.set_defaults(func=_client_command("status"))

    results = sub.add_parser("results", help="a run's per-item results with claims")
    results.add_argument("run_id")
    _add_api(results)
    results.add_argument("--format", choices=["jsonl", "csv", "claims.csv"], default="jsonl")
    results.add_argument("--out", type=Path, help="file to write (default: stdout)")
    results.add_argument(
        "--no-item-data",
        action="store_true",
        help="leave out input, output, ground_truth, context and metadata",
    )
    results.set_defaults(func=_client_command("results"))

    compare = sub.add_parser("compare", help="compare two runs of the same items")
    compare.add_argument("base", metavar="BASE_RUN")
    compare.add_argument("candidate", metavar="CANDIDATE_RUN")
    _add_api(compare)
    compare.add_argument("--by", metavar="FIELD", help="also per value of this metadata field")
    compare.add_argument("--json", action="store_true", help="the comparison as JSON")
    compare.set_defaults(func=_client_command("compare"))

    report = sub.add_parser("report", help="write a run's HTML report (one file, no server)")
    report.add_argument("run_id")
    report.add_argument("--out", type=Path, help="file to write (default: recallq-report-RUN.html)")
    report.add_argument(
        "--compare",
        metavar="BASE_RUN",
        help="add a comparison with this run as the base (RUN is the candidate)",
    )
    report.add_argument(
        "--lowest",
        type=_report_size,
        default=REPORT_LOWEST,
        help=f"how many of the lowest-scoring items to show (default {REPORT_LOWEST})",
    )
    _add_api(report)
    report.set_defaults(func=_client_command("report"))

    gate = sub.add_parser("gate", help="exit 1 when a run misses a threshold (for CI)")
    gate.add_argument("run_id")
    _add_api(gate)
    _add_gate(gate)
    gate.set_defaults(func=_client_command("gate"))

    for name, helptext in (
        ("cancel", "cancel a run"),
        ("retry", "re-queue a run's failed items (a local run is scored here)"),
        ("resume", "continue an interrupted local run"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("run_id")
        _add_api(p)
        if name != "cancel":
            p.add_argument("--concurrency", type=int, help="judge calls in flight (local)")
            p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.set_defaults(func=_client_command(name))

    from recallq import security_cli

    security_cli.add_commands(sub)  # keys create|list|revoke, delete, estimate
    from recallq import label_cli

    label_cli.add_commands(sub)  # label, agreement, gate --corrected
    return parser


def explain(exc: BaseException) -> str | None:
    """The one line an expected error is reported as; None for an unexpected one."""
    from recallq.gates import CommandError

    if isinstance(exc, CommandError):
        return exc.message
    import httpx
    from sqlalchemy.exc import DBAPIError

    from recallq.api_client import ApiError
    from recallq.dataset import DatasetError
    from recallq.ingest import SubmissionError
    from recallq.judge_models import JudgeModelsError
    from recallq.redact import redact_url

    if isinstance(exc, SubmissionError):
        return exc.message
    if isinstance(exc, DatasetError | JudgeModelsError):
        return str(exc)
    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.code}: {exc.message}"
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
        except RuntimeError:
            where = "the API"
        return (
            f"cannot reach the API at {where} ({type(exc).__name__}: {exc}); "
            "pass --api or set RECALLQ_API_URL"
        )
    if isinstance(exc, DBAPIError):
        from recallq.settings import Settings

        # Postgres quotes the statement under the message ("LINE 1: ..."): not for a user
        message = str(exc.orig).split("\nLINE ")[0] if exc.orig is not None else str(exc)
        reason = " ".join(message.split())
        if "no such table" in reason or re.search(r'relation "[^"]+" does not exist', reason):
            hint = "; is it migrated (`recallq migrate`)?"
        elif "does not exist" in reason:
            hint = "; create it first"
        else:
            hint = ""
        return f"cannot use the database {redact_url(Settings().database_url)}: {reason}{hint}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to say how to run it again
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\nrecallq: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if args.debug:
            raise
        line = explain(exc)
        if line is None:
            line = f"unexpected error: {type(exc).__name__}: {exc} (--debug shows where)"
        from recallq.gates import CommandError

        code = exc.code if isinstance(exc, CommandError) else 2
        print(f"recallq: {' '.join(line.split())}", file=sys.stderr)
        return int(code)


if __name__ == "__main__":
    sys.exit(main())
