"""`recallq api`, `recallq worker` and `recallq migrate`: the commands that start or set up
the service's processes."""

from __future__ import annotations

import argparse
import socket

from recallq.core.exits import CommandError
from recallq.viewer.text import database_label


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
    """One line (exit 2) when the database's schema is missing or older than this recallq's,
    instead of a 500 for every request (the API) or a traceback every few seconds (a worker).
    A database not reachable now is left to the process, which retries it as it runs."""
    from sqlalchemy.exc import SQLAlchemyError

    from recallq.state import migrate as migrations  # here: alembic is for these commands only

    try:
        problem = migrations.schema_problem(url)
    except SQLAlchemyError:
        return
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
    # here: Celery and the worker's modules cost a second of start-up the other commands skip
    from recallq.execution.celery_queue import QUEUE
    from worker import celery_app

    settings = args.settings
    _check_schema(settings.database_url)
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


def migrate(args: argparse.Namespace) -> int:
    from recallq.state import migrate as migrations  # here: alembic is for this command only

    url = args.settings.database_url
    if args.downgrade:
        migrations.downgrade(url, revision=args.downgrade)
        print(f"recallq: database downgraded to {args.downgrade} ({database_label(url)})")
    else:
        print(f"recallq: {migrations.upgrade_and_say(url)} ({database_label(url)})")
    return 0
