"""N processes from one command: forked from this one after it imported everything once, kept
at N, and stopped together (gunicorn's preload-then-fork, dramatiq's --processes).

    supervisor (imports once) ──fork──► process 1 .. N   each runs `target(child)`
        ◄── "ready", or "failed <one line>" before it was ready, through a pipe of its own
    all N ready at first          one line: "<name>: N processes x <each> ready."
    a process dies                it is replaced (at once; after a backoff if it died young)
    one exits before it is ready  at start: every process would, so the command stops with
                                  its line (exit 2); later (a replacement): it is replaced
    SIGTERM, SIGINT or SIGHUP     every process gets SIGTERM (Celery's warm shutdown: tasks
                                  in flight finish, unstarted ones go back); wait; exit 0
    the supervisor SIGKILLed      the kernel SIGKILLs its processes (PR_SET_PDEATHSIG): their
                                  items come back through the reaper, as any killed worker's

The supervisor runs no thread and opens no connection: only sockets handed to the processes on
purpose (the metrics listener) cross a fork, and every process builds its own clients.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from recallq.core.exits import CommandError

#: A process that dies sooner than this after it started is replaced after a backoff (1 s,
#: doubling up to MAX_BACKOFF): one that crashes as it starts does not spin.
YOUNG = 10.0
MAX_BACKOFF = 30.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, within a cgroup v2 CPU quota when one is
    set (in a container, os.cpu_count() is the node's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(
    root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPUs this process's cgroup (v2) and its parents allow (`cpu.max`: quota over
    period, the smallest on the way up), or None without a limit or without cgroup v2."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    found: float | None = None
    directory = root / path.strip("/")
    while True:
        try:
            quota, period = (directory / "cpu.max").read_text().split()
            if quota != "max":
                allowed = int(quota) / int(period)
                found = allowed if found is None else min(found, allowed)
        except (OSError, ValueError):
            pass
        if directory == root or root not in directory.parents:
            return found
        directory = directory.parent


class Child:
    """What a forked process knows of its place, and how it tells the supervisor it is ready."""

    def __init__(self, number: int, first: bool, report: int) -> None:
        self.number = number  # 1..N: a replacement takes the number of the process it replaces
        self.first = first  # the first process of this number (not a replacement)
        self._report = report
        self.is_ready = False

    def ready(self) -> None:
        """This process takes work now."""
        if not self.is_ready:
            self.is_ready = True
            os.write(self._report, b"ready\n")

    def failed(self, line: str) -> None:
        """This process cannot start, for the reason in `line` (the supervisor says it)."""
        os.write(self._report, f"failed {' '.join(line.split())}\n".encode())


@dataclass
class _Slot:
    """One of the N places, and the process holding it now."""

    number: int
    pid: int | None = None
    report: int | None = None  # the read end of the process's pipe
    received: bytes = b""
    started_at: float = 0.0
    ready: bool = False
    failure: str | None = None  # the line the process said it failed to start with
    young_deaths: int = 0  # deaths in a row, each within YOUNG seconds of its start
    start_at: float | None = None  # when to start its next process
    starts: int = 0


@dataclass
class Supervisor:
    """Runs `target` in `processes` forked processes until a signal stops them.

    `target(child)` calls `child.ready()` once it takes work and returns the process's exit
    code. An exception it raises before that is a failure to start, told in the one line
    `explain` makes of it. `each` says what one process is ("8 threads"), for the ready line.
    `on_exit(pid)` runs in the supervisor for every process that ended.
    """

    processes: int
    target: Callable[[Child], int]
    explain: Callable[[BaseException], str]
    name: str = "recallq worker"
    each: str = ""
    on_exit: Callable[[int], None] = lambda pid: None
    _slots: list[_Slot] = field(init=False)
    _pid: int = field(init=False)  # the supervisor's
    _selector: selectors.BaseSelector = field(init=False)  # the pipes it waits on
    _wake: tuple[int, int] = field(init=False)  # where a signal ends its wait (read, write)
    _signals: list[int] = field(default_factory=list, init=False)
    _stopping: bool = field(default=False, init=False)
    _announced: bool = field(default=False, init=False)
    _failure: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise CommandError("--processes: at least 1")
        self._slots = [_Slot(number) for number in range(1, self.processes + 1)]

    def run(self) -> int:
        """Start the processes and keep them at N until a signal stops them; 0 then. Raises
        CommandError when a process failed as the command started."""
        self._pid = os.getpid()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(wake_read, selectors.EVENT_READ)
        self._wake = (wake_read, wake_write)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _HANDLED}
        old_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        try:
            for slot in self._slots:
                self._start(slot)
            while not (self._stopping and not self._running()):
                self._wait()
                self._read_signals()
                self._reap()
                self._start_due()
                self._announce()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            os.close(wake_read)
            os.close(wake_write)
        if self._failure is not None:
            raise CommandError(self._failure)
        self._say("stopped.")
        return 0

    # --- the supervisor's loop ------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)  # handled in the loop (the wakeup fd ends its wait)

    def _wait(self) -> None:
        due = [s.start_at for s in self._slots if s.start_at is not None and not self._stopping]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake[0]:
                _drain(key.fd)
            else:
                self._read_report(next(s for s in self._slots if s.report == key.fd))

    def _read_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self._stop(f"{signal.Signals(signum).name}: stopping")

    def _stop(self, why: str) -> None:
        """Every process gets SIGTERM (again, if a second signal came): Celery's warm shutdown
        is the same every time, where a second SIGINT would be a cold one."""
        if not self._stopping:
            running = self._running()
            self._say(
                f"{why} {len(running)} process{'es' if len(running) != 1 else ''} "
                "(tasks in flight finish, unstarted ones go back to the queue)"
            )
        self._stopping = True
        for slot in self._running():
            _signal(slot.pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((s for s in self._slots if s.pid == pid), None)
            if slot is not None:
                self._ended(slot, os.waitstatus_to_exitcode(status))

    def _ended(self, slot: _Slot, code: int) -> None:
        pid, lived = slot.pid, time.monotonic() - slot.started_at
        assert pid is not None
        self._read_report(slot, to_the_end=True)
        slot.pid = None
        self.on_exit(pid)
        if self._stopping:
            return
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        if not self._announced and not slot.ready and code >= 0:
            # it gave up as the command starts (a killed one is replaced): every process
            # would, the same way (a database it cannot use, a bad models file), so the
            # command stops with the reason
            self._failure = slot.failure or (
                f"worker process {slot.number} {how} before it was ready (see above)"
            )
            self._stopping = True
            for other in self._running():
                _signal(other.pid, signal.SIGTERM)
            return
        slot.young_deaths = slot.young_deaths + 1 if lived < YOUNG else 0
        delay = min(2.0 ** (slot.young_deaths - 1), MAX_BACKOFF) if slot.young_deaths else 0.0
        reason = f" ({slot.failure})" if slot.failure else ""
        when = f"in {delay:g} s" if delay else "now"
        self._say(f"process {slot.number} (pid {pid}) {how}{reason}; starting another {when}")
        slot.start_at = time.monotonic() + delay

    def _start_due(self) -> None:
        if self._stopping:
            return
        now = time.monotonic()
        for slot in self._slots:
            if slot.start_at is not None and slot.start_at <= now:
                self._start(slot)

    def _announce(self) -> None:
        if not self._announced and not self._stopping and all(s.ready for s in self._slots):
            self._announced = True
            count = f"{self.processes} process{'es' if self.processes != 1 else ''}"
            self._say(f"{count} x {self.each} ready." if self.each else f"{count} ready.")

    def _read_report(self, slot: _Slot, to_the_end: bool = False) -> None:
        """What the process wrote; with `to_the_end`, all of it (it ended: its end is closed)."""
        while slot.report is not None:
            try:
                chunk = os.read(slot.report, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self._selector.unregister(slot.report)
                os.close(slot.report)
                slot.report = None
                return
            slot.received += chunk
            *lines, slot.received = slot.received.split(b"\n")
            for line in lines:
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "ready":
                    slot.ready = True
                    if self._announced:
                        self._say(f"process {slot.number} is back (pid {slot.pid})")
                elif word == "failed":
                    slot.failure = rest
            if not to_the_end:
                return

    def _running(self) -> list[_Slot]:
        return [slot for slot in self._slots if slot.pid is not None]

    def _say(self, line: str) -> None:
        print(f"{self.name}: {line}", file=sys.stderr, flush=True)

    # --- forking --------------------------------------------------------------------------

    def _start(self, slot: _Slot) -> None:
        read, write = os.pipe()
        sys.stdout.flush()  # else each process would write what the buffers hold again
        sys.stderr.flush()
        # the objects imported so far leave the collector's generations: a collection in a
        # process does not touch (and so copy) the pages it shares with the others
        gc.freeze()
        # held until each side has its handlers: the process starts with the defaults, the
        # supervisor keeps its own
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(read)
                    code = self._child(Child(slot.number, slot.starts == 0, write))
                finally:  # whatever happened, never into the supervisor's code
                    os._exit(code)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)  # (the child: its own)
        os.close(write)
        os.set_blocking(read, False)
        self._selector.register(read, selectors.EVENT_READ)
        slot.pid, slot.report, slot.received = pid, read, b""
        slot.started_at, slot.start_at = time.monotonic(), None
        slot.ready, slot.failure = False, None
        slot.starts += 1

    def _child(self, child: Child) -> int:
        """In the forked process: leave the supervisor's state, run the target; the exit code."""
        code = 1
        try:
            _die_with_parent()
            if os.getppid() != self._pid:  # the supervisor died before the line above
                return 1
            signal.set_wakeup_fd(-1)
            for sig in _HANDLED:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
            self._selector.close()
            for fd in (*self._wake, *(s.report for s in self._slots if s.report is not None)):
                os.close(fd)
            code = self.target(child)
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:
            line = self.explain(exc)
            if child.is_ready:
                print(f"{self.name}: process {child.number}: {line}", file=sys.stderr)
            else:
                child.failed(line)
            code = 2
        finally:
            _flush()
        return code


#: the signals the supervisor handles (SIGCHLD only ends its wait: the loop reaps)
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def _die_with_parent() -> None:
    """SIGKILL this process when the supervisor dies (Linux; elsewhere it may outlive it)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _signal(pid: int | None, signum: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):  # ended, not reaped yet
            os.kill(pid, signum)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 4096):
            pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or its reader gone
            stream.flush()
