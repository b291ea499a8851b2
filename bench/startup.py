"""What users wait for before recallq does anything (issue 25): `python -m bench --sections
startup`. Prints a table; asserts nothing.

Every figure is the median of a few runs of the command as users run it (the `recallq` script
of this environment, in a fresh directory, none of recallq's settings in the environment):
CPU is the child's own (user + system, from wait4's rusage), wall is from just before the
process starts. The progress line is read from stderr as a pipe (a CI log: the line
`queued: 0 scored, ...`); the first judge request is the time the stub LLM server received it;
the CPU by either moment is read from /proc while the command runs. The bare import beside them
is `python -c "import os, litellm; os._exit(0)"`, run just before each.
The install is measured in a fresh venv with pip's cache as it is (warm on this machine).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Row = tuple[str, ...]

REPO = Path(__file__).resolve().parent.parent
RECALLQ = Path(sys.executable).with_name("recallq")
PROGRESS = re.compile(r"^\w+: \d+ scored, \d+ failed, \d+ to go")
READY = " ready."
#: litellm imported in a fresh interpreter, which then ends at once: tearing litellm's modules
#: down costs ~2 s of CPU more, which nothing before a first judge request pays
BARE_IMPORT = "import os, litellm; os._exit(0)"


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RECALLQ_")}
    return base | {"LITELLM_LOCAL_MODEL_COST_MAP": "True"} | extra


def _cpu(rusage: resource.struct_rusage) -> float:
    return rusage.ru_utime + rusage.ru_stime


class Timed:
    """One run of a command: its wall seconds, its CPU seconds, when each stderr line came
    (seconds after the start), and its CPU seconds so far every few milliseconds (from
    /proc), to read the CPU it had used by a moment (cpu_at)."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.samples: list[tuple[float, float]] = []
        self.started_at = time.time()
        self._started = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdout=out, stderr=subprocess.PIPE, text=True
            )
            sampler = threading.Thread(target=self._sample, args=(process.pid,), daemon=True)
            sampler.start()
            assert process.stderr is not None
            for line in process.stderr:
                self.lines.append((self._since(), line.rstrip("\n")))
            _, status, rusage = os.wait4(process.pid, 0)
            self.wall = self._since()
            process.returncode = self.code = os.waitstatus_to_exitcode(status)
            self.cpu = _cpu(rusage)
            sampler.join()
            out.seek(0)
            self.stdout = out.read()

    def _since(self) -> float:
        return time.perf_counter() - self._started

    def _sample(self, pid: int) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while True:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:  # waited for
                return
            if fields[0] == "Z":  # exited
                return
            self.samples.append((self._since(), (int(fields[11]) + int(fields[12])) / tick))
            time.sleep(0.005)

    def first(self, pattern: re.Pattern[str]) -> float | None:
        return next((t for t, line in self.lines if pattern.search(line)), None)

    def cpu_at(self, moment: float | None) -> float | None:
        """CPU seconds used by `moment` (seconds after the start): the last sample before it."""
        if moment is None:
            return None
        return max((cpu for t, cpu in self.samples if t <= moment), default=None)

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _recallq(*args: str) -> list[str]:
    return [str(RECALLQ), *args] if RECALLQ.exists() else [sys.executable, "-m", "recallq.cli"]


@contextmanager
def _directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="recallq-startup-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def commands(runs: int) -> dict[str, Any]:
    """`recallq --help`; the README's first command in a new directory (a new database); then
    `recallq runs` and `recallq status RUN` on that database."""
    result: dict[str, list[Timed]] = {"help": [], "first": [], "runs": [], "status": []}
    example = str(REPO / "examples" / "eval_set.jsonl")
    for _ in range(runs):
        with _directory() as cwd:
            result["help"].append(Timed(_recallq("--help"), cwd, _env()))
            first = Timed(_recallq("run", example), cwd, _env())
            assert first.code == 0, first.stderr()
            result["first"].append(first)
            result["runs"].append(Timed(_recallq("runs"), cwd, _env()))
            run_id = re.search(r"recallq results (\S+)", first.stdout)
            if run_id is not None:
                result["status"].append(Timed(_recallq("status", run_id.group(1)), cwd, _env()))
    return result


def llm_run(runs: int, items: int, latency_ms: float) -> dict[str, Any]:
    """`recallq run FILE --model M` against the stub (a new database each time), beside a
    bare `import litellm` in a fresh interpreter."""
    from bench import harness
    from tests.services import write_models_file
    from tests.stub_llm import StubServer

    bare: list[Timed] = []
    timed: list[Timed] = []
    first_request: list[float | None] = []
    with StubServer(latency_ms=latency_ms, record_messages=False) as stub, _directory() as cwd:
        path = harness.ndjson_file(items, "startup", cwd)
        env = _env(
            RECALLQ_MODELS_FILE=str(write_models_file(cwd, stub.base_url)),
            STUB_API_KEY="sk-bench",
        )
        for i in range(runs):
            bare.append(Timed([sys.executable, "-c", BARE_IMPORT], cwd, _env()))
            stub.reset()
            env["RECALLQ_DATABASE_URL"] = f"sqlite:///{cwd / f'run{i}.db'}"
            run = Timed(_recallq("run", str(path), "--model", harness.MODEL), cwd, env)
            assert run.code == 0, run.stderr()
            timed.append(run)
            sent = [call["t"] for call in stub.calls()]
            first_request.append(min(sent) - run.started_at if sent else None)
    progress = [t.first(PROGRESS) for t in timed]
    request_cpu = [t.cpu_at(r) for t, r in zip(timed, first_request, strict=True)]
    return {
        "import_wall": _median([t.wall for t in bare]),
        "import_cpu": _median([t.cpu for t in bare]),
        "progress": _median(progress),
        "progress_cpu": _median([t.cpu_at(p) for t, p in zip(timed, progress, strict=True)]),
        "request": _median(first_request),
        "request_cpu": _median(request_cpu),
        # each run beside the bare import run just before it (the machine's load drifts)
        "gap": _median([_minus(r, b.wall) for r, b in zip(first_request, bare, strict=True)]),
        "gap_cpu": _median([_minus(c, b.cpu) for c, b in zip(request_cpu, bare, strict=True)]),
        "wall": _median([t.wall for t in timed]),
        "cpu": _median([t.cpu for t in timed]),
        "items": items,
        "latency_ms": latency_ms,
    }


