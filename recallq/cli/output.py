"""How the client commands print: a run as its summary (or, with --json, the run object),
and JSON for people to read and for scripts to parse."""

from __future__ import annotations

import json
from typing import Any

from recallq import display


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def print_run(view: dict[str, Any], as_json: bool, **summary: Any) -> None:
    """How every command that shows a run shows it: its summary, or with --json the run
    object."""
    if as_json:
        print_json(view)
        return
    for line in display.summary_lines(view, title="recallq status", **summary):
        print(line)
