"""The `recallq` command.

Exit codes (recallq.core.gates): 0 ok; 1 items failed, a gate was missed, or the run did not end;
2 the command could not run (usage, input, unknown run, unreachable API or database); 130
interrupted. Every error is one line on stderr (`recallq --debug ...` shows the traceback).

This is the CLI's composition root: the settings are read here, once, and every command
finds them as `args.settings`. The commands live in recallq.cli.local_runs (`run`, local
resume and retry), run_commands (the client commands), keys and services (api, worker,
migrate); recallq.cli.parser binds them to their subcommands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, NoReturn

from recallq.cli.parser import API_ONLY_COMMANDS, RUN_ID_ARGUMENTS, build_parser
from recallq.core.exits import CommandError

if TYPE_CHECKING:
    from recallq.settings import Settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__all__ = ["build_parser", "explain", "main", "script"]

#: Libraries of the commands that serve until stopped (`api`, `worker`): they have work to do
#: when the interpreter exits (Celery's worker state, uvicorn's), so those exit as usual.
_SERVERS = frozenset({"celery", "uvicorn"})


def explain(
    exc: BaseException,
    settings: Settings | None = None,
    command: str | None = None,
    api_option: str | None = None,
) -> str | None:
    """The one line an expected error is reported as; None for an unexpected one.

    Each command imports only what it uses, so the errors of a library are looked for only
    when that library was loaded: nothing else can have raised them, and a `recallq run`
    that failed on its file does not pay for httpx or SQLAlchemy to say so."""
    from recallq import extras
    from recallq.judge.models import JudgeModelsError
    from recallq.runs.dataset import DatasetError

    if isinstance(exc, CommandError):
        return exc.message
    if isinstance(exc, ModuleNotFoundError):
        return extras.hint(exc, f"`recallq {command}`" if command else "this command")
    if "recallq.runs.ingest" in sys.modules:
        from recallq.runs.ingest import SubmissionError

        if isinstance(exc, SubmissionError):
            return exc.message
    if isinstance(exc, DatasetError | JudgeModelsError):
        return str(exc)
    if "httpx" in sys.modules:
        line = _http_error(exc, api_option, settings)
        if line is not None:
            return line
    if "sqlalchemy" in sys.modules:
        return _database_error(exc, settings)
    return None


def _http_error(
    exc: BaseException, api_option: str | None, settings: Settings | None
) -> str | None:
    """An API's error, or an API not reached: said with where its URL came from (`--api`
    given: check that URL; RECALLQ_API_URL: that variable; neither: how to name one)."""
    import httpx

    from recallq.client import ApiError

    if isinstance(exc, ApiError):
        return f"{exc.status} {exc.code}: {exc.message}"
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url.copy_with(path="/", query=None)).rstrip("/")
        except RuntimeError:
            where = "the API"
        if api_option:
            hint = "is it running there? (the URL given with --api)"
        elif settings is not None and settings.api_url:
            hint = (
                "is it running there? (the URL of RECALLQ_API_URL; --local reads the local "
                "database)"
            )
        else:
            hint = "no API is configured: pass --api URL or set RECALLQ_API_URL"
        return f"cannot reach the API at {where} ({type(exc).__name__}: {exc}); {hint}"
    return None


def _database_error(exc: BaseException, settings: Settings | None) -> str | None:
    from sqlalchemy.exc import DBAPIError

    from recallq.core.redact import redact_url

    if isinstance(exc, DBAPIError):
        # Postgres quotes the statement under the message ("LINE 1: ..."): not for a user
        message = str(exc.orig).split("\nLINE ")[0] if exc.orig is not None else str(exc)
        reason = " ".join(message.split())
        if "no such table" in reason or re.search(r'relation "[^"]+" does not exist', reason):
            hint = "; is it migrated (`recallq migrate`)?"
        elif "does not exist" in reason:
            hint = "; create it first"
        else:
            hint = ""
        where = redact_url(settings.database_url) if settings is not None else "the database"
        return f"cannot use the database {where}: {reason}{hint}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to say how to run it again
    args.settings = None
    try:
        from recallq.settings import read_settings

        # the one read of the environment in this process: every command takes it from here
        args.settings = read_settings()
        if args.command not in API_ONLY_COMMANDS and any(
            isinstance(getattr(args, name, None), str) for name in RUN_ID_ARGUMENTS
        ):
            from recallq.cli.backends import expand_run_ids

            expand_run_ids(args, RUN_ID_ARGUMENTS)
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
        line = explain(exc, args.settings, args.command, getattr(args, "api", None))
        if line is None:
            line = f"unexpected error: {type(exc).__name__}: {exc} (--debug shows where)"
        code = exc.code if isinstance(exc, CommandError) else 2
        print(f"recallq: {' '.join(line.split())}", file=sys.stderr)
        return int(code)


def script() -> NoReturn:
    """The `recallq` command: main(), then the process ends as soon as what it wrote is out.
    Tearing the interpreter down frees every object of every module one by one, after the
    command's last line: about 2 s of CPU once litellm is imported, 0.2 s after an offline
    run. Nothing the other commands use has work at exit (files and databases are closed, and
    the logs flushed here)."""
    code = main()
    if _SERVERS & sys.modules.keys():
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing to add
            stream.flush()
    os._exit(code)
