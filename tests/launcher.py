"""`python -m recallq.cli ...` for the tests, forked from a parent that has already imported
recallq, uvicorn, Celery and litellm, instead of a new interpreter each time.

A new interpreter spends seconds of CPU importing before a command starts: ~13 s for a
worker (litellm alone ~10 s), ~4 s for the API, ~3 s for `recallq keys create`. The test
session's launcher (`python -m tests.launcher SOCKET`, started once per session) imports them
once and forks a child per command. The child is the command's real process, as the test
asked for it: its own session and process group (a test's SIGKILL of the group kills it as it
kills a started one), the test's environment, working directory, stdin, stdout and stderr
(passed as file descriptors), `sys.argv` as under `python -m recallq.cli`, Python's own
signal dispositions, and the command run by runpy as `-m` runs it: `recallq.cli.__main__`,
whose `sys.exit(main())` ends the child through the interpreter's normal exit (atexit
handlers, flushed output, non-daemon threads joined). Its exit status comes back to the test
over the request's connection, as -N for a signal N, like subprocess.Popen.returncode.

What a forked command shares with the launcher is what was built at import: modules, and
the hash seed. Nothing imported here starts a thread or opens a connection (checked at start:
a forked child would have only the forking thread); recallq computes process identity (the
worker id) after the fork (recallq.coordination.liveness.this_process_id), and Python
reseeds `random` in a child.

RECALLQ_TEST_SPAWN=1 starts every command as a new interpreter, as before (for debugging, and
for tests about the import cost itself: pass `spawn=True`).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT
#: What the launcher imports before it forks: every module a command's process loads at
#: start-up that costs time (the API's, the worker's, the CLI's, the judge's).
PRELOAD = (
    "recallq.cli",
    "recallq.cli.parser",
    "recallq.cli.services",
    "recallq.cli.local_runs",
    "recallq.cli.run_commands",
    "recallq.cli.keys",
    "recallq.cli.label_commands",
    "recallq.cli.reports",
    "recallq.cli.backends",
    "recallq.state.migrate",
    "recallq.runs.local",
    "recallq.evaluation",
    "recallq.client",
    "recallq.judge.llm",
    "recallq.judge.openai_compatible",
    "recallq.judge.litellm_transport",
    "recallq.batch.litellm_files",
    "api.app",
    "worker.celery_app",
    "worker.tasks",
    "worker.housekeeping",
    "worker.supervisor",
    "uvicorn",
    "uvicorn.main",
    "uvicorn.config",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "celery.bin.celery",
    "celery.bin.worker",
    "celery.apps.worker",
    "celery.worker",
    "celery.worker.consumer",
    "celery.concurrency.thread",
    "kombu.transport.redis",
    "alembic.command",
    "litellm",
)
_HEADER = struct.Struct("!I")
SPAWN = os.environ.get("RECALLQ_TEST_SPAWN", "") not in ("", "0")


# --- the test's side -----------------------------------------------------------------------


class Launcher:
    """The session's launcher process and how to reach it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="recallq-launcher-"))
        self.socket_path = str(self.dir / "socket")
        self.log_path = self.dir / "launcher.log"
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.launcher", self.socket_path, str(os.getpid())],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._ready = False

    def connect(self) -> socket.socket:
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the test launcher ended:\n{self.log_path.read_text()}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)
            self.log_path.unlink()
            self.dir.rmdir()


_launcher: Launcher | None = None
_launcher_lock = threading.Lock()


def launcher() -> Launcher:
    """The test session's launcher, started on first use (or early, by tests/conftest.py)."""
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = Launcher()
            atexit.register(_launcher.stop)
        return _launcher


def _fd_of(target: Any, default_read: bool, closing: list[int]) -> tuple[int, int | None]:
    """(the fd to hand to the child, our end of a pipe or None) for a Popen-style argument."""
    if target is None or target == DEVNULL:
        fd = os.open(os.devnull, os.O_RDONLY if default_read else os.O_WRONLY)
        closing.append(fd)
        return fd, None
    if target == PIPE:
        read, write = os.pipe()
        theirs, ours = (read, write) if default_read else (write, read)
        closing.append(theirs)
        return theirs, ours
    if isinstance(target, int):
        return target, None
    return target.fileno(), None


class Launched:
    """A command's process: the part of subprocess.Popen's interface the tests use."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        closing: list[int] = []
        try:
            fds: list[int] = []
            ours: list[int | None] = []
            for target, reads in ((stdin, True), (stdout, False), (stderr, False)):
                if target == STDOUT:
                    fds.append(fds[1])
                    ours.append(None)
                    continue
                fd, mine = _fd_of(target, reads, closing)
                fds.append(fd)
                ours.append(mine)
            request = json.dumps(
                {
                    "argv": self.args,
                    "env": dict(os.environ if env is None else env),
                    "cwd": str(cwd or os.getcwd()),
                }
            ).encode()
            self._conn = launcher().connect()
            socket.send_fds(self._conn, [_HEADER.pack(len(request)) + request], fds)
            self.pid = int(_read_line(self._conn))
        finally:
            for fd in closing:
                os.close(fd)
        self.stdin = _stream(ours[0], "wb", text)
        self.stdout = _stream(ours[1], "rb", text)
        self.stderr = _stream(ours[2], "rb", text)
        self._buffer = b""

    def poll(self) -> int | None:
        if self.returncode is None:
            self._receive(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._receive(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def _receive(self, timeout: float | None) -> bool:
        """Read the exit status if it comes within `timeout`; whether it came."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(64)
            except (TimeoutError, BlockingIOError):
                return False
            if not chunk:
                raise RuntimeError(f"the test launcher ended before {self.args} did")
            self._buffer += chunk
        self.returncode = int(self._buffer.split(b"\n", 1)[0])
        self._conn.close()
        return True

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> tuple[Any, Any]:
        """As Popen.communicate: feeds stdin, reads stdout and stderr (pipes) to their end."""
        results: dict[str, Any] = {}

        def drain(name: str, stream: IO[Any] | None) -> None:
            if stream is not None:
                results[name] = stream.read()
                stream.close()

        readers = [
            threading.Thread(target=drain, args=(name, stream), daemon=True)
            for name, stream in (("out", self.stdout), ("err", self.stderr))
        ]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def __enter__(self) -> Launched:
        return self

    def __exit__(self, *exc: Any) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _stream(fd: int | None, mode: str, text: bool) -> IO[Any] | None:
    if fd is None:
        return None
    raw = open(fd, mode)  # noqa: SIM115 (closed by its owner, as Popen's are)
    if text:
        return io.TextIOWrapper(raw, encoding="utf-8", write_through=mode == "wb")
    return raw


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise RuntimeError("the test launcher closed the connection")
        line += chunk
    return line


