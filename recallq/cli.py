"""The `recallq` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def cmd_run(args: argparse.Namespace) -> int:
    from recallq import ingest, local, migrate
    from recallq.model_registry import LEXICAL, ModelRegistryError
    from recallq.settings import Settings

    if not args.file.exists():
        print(f"recallq: no such file: {args.file}", file=sys.stderr)
        return 2
    settings = Settings()
    model = args.model or settings.default_model
    concurrency = args.concurrency or local.default_concurrency(settings, model)
    runtime, runner = local.local_runtime(settings, concurrency)
    try:
        local.check_model(runtime, model)
    except (ingest.SubmissionError, ModelRegistryError) as exc:
        print(f"recallq: {exc}", file=sys.stderr)
        return 2
    migrate.upgrade(settings.database_url)
    try:
        run_id = local.submit_local(
            runtime,
            args.file,
            model,
            args.scale,
            args.name,
            context=args.context,
            context_extractor=args.context_extractor,
        )
    except ingest.SubmissionError as exc:
        print(f"recallq: {args.file}: {exc.message}", file=sys.stderr)
        return 2
    if model != LEXICAL:
        from recallq import patches

        patches.prepare_litellm()
    view = local.process(runtime, runner, run_id, progress=not args.quiet)
    if args.out:
        local.write_results(runtime, run_id, args.out)
    local.print_summary(runtime, view, run_id, args.out, sys.stdout)
    runtime.close()
    return 0


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
    celery_app.start(settings).worker_main(
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
    from recallq.settings import Settings

    url = Settings().database_url
    if args.downgrade:
        migrate.downgrade(url, revision=args.downgrade)
        print(f"recallq: database downgraded to {args.downgrade}")
    else:
        migrate.upgrade(url)
        print("recallq: database schema is up to date")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from recallq import client

    return client.submit(args)


def cmd_status(args: argparse.Namespace) -> int:
    from recallq import client

    return client.status(args)


def cmd_results(args: argparse.Namespace) -> int:
    from recallq import client

    return client.results(args)


def cmd_cancel(args: argparse.Namespace) -> int:
    from recallq import client

    return client.post_action(args, "cancel")


def cmd_retry(args: argparse.Namespace) -> int:
    from recallq import client

    return client.post_action(args, "retry")


def _json_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc.msg} at column {exc.colno}") from exc


def _add_context_options(parser: argparse.ArgumentParser, parse: bool) -> None:
    """The run's static context and context extractor, as JSON (sent as is by `submit`)."""
    kind = _json_argument if parse else str
    parser.add_argument(
        "--context", type=kind, help="static context for every item, a JSON list: '[\"...\"]'"
    )
    parser.add_argument(
        "--context-extractor",
        type=kind,
        help='for agent-shaped items, JSON: \'{"type": "tool_results", "tools": ["search"]}\'',
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recallq", description="Context-recall scoring at scale.")
    sub = parser.add_subparsers(dest="command", required=True)
    api_url = os.environ.get("RECALLQ_API_URL", "http://127.0.0.1:8000")

    run = sub.add_parser("run", help="score a JSONL file locally (SQLite, in-process worker)")
    run.add_argument("file", type=Path)
    run.add_argument(
        "--model", help="judge model (default: RECALLQ_DEFAULT_MODEL or local/lexical)"
    )
    run.add_argument(
        "--scale", type=float, default=1.0, help="scores run from 0 to this (default 1)"
    )
    run.add_argument(
        "--out", type=Path, help="write per-item results with claims (CSV if *.csv, else JSONL)"
    )
    run.add_argument("--name", help="run name (default: the file's name)")
    run.add_argument("--concurrency", type=int, help="judge calls in flight (threads)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_context_options(run, parse=True)
    run.set_defaults(func=cmd_run)

    api = sub.add_parser("api", help="serve the HTTP API")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on")
    api.add_argument("--port", type=int, default=8000, help="port to listen on")
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run a Celery worker")
    worker.add_argument("--concurrency", type=int, help="LLM calls in flight (threads)")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(func=cmd_worker)

    migrate = sub.add_parser("migrate", help="upgrade the database schema to head")
    migrate.add_argument("--downgrade", metavar="REVISION", help="downgrade instead")
    migrate.set_defaults(func=cmd_migrate)

    for name, func, helptext in (
        ("submit", cmd_submit, "stream a JSONL file to the API as a new run"),
        ("status", cmd_status, "show a run's status"),
        ("results", cmd_results, "download a run's results"),
        ("cancel", cmd_cancel, "cancel a run"),
        ("retry", cmd_retry, "re-queue a run's failed items"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--api", default=api_url, help="API base URL (env RECALLQ_API_URL)")
        if name == "submit":
            p.add_argument("file", type=Path)
            p.add_argument("--model")
            p.add_argument("--scale", type=float)
            p.add_argument("--name")
            p.add_argument("--wait", action="store_true", help="poll until the run ends")
            _add_context_options(p, parse=False)
        else:
            p.add_argument("run_id")
        if name == "results":
            p.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
            p.add_argument("--out", type=Path, help="file to write (default: stdout)")
        p.set_defaults(func=func)

    from recallq import security_cli

    security_cli.add_commands(sub)  # keys create|list|revoke, delete, estimate
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
