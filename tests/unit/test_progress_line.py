"""How `Run.wait` shows progress: redrawn in place on a terminal, a line of its own (when it
changed, throttled, and the last one) in a file or a pipe, where carriage returns would run
every update together into one line of a CI log."""

from __future__ import annotations

import io

from recallq.viewer.text import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_redraws_one_line_in_place() -> None:
    out = Terminal()
    line = ProgressLine(out)
    line.show("running: 10 scored, 0 failed, 90 to go")
    line.show("running: 9 scored")  # shorter: padded over the longer one
    line.show("completed: 100 scored", last=True)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.split("\r")[1:] == [
        "running: 10 scored, 0 failed, 90 to go",
        "running: 9 scored" + " " * 21,  # as long as the line it covers
        "completed: 100 scored\n",
    ]


def test_a_file_gets_whole_lines_only_when_they_change() -> None:
    out = io.StringIO()
    line = ProgressLine(out, every=0)
    for shown in ("queued: 0 scored", "queued: 0 scored", "running: 5 scored", "running: 5 scored"):
        line.show(shown)
    line.show("completed: 9 scored", last=True)
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "queued: 0 scored",
        "running: 5 scored",
        "completed: 9 scored",
    ]


def test_a_file_gets_at_most_a_line_per_interval_and_always_the_last() -> None:
    out = io.StringIO()
    line = ProgressLine(out, every=3600)
    for done in range(50):
        line.show(f"running: {done} scored")
    line.show("completed: 50 scored", last=True)
    assert out.getvalue().splitlines() == ["running: 0 scored", "completed: 50 scored"]


def test_a_file_gets_a_new_state_at_once_and_moving_counts_per_interval() -> None:
    out = io.StringIO()
    line = ProgressLine(out, every=3600)
    line.show("queued: 0 scored, 0 failed, 20 to go")
    line.show("queued: 0 scored, 0 failed, 20 to go, 1 provider batch(es) pending")  # new: now
    line.show("running: 3 scored, 0 failed, 17 to go, 1 provider batch(es) pending")  # now
    line.show("running: 9 scored, 0 failed, 11 to go, 1 provider batch(es) pending")  # counts
    line.show("running: 9 scored, 0 failed, 11 to go; paused: rate limited (429)")  # now
    line.show("completed: 20 scored, 0 failed, 0 to go", last=True)
    assert out.getvalue().splitlines() == [
        "queued: 0 scored, 0 failed, 20 to go",
        "queued: 0 scored, 0 failed, 20 to go, 1 provider batch(es) pending",
        "running: 3 scored, 0 failed, 17 to go, 1 provider batch(es) pending",
        "running: 9 scored, 0 failed, 11 to go; paused: rate limited (429)",
        "completed: 20 scored, 0 failed, 0 to go",
    ]


def test_the_last_line_is_not_repeated() -> None:
    out = io.StringIO()
    line = ProgressLine(out, every=0)
    line.show("completed: 3 scored")
    line.show("completed: 3 scored", last=True)
    assert out.getvalue() == "completed: 3 scored\n"
