"""How the client commands print: a run as its summary (or, with --json, the run object),
JSON for people to read and for scripts to parse, and the files they write."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from recallq.core.exits import CommandError
from recallq.viewer import text as display


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def print_run(view: dict[str, Any], as_json: bool, command: str = "status", **summary: Any) -> None:
    """How every command that shows a run shows it: its summary under the command's name
    (`recallq cancel`, not `recallq status`, heads what a cancel left), or with --json the
    run object."""
    if as_json:
        print_json(view)
        return
    for line in display.summary_lines(view, title=f"recallq {command}", **summary):
        print(line)


@contextmanager
def output_file(path: Path | None) -> Iterator[IO[bytes]]:
    """Where a command writes: stdout when no path (or `-`) is given; else PATH.partial, put
    in PATH's place only once the command has written all of it, so a command that fails (a
    run not found, a connection lost) leaves PATH as it was."""
    if path is None or str(path) == "-":
        yield sys.stdout.buffer
        return
    partial = path.with_name(path.name + ".partial")
    try:
        handle = partial.open("wb")
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with handle:
            yield handle
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