def worker(runs: int) -> dict[str, float | None]:
    """`recallq worker` from its start to its ` ready.` line: wall, and the CPU of its process
    tree by then (on Postgres and Redis, the stub as its judge)."""
    import psutil

    from bench import harness

    walls: list[float | None] = []
    cpus: list[float | None] = []
    with harness.environment(300) as env:
        for _ in range(runs):
            started = time.perf_counter()
            process = harness.Process(["worker", "--concurrency", "8"], env["env"], "worker")
            if _ready(process):
                walls.append(time.perf_counter() - started)
                tree = psutil.Process(process.proc.pid)
                cpus.append(sum(_cpu_of(p) for p in [tree, *tree.children(recursive=True)]))
            process.stop()
    return {"wall": _median(walls), "cpu": _median(cpus)}


def _cpu_of(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _ready(process: Any, timeout: float = 180) -> bool:
    """Whether the worker printed its ` ready.` line (False: it exited, or not in time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.proc.poll() is None:
        if READY in process.output():
            return True
        time.sleep(0.02)
    return False


def install(extras: list[str]) -> list[dict[str, Any]]:
    """`pip install -e .` (and with each extra) in a fresh venv: packages, size, seconds."""
    rows = []
    for extra in ["", *extras]:
        with _directory() as directory:
            venv = directory / "venv"
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip"]
            target = f"{REPO}[{extra}]" if extra else str(REPO)
            started = time.perf_counter()
            done = subprocess.run(
                [*pip, "install", "-q", "-e", target], capture_output=True, text=True
            )
            seconds = time.perf_counter() - started
            listed = subprocess.run(
                [*pip, "list", "--format=freeze"], capture_output=True, text=True, check=True
            )
            names = [line.split("==")[0].lower() for line in listed.stdout.splitlines()]
            size = subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True)
            rows.append(
                {
                    "what": f"pip install -e {'.' if not extra else f'.[{extra}]'}",
                    "ok": done.returncode == 0,
                    "packages": len([n for n in names if n not in ("pip", "setuptools")]),
                    "mb": int(size.stdout.split()[0]),
                    "seconds": seconds,
                }
            )
    return rows


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(wall: float | None, cpu: float | None) -> str:
    return f"{_s(wall)} ({_s(cpu)})"


def _minus(value: float | None, other: float) -> float | None:
    return None if value is None else value - other


def rows(args: argparse.Namespace) -> list[Row]:
    n = args.startup_runs
    table: list[Row] = [("measure", "median", "target")]
    c = commands(n)
    cpu = {k: _median([t.cpu for t in v]) for k, v in c.items()}
    wall = {k: _median([t.wall for t in v]) for k, v in c.items()}
    table += [
        ("recallq --help: CPU s", _s(cpu["help"]), "<= 0.5"),
        ("README's first command, new database: CPU s", _s(cpu["first"]), "<= 2.0"),
        ("  its wall s", _s(wall["first"]), ""),
        ("recallq runs: CPU s", _s(cpu["runs"]), ""),
        ("recallq status RUN: CPU s", _s(cpu["status"]), ""),
    ]
    llm = llm_run(n, args.startup_items, args.startup_latency_ms)
    table += [
        (
            "bare import litellm, to its end: wall s (CPU s)",
            _pair(llm["import_wall"], llm["import_cpu"]),
            "",
        ),
        (
            "run --model M to its first progress line: wall s (CPU s)",
            _pair(llm["progress"], llm["progress_cpu"]),
            "<= 1",
        ),
        (
            "run --model M to its first judge request: wall s (CPU s)",
            _pair(llm["request"], llm["request_cpu"]),
            "",
        ),
        ("  minus the bare import's: wall s (CPU s)", _pair(llm["gap"], llm["gap_cpu"]), "<= 1"),
        (
            f"run --model M, {llm['items']} items, stub {llm['latency_ms']:.0f} ms: wall s (CPU s)",
            f"{_s(llm['wall'], 1)} ({_s(llm['cpu'], 1)})",
            "",
        ),
    ]
    if not args.startup_no_worker:
        w = worker(n)
        table += [
            ("recallq worker to ' ready.': wall s", _s(w["wall"]), ""),
            ("recallq worker to ' ready.': CPU s", _s(w["cpu"]), ""),
        ]
    if not args.startup_no_install:
        for r in install(args.startup_extras):
            state = "" if r["ok"] else " (failed)"
            table.append(
                (
                    f"{r['what']}{state}: packages, MB, s",
                    f"{r['packages']}, {r['mb']}, {r['seconds']:.0f}",
                    "",
                )
            )
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--startup-runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--startup-items", type=int, default=400, help="items of the LLM run")
    parser.add_argument("--startup-latency-ms", type=float, default=300, help="stub latency")
    parser.add_argument("--startup-no-worker", action="store_true", help="skip the worker")
    parser.add_argument("--startup-no-install", action="store_true", help="skip the installs")
    parser.add_argument(
        "--startup-extras", nargs="*", default=[], help="also install with these extras"
    )
