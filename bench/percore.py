"""Worker CPU per item (issue 29): one `recallq worker` command against the stub judge, the
issue's harness (400 items, 16 threads, stub latency 300 ms), measured once it is warm.

With `--percore-baseline DIR` (a checkout of another commit, e.g. `git worktree add` or
`git archive | tar -x`), the same measurement alternates between that tree's worker and this
one's, round after round, in one run on one machine: the other load of the machine then falls
on both alike, and the table quotes each side's range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness

REPO = Path(__file__).resolve().parent.parent
# RAGAS 0.4.3 on this machine kind, same stub, same 400 items (issue 29's side-by-side run): the
# row printed when no RAGAS venv is given (--percore-ragas)
RAGAS_ITEMS_PER_S = 22.4
RAGAS_CPU_MS = 34.0
RAGAS = "RAGAS 0.4.3"


class TreeWorker(harness.Process):
    """`recallq worker` started as a new interpreter from `tree` (its own recallq package)."""

    def __init__(self, tree: Path, args: list[str], env: dict[str, str]) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="recallq-percore-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(  # type: ignore[assignment]
            [sys.executable, "-m", "recallq.cli", *args],
            env={**env, "PYTHONPATH": str(tree)},
            cwd=tree,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def one_round(
    env: dict[str, Any], url: str, tree: Path, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    command = ["worker"]  # 0 for either: the command's default
    if args.percore_processes:
        command += ["--processes", str(args.percore_processes)]
    if args.percore_threads:
        command += ["--concurrency", str(args.percore_threads)]
    worker = TreeWorker(tree, command, env["env"])
    try:
        worker.wait_for_output(" ready.", timeout=180)
        warm, _ = harness.submit_file(url, harness.ndjson_file(40, f"w{tag}", env["dir"]))
        harness.wait(url, warm)  # litellm's first calls, before anything is timed
        n = args.percore_items
        path = harness.ndjson_file(n, tag, env["dir"])
        before = harness.cpu_seconds([worker])
        started = time.perf_counter()
        run = harness.wait(url, harness.submit_file(url, path)[0])
        elapsed = time.perf_counter() - started
        cpu = harness.cpu_seconds([worker]) - before
    finally:
        worker.stop()
    assert run["counts"]["succeeded"] == n, run["counts"]
    return {"items_per_s": n / elapsed, "cpu_ms": cpu / n * 1000}


def _local_cpu(tree: Path, env: dict[str, str], path: Path, database: Path) -> float:
    """CPU seconds of `recallq run FILE --model M` (local mode, one process) from `tree`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "recallq.cli", "run", str(path), "--model", harness.MODEL],
        env={**env, "PYTHONPATH": str(tree), "RECALLQ_DATABASE_URL": f"sqlite:///{database}"},
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"recallq run exited with {status}"
    return usage.ru_utime + usage.ru_stime


