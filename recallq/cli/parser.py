"""The `recallq` command line: its parser, each subcommand bound to the function that runs it
(in recallq.cli.local_runs, run_commands, labels, keys and services).

Building the parser imports none of them: `recallq --help` loads this module and argparse,
and a command loads only its own module (tests/e2e/test_startup.py keeps it so)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recallq.cli.reports import MAX_REPORT_LOWEST, REPORT_LOWEST
from recallq.core.status import RunStatus

#: The arguments that name a run (as a run id, or a unique start of one on the local
#: database: recallq.cli.backends.expand_run_ids), and the commands that only ask an API.
RUN_ID_ARGUMENTS = ("run_id", "base", "candidate", "compare", "against", "claims_from")
API_ONLY_COMMANDS = frozenset({"submit", "delete"})


def _command(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command `name` of recallq.cli.`module`, imported when it runs: `recallq --help`
    and each command load only what they use (httpx, SQLAlchemy, the engine cost start-up)."""

    def command(args: argparse.Namespace) -> int:
        found = getattr(importlib.import_module(f"recallq.cli.{module}"), name)
        return int(found(args) or 0)

    command.__name__ = f"{module}.{name}"
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


def _finite_float(text: str) -> float:
    """A gate's threshold: a number, never NaN (every comparison with it is false, so a gate
    would pass any run) nor infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _at_least_one(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _report_size(text: str) -> int:
    value = _non_negative_int(text)
    if not 1 <= value <= MAX_REPORT_LOWEST:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_REPORT_LOWEST}")
    return value


def _label_seed(text: str) -> int:
    from recallq.labels.store import MAX_SEED  # here: the labels' rules load with their command

    digits = len(str(MAX_SEED))
    if not (text.isascii() and text.isdigit() and len(text) <= digits) or int(text) > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_SEED}: {text!r}")
    return int(text)


def _label_sample_size(text: str) -> int:
    from recallq.labels.store import MAX_SAMPLE

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_SAMPLE:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_SAMPLE}")
    return value


def add_api_option(parser: argparse.ArgumentParser, local: bool = True) -> None:
    """--api URL, and (for commands that can read the local database) --local."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--api",
        metavar="URL",
        help="the API to ask (default RECALLQ_API_URL; without either, the local database)",
    )
    if local:
        where.add_argument(
            "--local",
            action="store_true",
            help="read the local database, even when RECALLQ_API_URL is set",
        )


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
        "--claims-from",
        metavar="RUN",
        help="attribute the claims of this earlier run's items (same id and ground truth) "
        "instead of extracting them",
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
    parser.add_argument(
        "--retry-deadline",
        type=float,
        metavar="SECONDS",
        help="how long an item may wait out a provider that does not answer before it fails "
        "(default RECALLQ_RETRY_DEADLINE, 6 h)",
    )
    parser.add_argument(
        "--precision",
        help="context precision: cited (default: from attribution's citations, no extra "
        "call), judged (one context_relevance call per item) or off",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_gate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--min-score", type=_finite_float, help="exit 1 when the mean score is below this"
    )
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
    parser.add_argument(
        "--min-precision",
        type=_finite_float,
        help="exit 1 when the mean context precision is below this",
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
        choices=["jsonl", "csv", "claims.csv", "passages.csv"],
        help="format of --out (default: from its name; *.claims.csv is one row per claim, "
        "*.passages.csv one per passage)",
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
    # kept so that `recallq run --batch` says why it is refused (local mode makes online calls
    # only), but not listed: --help shows what the command does
    run.add_argument("--batch", action="store_true", help=argparse.SUPPRESS)
    _add_gate(run)
    run.set_defaults(func=_command("local_runs", "run"))

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on")
    api.add_argument("--port", type=int, default=8000, help="port to listen on")
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.set_defaults(func=_command("services", "api"))

    worker = sub.add_parser("worker", help="run Celery worker processes")
    worker.add_argument(
        "--processes",
        type=_at_least_one,
        help="worker processes, forked from this one (default: the CPUs it may use)",
    )
    worker.add_argument(
        "--concurrency", type=_at_least_one, help="LLM calls in flight per process (threads)"
    )
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    worker.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    worker.set_defaults(func=_command("services", "worker"))

    migrate = sub.add_parser("migrate", help="create or upgrade the database schema")
    how = migrate.add_mutually_exclusive_group()
    how.add_argument("--downgrade", metavar="REVISION", help="downgrade instead")
    how.add_argument(
        "--check",
        action="store_true",
        help="change nothing: exit 0 when the schema is ready for this recallq, else 2",
    )
    migrate.add_argument(
        "--wait",
        type=_non_negative_int,
        default=0,
        metavar="SECONDS",
        help="with --check: wait up to this long for the schema (a migration running elsewhere)",
    )
    migrate.set_defaults(func=_command("services", "migrate"))

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
    submit.add_argument(
        "--json", action="store_true", help="with --wait, the final run object as JSON"
    )
    _add_gate(submit)
    add_api_option(submit, local=False)
    submit.set_defaults(func=_command("run_commands", "submit"))

    runs = sub.add_parser("runs", help="list runs, newest first")
    add_api_option(runs)
    runs.add_argument("--status", choices=[s.value for s in RunStatus], help="only these")
    runs.add_argument("--name", help="only runs of this name")
    runs.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    runs.add_argument("--json", action="store_true", help="the run objects as JSON")
    runs.set_defaults(func=_command("run_commands", "runs"))

    status = sub.add_parser("status", help="a run's summary")
    status.add_argument("run_id")
    add_api_option(status)
    status.add_argument("--json", action="store_true", help="the run object as JSON")
    status.add_argument("--by", metavar="FIELD", help="summary per value of this metadata field")
    status.set_defaults(func=_command("run_commands", "status"))

    results = sub.add_parser("results", help="a run's per-item results with claims")
    results.add_argument("run_id")
    add_api_option(results)
    results.add_argument(
        "--format", choices=["jsonl", "csv", "claims.csv", "passages.csv"], default="jsonl"
    )
    results.add_argument("--out", type=Path, help="file to write (default, or -: stdout)")
    results.add_argument(
        "--no-item-data",
        action="store_true",
        help="leave out input, output, ground_truth, context and metadata",
    )
    results.set_defaults(func=_command("run_commands", "results"))

    compare = sub.add_parser("compare", help="compare two runs of the same items")
    compare.add_argument("base", metavar="BASE_RUN")
    compare.add_argument("candidate", metavar="CANDIDATE_RUN")
    add_api_option(compare)
    compare.add_argument("--by", metavar="FIELD", help="also per value of this metadata field")
    compare.add_argument("--json", action="store_true", help="the comparison as JSON")
    compare.set_defaults(func=_command("run_commands", "compare"))

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
    add_api_option(report)
    report.set_defaults(func=_command("run_commands", "report"))

    gate = sub.add_parser("gate", help="exit 1 when a run misses a threshold (for CI)")
    gate.add_argument("run_id")
    add_api_option(gate)
    _add_gate(gate)
    gate.add_argument(
        "--corrected",
        action="store_true",
        help="gate on the lower bound of the mean corrected by human labels of a random sample",
    )
    gate.set_defaults(func=_command("label_commands", "cmd_gate"))

    for name, helptext in (
        ("cancel", "cancel a run"),
        ("retry", "re-queue a run's failed items (a local run is scored here)"),
        ("resume", "continue a cancelled run, or an interrupted local run"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("run_id")
        add_api_option(p)
        if name == "cancel":
            p.add_argument("--json", action="store_true", help="the run object as JSON")
        else:
            p.add_argument("--concurrency", type=int, help="judge calls in flight (local)")
            p.add_argument("--quiet", action="store_true", help="no progress bar")
        if name == "resume":
            p.add_argument(
                "--budget-usd", type=float, help="a higher budget for a run cancelled at its own"
            )
            p.add_argument("--budget-tokens", type=int, help="the same, in tokens")
        p.set_defaults(func=_command("run_commands", name))

    keys = sub.add_parser("keys", help="make, list and revoke API keys (on the database)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="make a key; it is printed once")
    create.add_argument("--project", required=True, help="the project the key acts in")
    create.add_argument("--role", required=True, choices=["admin", "write", "read"])
    create.add_argument("--label", help="what the key is for (shown by `keys list`)")
    create.set_defaults(func=_command("keys", "create"))
    listing = keys_sub.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--project", help="only this project's keys")
    listing.add_argument("--json", action="store_true", help="as JSON lines")
    listing.set_defaults(func=_command("keys", "list_keys"))
    revoke = keys_sub.add_parser("revoke", help="revoke a key from now on")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=_command("keys", "revoke"))

    delete = sub.add_parser("delete", help="delete an ended run with its items (admin key)")
    delete.add_argument("run_id")
    add_api_option(delete, local=False)
    delete.set_defaults(func=_command("run_commands", "delete"))

    estimate = sub.add_parser(
        "estimate", help="items, judge calls, tokens and cost of a run, without running it"
    )
    estimate.add_argument("file", type=Path)
    estimate.add_argument("--model", help="judge model (default: RECALLQ_DEFAULT_MODEL)")
    estimate.add_argument("--context", type=_json_argument, help="static context, a JSON list")
    estimate.add_argument("--context-extractor", type=_json_argument, help="JSON extractor spec")
    estimate.add_argument(
        "--map",
        action="append",
        metavar="FIELD=TARGET",
        help="read FIELD as TARGET, as `recallq run --map` does",
    )
    estimate.add_argument(
        "--precision", help="cited (default), judged (a context_relevance call an item) or off"
    )
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    estimate.set_defaults(func=_command("run_commands", "estimate"))
    _add_label_commands(sub)
    return parser


def _add_label_commands(sub: Any) -> None:
    """`label`, `agreement` and `rejudge` (recallq.cli.label_commands)."""
    label = sub.add_parser("label", help="sample claims to label by hand, or import labels")
    label.add_argument("run_id")
    action = label.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--sample", type=_label_sample_size, metavar="N", help="draw N items at random"
    )
    action.add_argument("--import", dest="import_file", type=Path, metavar="FILE",
                        help="a labels file (CSV or JSONL) to store")  # fmt: skip
    label.add_argument("--seed", type=_label_seed, default=0, help="of the sample (default 0)")
    label.add_argument("--out", type=Path, help="the CSV to fill in (with --sample)")
    add_api_option(label)
    label.set_defaults(func=_command("label_commands", "cmd_label"))

    agreement = sub.add_parser("agreement", help="how far the judge agrees with the labels")
    agreement.add_argument("run_id")
    agreement.add_argument("--by", metavar="FIELD", help="also per value of this metadata field")
    agreement.add_argument(
        "--against", metavar="RUN", help="another run of the same claims: judge vs judge"
    )
    agreement.add_argument("--json", action="store_true", help="the agreement as JSON")
    add_api_option(agreement)
    agreement.set_defaults(func=_command("label_commands", "cmd_agreement"))

    rejudge = sub.add_parser(
        "rejudge", help="attribute a run's claims again (another model, or the same)"
    )
    rejudge.add_argument("run_id")
    rejudge.add_argument("--model", help="the judge of the new run (default: the run's own)")
    rejudge.add_argument("--concurrency", type=int, help="judge calls in flight (threads)")
    rejudge.add_argument("--quiet", action="store_true", help="no progress bar")
    add_api_option(rejudge)
    rejudge.set_defaults(func=_command("label_commands", "cmd_rejudge"))
