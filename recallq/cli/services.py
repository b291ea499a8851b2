"""`recallq api`, `recallq worker` and `recallq migrate`: the commands that start or set up
the service's processes."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import tempfile
import time
import traceback
from typing import TYPE_CHECKING

from recallq.core.exits import CommandError
from recallq.viewer.text import database_label

CHECK_INTERVAL = 2.0  # seconds between two looks at the schema (`recallq migrate --check --wait`)

if TYPE_CHECKING:
    from worker.supervisor import Child


def _check_free(host: str, port: int) -> None:
    """One line (exit 2) for an address in use, before uvicorn's multi-line error and exit 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server "
                "on it? pass --port)"
            ) from None


def _check_schema(url: str) -> None:
    """One line (exit 2), before anything starts, when the database does not exist or cannot
    be reached (a process started anyway took messages only to hand them back, and logged a
    traceback every few seconds), and when its schema is missing or older than this
    recallq's (a 500 for every request, a traceback per message). A database lost later is
    an outage, waited out (worker.outages, the API's 503)."""
    from recallq.state import migrate as migrations  # here: alembic is for these commands only
    from recallq.state.db import Database, DatabaseUnavailable

    database = Database(url)
    try:
        database.ping()
    except DatabaseUnavailable as exc:
        hint = " (create it, then run `recallq migrate`)" if exc.missing else ""
        raise CommandError(f"cannot use the database {database_label(url)}: {exc}{hint}") from None
    finally:
        database.dispose()
    problem = migrations.schema_problem(url)
    if problem is not None:
        raise CommandError(f"{problem} ({database_label(url)}): run `recallq migrate` first")


def api(args: argparse.Namespace) -> int:
    _check_free(args.host, args.port)
    _check_schema(args.settings.database_url)
    import uvicorn  # here: only this command needs the server

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


def worker(args: argparse.Namespace) -> int:
    """N processes of M threads from one command: this process checks what it can, imports
    everything once, then forks them and keeps them at N (worker.supervisor)."""
    from recallq.observability import metrics

    settings = args.settings
    _check_schema(settings.database_url)
    port = args.metrics_port
    listening = metrics.listen(args.metrics_host, port) if port else None
    # here: Celery, the worker's modules and litellm cost seconds the other commands skip
    from recallq import patches
    from recallq.cli import explain
    from worker import celery_app
    from worker.supervisor import Supervisor, usable_cpus

    concurrency = args.concurrency or settings.worker_concurrency
    with contextlib.ExitStack() as cleanup:
        metrics_at = None
        if listening is not None:  # the processes' metrics, summed on one page
            directory = cleanup.enter_context(
                tempfile.TemporaryDirectory(prefix="recallq-worker-metrics-")
            )
            patches.count_in_files(directory)
            metrics_at = (listening, directory)
        celery_app.prepare(settings)

        def process(child: Child) -> int:
            celery_app.start(settings, child.ready, metrics_at)
            banner = child.number == 1 and child.first
            return celery_app.run(concurrency, args.loglevel, banner)

        def ended(pid: int) -> None:
            if metrics_at is not None:
                metrics.process_ended(pid, metrics_at[1])

        def explained(exc: BaseException) -> str:
            if args.debug:
                traceback.print_exception(exc)
            line = explain(exc, settings)
            return line or f"unexpected error: {type(exc).__name__}: {exc} (--debug shows where)"

        return Supervisor(
            args.processes or usable_cpus(),
            process,
            explained,
            each=f"{concurrency} threads",
            on_exit=ended,
        ).run()


def migrate(args: argparse.Namespace) -> int:
    from recallq.state import migrate as migrations  # here: alembic is for this command only

    url = args.settings.database_url
    if args.wait and not args.check:
        raise CommandError("--wait goes with --check (recallq migrate --check --wait SECONDS)")
    if args.check:
        print(f"recallq: {_schema_ready(url, args.wait)} ({database_label(url)})")
        return 0
    if args.downgrade:
        migrations.downgrade(url, revision=args.downgrade)
        print(f"recallq: database downgraded to {args.downgrade} ({database_label(url)})")
    else:
        print(f"recallq: {migrations.upgrade_and_say(url)} ({database_label(url)})")
    return 0


def _schema_ready(url: str, wait: float) -> str:
    """`recallq migrate --check [--wait S]`: what a process about to start (a Kubernetes init
    container) asks before it serves the database, changing nothing: the schema is one this
    recallq serves (schema_problem), asked again every 2 s for up to `wait` seconds while a
    migration runs elsewhere or the database is not reachable yet. Each new reason to wait is
    printed once on stderr; at the deadline the last one is the command's error line."""
    from sqlalchemy.exc import SQLAlchemyError

    from recallq.state import migrate as migrations

    deadline = time.monotonic() + wait
    said: str | None = None
    while True:
        unreachable: SQLAlchemyError | None = None
        try:
            problem = migrations.schema_problem(url)
        except SQLAlchemyError as exc:
            unreachable, problem = exc, f"the database is not reachable ({type(exc).__name__})"
        if problem is None:
            return f"the schema is ready (revision {migrations.current_revision(url)})"
        left = deadline - time.monotonic()
        if left <= 0:
            if unreachable is not None:
                raise unreachable  # one line from the CLI: which database, and why
            raise CommandError(f"{problem} ({database_label(url)}): run `recallq migrate` first")
        if problem != said:
            print(f"recallq: waiting: {problem} ({database_label(url)})", file=sys.stderr)
            said = problem
        time.sleep(min(CHECK_INTERVAL, left))