def recallq_process(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    spawn: bool = False,
    **streams: Any,
) -> Launched | subprocess.Popen[Any]:
    """`python -m recallq.cli ARGS` started as subprocess.Popen would (stdin, stdout, stderr,
    text as keyword arguments; always in a session of its own): forked from the launcher,
    or, with `spawn` or RECALLQ_TEST_SPAWN=1, a new interpreter."""
    if spawn or SPAWN:
        return subprocess.Popen(
            [sys.executable, "-m", "recallq.cli", *args],
            env=env,
            cwd=cwd,
            start_new_session=True,
            **streams,
        )
    return Launched(args, env=env, cwd=cwd, **streams)


def run_recallq(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float | None = 120,
    spawn: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m recallq.cli ARGS` to its end, as subprocess.run(..., capture_output=True,
    text=True) would: the exit code, stdout and stderr."""
    process = recallq_process(
        args,
        env=env,
        cwd=cwd,
        spawn=spawn,
        stdin=PIPE if input is not None else DEVNULL,
        stdout=PIPE,
        stderr=PIPE,
        text=True,
    )
    try:
        out, err = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    assert process.returncode is not None
    return subprocess.CompletedProcess(list(args), process.returncode, out, err)


# --- the launcher's side -------------------------------------------------------------------


class _Server:
    def __init__(self, socket_path: str, parent: int) -> None:
        self.parent = parent
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_path + ".new")
        self.listener.listen(64)
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        os.rename(socket_path + ".new", socket_path)  # ready: the tests connect from now on

    def serve(self) -> dict[str, Any] | None:
        """Forks a child per request; returns the request in the child, None in the
        launcher when it stops."""
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # pytest's Ctrl-C: pytest stops us
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self.wake_read, selectors.EVENT_READ)
        while not self.stopping:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is self.listener:
                    request = self._accept()
                    if request is not None:
                        return request
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_read, 4096)
            self._reap()
            if os.getppid() != self.parent:  # the test session is gone
                self.stopping = True
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        return None

    def _stop(self, *_: Any) -> None:
        self.stopping = True

    def _accept(self) -> dict[str, Any] | None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(30)
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while len(data) < _HEADER.size:
                data += _recv_exactly(conn, _HEADER.size - len(data))
            (size,) = _HEADER.unpack(data[: _HEADER.size])
            data = data[_HEADER.size :]
            if len(data) < size:
                data += _recv_exactly(conn, size - len(data))
            request: dict[str, Any] = json.loads(data)
        except Exception as exc:
            print(f"launcher: a bad request: {exc!r}", file=sys.stderr, flush=True)
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._in_child(conn)
            request["fds"] = fds
            return request
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        with contextlib.suppress(OSError):  # the test went away: the child is reaped all the same
            conn.sendall(b"%d\n" % pid)
        return None

    def _in_child(self, conn: socket.socket) -> None:
        """Drop everything of the launcher's: its signal handlers, sockets and pipes."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.close()
        self.listener.close()
        for other in self.children.values():
            other.close()
        os.close(self.wake_read)
        os.close(self.wake_write)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                conn.close()


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("short request")
        data += chunk
    return data


def _preload() -> None:
    import importlib

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    for name in PRELOAD:
        importlib.import_module(name)
    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if extra:  # a forked child would have only this thread: refuse rather than mislead
        raise RuntimeError(f"importing started threads, which a fork does not copy: {extra}")
    gc.collect()
    gc.freeze()  # the children's collections leave the imported objects' pages unwritten


def _run_command(request: dict[str, Any]) -> None:
    """In the child: become `python -m recallq.cli ARGV` as the test started it."""
    try:
        os.setsid()
        for target, fd in enumerate(request["fds"]):
            os.dup2(fd, target)
        for fd in set(request["fds"]):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        sys.argv = ["recallq.cli", *request["argv"]]  # runpy sets [0] to __main__.py's path
        import runpy
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)
    try:
        runpy.run_module("recallq.cli", run_name="__main__", alter_sys=True)  # sys.exit(main())
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finalize(code)


def _exit_code(exc: SystemExit) -> int:
    """The status Python exits with for an uncaught SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _finalize(code: int) -> None:
    """What the interpreter's exit does that a command can see, in its order: wait for the
    non-daemon threads, run the atexit handlers, flush stdout and stderr; then end without
    tearing down the thousands of preloaded modules (a third of a second of CPU for nothing).
    An uncaught Ctrl-C ends the process by SIGINT, as Python's exit does."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _main(socket_path: str, parent: int) -> None:
    _preload()
    server = _Server(socket_path, parent)
    request = server.serve()
    if request is not None:
        _run_command(request)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
