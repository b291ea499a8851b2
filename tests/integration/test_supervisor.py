"""worker.supervisor on its own: real forked processes around a target that needs no service
(tests/integration/supervised.py), so each test takes a second or two. Its use by `recallq
worker` (Celery, the reaper, the metrics) is in tests/integration/test_lost_work_faults.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.services import REPO


class Supervised:
    """`python -m tests.integration.supervised MODE N`, its output in a file."""

    def __init__(self, mode: str, processes: int) -> None:
        self.log = Path(tempfile.mkstemp(prefix="recallq-supervised-", suffix=".log")[1])
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.supervised", mode, str(processes)],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, check: Callable[[str], object], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check(self.output()):
                return
            time.sleep(0.05)
        raise AssertionError(f"not seen; output:\n{self.output()}")

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # its processes too, if it died alone
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture()
def started() -> Iterator[list[Supervised]]:
    made: list[Supervised] = []
    yield made
    for supervised in made:
        supervised.stop()


def _start(started: list[Supervised], mode: str, processes: int) -> Supervised:
    supervised = Supervised(mode, processes)
    started.append(supervised)
    return supervised


def test_one_ready_line_for_all_and_sigterm_stops_every_process(started) -> None:
    supervised = _start(started, "serve", 3)
    supervised.wait_for(lambda out: "ready." in out)
    assert supervised.output().count(" ready.") == 1
    assert "recallq worker: 3 processes x 1 thread ready." in supervised.output()
    children = supervised.children()
    assert len(children) == 3
    supervised.proc.send_signal(signal.SIGTERM)  # the supervisor only, as Docker sends it
    assert supervised.proc.wait(20) == 0
    out = supervised.output()
    assert sorted(re.findall(r"process (\d) got SIGTERM", out)) == ["1", "2", "3"]
    assert out.rstrip().endswith("recallq worker: stopped.")
    assert not any(child.is_running() for child in children)


def test_sigint_reaches_every_process_as_one_sigterm(started) -> None:
    """Ctrl-C in a terminal reaches every process of the group itself; the supervisor adds
    a SIGTERM, which Celery takes as the same warm shutdown (a second SIGINT would be a cold
    one). Sent to the supervisor alone, the processes get the SIGTERM only."""
    supervised = _start(started, "serve", 2)
    supervised.wait_for(lambda out: "ready." in out)
    supervised.proc.send_signal(signal.SIGINT)
    assert supervised.proc.wait(20) == 0
    assert sorted(re.findall(r"process (\d) got SIGTERM", supervised.output())) == ["1", "2"]


def test_a_killed_process_is_replaced_under_its_number(started) -> None:
    supervised = _start(started, "serve", 2)
    supervised.wait_for(lambda out: "ready." in out)
    victim = supervised.children()[0]
    victim.kill()
    # young (it lived under 10 s): replaced after a second, not at once
    killed = rf"process (\d) \(pid {victim.pid}\) killed by SIGKILL; starting another in 1 s"
    supervised.wait_for(lambda out: re.search(killed, out))
    number = re.findall(killed, supervised.output())[0]
    supervised.wait_for(lambda out: f"process {number} is back (pid " in out)
    back = re.search(rf"process {number} is back \(pid (\d+)\)", supervised.output())
    assert back is not None
    pids = {child.pid for child in supervised.children()}
    assert len(pids) == 2 and int(back.group(1)) in pids and victim.pid not in pids
    assert supervised.output().count(" ready.") == 1  # the command was ready once


def test_a_process_that_cannot_start_stops_the_command_with_its_line(started) -> None:
    supervised = _start(started, "fail", 2)
    assert supervised.proc.wait(20) == 2
    out = supervised.output()
    # the other process may have said it stopped, never more than once
    assert out.strip().splitlines()[-1] == "recallq: the database has no recallq schema"
    assert out.count("recallq:") == 1 and "Traceback" not in out


def test_a_process_that_exits_before_it_is_ready_stops_the_command(started) -> None:
    """As Celery does on a broker URL it cannot use: it logs why, and exits 1."""
    supervised = _start(started, "quit", 2)
    assert supervised.proc.wait(20) == 2
    said = r"recallq: worker process [12] exited with code 1 before it was ready \(see above\)"
    assert re.fullmatch(said, supervised.output().strip().splitlines()[-1])


def test_a_process_that_keeps_dying_is_replaced_ever_later(started) -> None:
    supervised = _start(started, "crash", 2)
    supervised.wait_for(lambda out: "starting another in 2 s" in out, timeout=30)
    out = supervised.output()
    delays = re.findall(
        r"process 2 \(pid \d+\) exited with code 3; starting another in (\d+) s", out
    )
    assert delays[:2] == ["1", "2"]
    assert "process 1" not in out  # the other one runs on
    assert supervised.proc.poll() is None


def test_a_replacement_that_cannot_start_is_tried_again(started) -> None:
    """After the command started, one process's failure is not every process's: the others
    go on, and the replacement is tried again (after a backoff), its reason said each time."""
    supervised = _start(started, "refuse", 2)
    supervised.wait_for(lambda out: "ready." in out)
    supervised.children()[0].kill()
    supervised.wait_for(
        lambda out: (
            "exited with code 2 (the database has no recallq schema); starting another" in out
        )
    )
    assert supervised.proc.poll() is None and len(supervised.children()) >= 1


def test_the_processes_die_with_a_sigkilled_supervisor(started) -> None:
    supervised = _start(started, "serve", 2)
    supervised.wait_for(lambda out: "ready." in out)
    children = supervised.children()
    os.kill(supervised.proc.pid, signal.SIGKILL)  # the supervisor alone
    supervised.proc.wait(10)
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert alive == [], "a worker process outlived its supervisor"
