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

import os
import re
import sys

import httpx
from sqlalchemy.exc import DBAPIError

from recallq.cli.parser import build_parser
from recallq.client import ApiError
from recallq.core.exits import CommandError
from recallq.core.redact import redact_url
from recallq.judge.models import JudgeModelsError
from recallq.runs.dataset import DatasetError
from recallq.runs.ingest import SubmissionError
from recallq.settings import Settings, read_settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__all__ = ["build_parser", "explain", "main"]


def explain(exc: BaseException, settings: Settings | None = None) -> str | None:
    """The one line an expected error is reported as; None for an unexpected one."""
    if isinstance(exc, CommandError):
        return exc.message

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
        # the one read of the environment in this process: every command takes it from here
        args.settings = read_settings()
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
        line = explain(exc, args.settings)
        if line is None:
            line = f"unexpected error: {type(exc).__name__}: {exc} (--debug shows where)"
        code = exc.code if isinstance(exc, CommandError) else 2
        print(f"recallq: {' '.join(line.split())}", file=sys.stderr)
        return int(code)
