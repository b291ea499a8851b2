"""`recallq worker --processes N` against N commands of one process (issue 29): start to
ready, memory once warm, and a CPU-bound run (a short stub latency, so the workers' CPU per
item is the limit: one process cannot pass 1000 / its CPU ms per item, whatever its threads).

"Ready" is the line `recallq worker: N processes x M threads ready.` that the command prints
once every process takes tasks.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import psutil

from bench import harness


def _tree(process: harness.Process) -> list[psutil.Process]:
    root = psutil.Process(process.proc.pid)
    return [root, *root.children(recursive=True)]


def _start(env: dict[str, str], commands: int, processes: int, threads: int) -> dict[str, Any]:
    """`commands` worker commands started at once; wall and CPU until each said ready."""
    args = ["worker", "--processes", str(processes), "--concurrency", str(threads)]
    started = time.perf_counter()
    procs = [harness.Process(args, env, "worker") for _ in range(commands)]
    for proc in procs:
        proc.wait_for_output(" ready.", timeout=180)
    return {
        "procs": procs,
        "ready_s": time.perf_counter() - started,
        "ready_cpu_s": harness.cpu_seconds(procs),
    }


class _PeakCores:
    """The most CPU the workers used in any one second of the run, in cores (sampled)."""

    def __init__(self, procs: list[harness.Process]) -> None:
        self._procs, self.peak = procs, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        last, at = harness.cpu_seconds(self._procs), time.perf_counter()
        while not self._stop.wait(1.0):
            now, cpu = time.perf_counter(), harness.cpu_seconds(self._procs)
            self.peak = max(self.peak, (cpu - last) / (now - at))
            last, at = cpu, now

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def _memory(procs: list[harness.Process]) -> tuple[float, float]:
    """USS and PSS in MiB, summed over every process of the commands."""
    uss = pss = 0
    for proc in procs:
        for p in _tree(proc):
            info = p.memory_full_info()
            uss, pss = uss + info.uss, pss + info.pss
    return uss / 2**20, pss / 2**20


def measure(args: argparse.Namespace, commands: int, processes: int) -> dict[str, Any]:
    threads = args.big_concurrency
    with harness.environment(args.processes_latency_ms) as env:
        api, url = harness.start_api(env["env"])
        result = _start(env["env"], commands, processes, threads)
        procs = result.pop("procs")
        warm, _ = harness.submit_file(url, harness.ndjson_file(40, "warm", env["dir"]))
        harness.wait(url, warm)  # litellm's first calls in every process, before timing
        n = args.processes_items
        path = harness.ndjson_file(n, f"p{commands}x{processes}", env["dir"])
        cpu_before = harness.cpu_seconds(procs)
        started = time.perf_counter()
        peak = _PeakCores(procs)
        run = harness.wait(url, harness.submit_file(url, path)[0])
        elapsed = time.perf_counter() - started
        cpu = harness.cpu_seconds(procs) - cpu_before
        result["peak_cores"] = peak.stop()
        uss, pss = _memory(procs)
        for p in [api, *procs]:
            p.stop()
    return result | {
        "label": f"{commands} command{'s' if commands > 1 else ''} x {processes} process"
        + ("es" if processes > 1 else ""),
        "items_per_s": n / elapsed,
        "cores": cpu / elapsed,  # worker CPU seconds per second: above 1, more than one core
        "cpu_ms": cpu / n * 1000,
        "uss": uss,
        "pss": pss,
        "failed": run["counts"]["failed"],
    }


def rows(args: argparse.Namespace) -> list[tuple[str, ...]]:
    table: list[tuple[str, ...]] = [
        (
            "workers",
            "start to ready",
            "CPU to ready",
            "items/s",
            "worker cores busy",
            "busiest second",
            "CPU ms/item",
            "USS MiB",
            "PSS MiB",
        )
    ]
    for commands, processes in ((1, 1), (1, 2), (2, 1)):
        r = measure(args, commands, processes)
        table.append(
            (
                r["label"],
                f"{r['ready_s']:.1f} s",
                f"{r['ready_cpu_s']:.1f} s",
                f"{r['items_per_s']:.1f}",
                f"{r['cores']:.2f}",
                f"{r['peak_cores']:.2f} cores",
                f"{r['cpu_ms']:.1f}",
                f"{r['uss']:.0f}",
                f"{r['pss']:.0f}",
            )
        )
    return table
