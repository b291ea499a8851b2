"""`python -m tests.integration.supervised MODE N`: worker.supervisor's Supervisor around a
target that needs no service, for the tests of the supervisor itself
(tests/integration/test_supervisor.py). Each process prints what happens to it.

    serve    every process is ready at once and waits for SIGTERM (then exits 0)
    fail     every process fails before it is ready (as on a database without the schema)
    quit     every process exits with code 1 before it is ready, saying nothing
    crash    as serve, but process 2 exits with code 3 0.2 s after it is ready, every time
    refuse   as serve, but a replacement fails before it is ready (as with a models file
             broken after the command started)
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from types import FrameType

from recallq.core.exits import CommandError
from worker.supervisor import Child, Supervisor


def _target(mode: str) -> Callable[[Child], int]:
    def target(child: Child) -> int:
        def stop(signum: int, frame: FrameType | None) -> None:
            print(f"process {child.number} got {signal.Signals(signum).name}", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
        if mode == "fail" or (mode == "refuse" and not child.first):
            raise CommandError("the database has no recallq schema")
        if mode == "quit":
            return 1
        child.ready()
        if mode == "crash" and child.number == 2:
            time.sleep(0.2)
            return 3
        while True:
            time.sleep(1)

    return target


def main(mode: str, processes: int) -> int:
    supervisor = Supervisor(processes, _target(mode), explain=str, each="1 thread")
    try:
        return supervisor.run()
    except CommandError as exc:
        print(f"recallq: {exc.message}", file=sys.stderr)
        return int(exc.code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