def local_round(
    env: dict[str, Any], tree: Path, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    """Local mode's CPU per item: a run of the items less a run of a tenth of them (the
    import and start-up, the same in both), over the difference in items."""
    n, few = args.percore_items, max(1, args.percore_items // 10)
    directory = Path(tempfile.mkdtemp(prefix="recallq-percore-local-"))
    started = time.perf_counter()
    cpu = _local_cpu(
        tree, env["env"], harness.ndjson_file(n, f"l{tag}", directory), directory / "a.db"
    )
    elapsed = time.perf_counter() - started
    base = _local_cpu(
        tree, env["env"], harness.ndjson_file(few, f"f{tag}", directory), directory / "b.db"
    )
    return {"items_per_s": n / elapsed, "cpu_ms": (cpu - base) / (n - few) * 1000}


def ragas_python(args: argparse.Namespace) -> Path | None:
    """The RAGAS venv's interpreter, or None (the row is then skipped, said in one line)."""
    if not args.percore_ragas:
        print("  (RAGAS row not measured: no --percore-ragas VENV (or RAGAS_VENV) given)")
        return None
    python = Path(args.percore_ragas) / "bin" / "python"
    if not python.exists():
        print(f"  (RAGAS row not measured: {python} is missing)")
        return None
    return python


def ragas_round(env: dict[str, Any], python: Path, n: int, tag: str) -> dict[str, float]:
    """RAGAS's context recall (bench/ragas_run.py, its own process) over the same items as
    recallq's round `tag`, against the same stub: warm-up 40 items, then n timed."""
    warm = harness.ndjson_file(40, f"w{tag}", env["dir"])
    path = harness.ndjson_file(n, tag, env["dir"])
    log = Path(tempfile.mkstemp(prefix="recallq-percore-ragas-", suffix=".log")[1])
    with log.open("wb") as errors:
        done = subprocess.run(
            [str(python), str(REPO / "bench" / "ragas_run.py"), "--warmup", str(warm), str(path)]
            + ["--base-url", env["stub"].base_url, "--max-workers", "16"],
            stdout=subprocess.PIPE,
            stderr=errors,
            env={**os.environ, "RAGAS_DO_NOT_TRACK": "true"},
            timeout=1800,
            check=False,
        )
    assert done.returncode == 0, f"bench/ragas_run.py exited {done.returncode}, see {log}"
    found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert found["items"] == n, found
    return {"items_per_s": n / found["seconds"], "cpu_ms": found["cpu_s"] / n * 1000}


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    trees = {"this tree": REPO}
    if args.percore_baseline:
        trees = {"baseline": Path(args.percore_baseline).resolve(), **trees}
    found: dict[str, list[dict[str, float]]] = {}
    ragas = ragas_python(args)
    with harness.environment(args.percore_latency_ms) as env:
        api, url = harness.start_api(env["env"])
        try:
            for r in range(args.percore_rounds):
                for name, tree in trees.items():
                    kinds = ["worker", "local mode"] if args.percore_local else ["worker"]
                    for kind in kinds:
                        label, tag = f"{name}, {kind}", f"{name[0]}{kind[0]}{r}"
                        if kind == "worker":
                            result = one_round(env, url, tree, args, tag)
                        else:
                            result = local_round(env, tree, args, tag)
                        _keep(found, label, r, result)
                if ragas is not None:  # this tree's worker items of the round, the same stub
                    _keep(found, RAGAS, r, ragas_round(env, ragas, args.percore_items, f"tw{r}"))
        finally:
            api.stop()
    return found


def _keep(found: dict[str, list[dict[str, float]]], label: str, r: int, result: dict) -> None:
    found.setdefault(label, []).append(result)
    print(
        f"  ({label}, round {r + 1}: {result['items_per_s']:.1f} items/s, "
        f"{result['cpu_ms']:.1f} ms CPU/item)",
        flush=True,
    )


def _range(values: list[float], digits: int = 1) -> str:
    low, high = min(values), max(values)
    if round(low, digits) == round(high, digits):
        return f"{low:.{digits}f}"
    return f"{low:.{digits}f}-{high:.{digits}f}"


def rows(args: argparse.Namespace) -> list[tuple[str, ...]]:
    table: list[tuple[str, ...]] = [
        ("worker", "rounds", "items/s", "worker CPU ms/item", "median CPU ms/item")
    ]
    measured = measure(args)
    ragas = measured.pop(RAGAS, None)
    for name, results in measured.items():
        cpu = [r["cpu_ms"] for r in results]
        table.append(
            (
                f"recallq ({name})",
                str(len(results)),
                _range([r["items_per_s"] for r in results]),
                _range(cpu),
                f"{statistics.median(cpu):.1f}",
            )
        )
    if ragas is None:
        table.append(
            (
                f"{RAGAS} (issue 29's figures)",
                "-",
                f"{RAGAS_ITEMS_PER_S:.1f}",
                f"{RAGAS_CPU_MS:.1f} (whole process)",
                "-",
            )
        )
        return table
    cpu = [r["cpu_ms"] for r in ragas]
    table.append(
        (
            f"{RAGAS} (whole process, measured)",
            str(len(ragas)),
            _range([r["items_per_s"] for r in ragas]),
            _range(cpu),
            f"{statistics.median(cpu):.1f}",
        )
    )
    for name, results in measured.items():  # each round against RAGAS's round beside it
        pairs = list(zip(results, ragas, strict=False))
        speed = [ours["items_per_s"] / theirs["items_per_s"] for ours, theirs in pairs]
        cost = [ours["cpu_ms"] / theirs["cpu_ms"] for ours, theirs in pairs]
        table.append(
            (
                f"ratio recallq ({name}) / RAGAS",
                str(len(pairs)),
                _range(speed, 2) + "x",
                _range(cost, 2) + "x",
                f"{statistics.median(cost):.2f}x",
            )
        )
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--percore-items", type=int, default=400)
    parser.add_argument("--percore-threads", type=int, default=16, help="0: the default")
    parser.add_argument("--percore-processes", type=int, default=1, help="0: the default")
    parser.add_argument("--percore-latency-ms", type=float, default=300)
    parser.add_argument("--percore-rounds", type=int, default=3)
    parser.add_argument("--percore-baseline", default="", help="another tree, interleaved")
    parser.add_argument(
        "--percore-ragas",
        default=os.environ.get("RAGAS_VENV", ""),
        help="a venv with RAGAS 0.4.3: a RAGAS row measured in each round ($RAGAS_VENV)",
    )
    parser.add_argument(
        "--percore-local", action="store_true", help="also local mode (`recallq run FILE`)"
    )
