"""Exit codes of the `recallq` command, and the error a command stops with.

`recallq run`, `recallq submit --wait` and `recallq gate` exit with the same codes:

    0   the run completed, no item failed (or no more than --max-failed), every gate passed
    1   items failed, a gate was missed, or the run was cancelled or has not finished
    2   the command could not run: bad arguments or input, unknown run or model, the API or
        the database unreachable
    130 interrupted (Ctrl-C); a local run stays resumable
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    INTERRUPTED = 130


class CommandError(Exception):
    """A command that cannot do what was asked: one line for the user, and an exit code."""

    def __init__(self, message: str, code: Exit = Exit.USAGE) -> None:
        super().__init__(message)
        self.message, self.code = message, code
