"""HTTP client side of the CLI: submit, status, results, cancel, retry."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from tqdm import tqdm

TERMINAL = ("completed", "cancelled", "failed")


def _fail(response: httpx.Response) -> int:
    try:
        error = response.json()["error"]
        print(
            f"recallq: {response.status_code} {error['code']}: {error['message']}", file=sys.stderr
        )
    except (ValueError, KeyError, TypeError):
        print(f"recallq: HTTP {response.status_code}: {response.text[:300]}", file=sys.stderr)
    return 1


def _cli_errors(command: Callable[..., int]) -> Callable[..., int]:
    """An unreachable API is one line, not a traceback; a closed pipe (`| head`) ends quietly."""

    @functools.wraps(command)
    def run(args: argparse.Namespace, *rest: str) -> int:
        try:
            return command(args, *rest)
        except httpx.TransportError as exc:
            print(
                f"recallq: cannot reach the API at {args.api} ({type(exc).__name__}: {exc}); "
                "pass --api or set RECALLQ_API_URL",
                file=sys.stderr,
            )
            return 2
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return run


def _stream_file(path: Path, bar: tqdm) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(256 * 1024):
            bar.update(len(chunk))
            yield chunk


@_cli_errors
def submit(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    fields = ("model", "scale", "name", "context", "context_extractor")
    params = {k: v for k in fields if (v := getattr(args, k)) is not None}
    params.setdefault("name", args.file.name)
    if getattr(args, "batch", False):
        params["mode"] = "batch"
    size = args.file.stat().st_size
    with tqdm(total=size, unit="B", unit_scale=True, desc="upload", file=sys.stderr) as bar:
        response = httpx.post(
            f"{args.api}/v1/runs",
            params=params,
            content=_stream_file(args.file, bar),
            headers={"Content-Type": "application/x-ndjson"},
            timeout=httpx.Timeout(30, read=600),
        )
    if response.status_code != 202:
        return _fail(response)
    run = response.json()
    print(run["id"])
    if args.wait:
        return _wait(args.api, run["id"])
    return 0


def _wait(api: str, run_id: str) -> int:
    while True:
        run = httpx.get(f"{api}/v1/runs/{run_id}", timeout=30).json()
        counts, lane = run["counts"], run.get("batch")
        batches = f", {lane['batches_pending']} provider batch(es) pending" if lane else ""
        print(
            f"\r{run['status']}: {counts['succeeded']} scored, {counts['failed']} failed, "
            f"{counts['pending'] + counts['running']} to go{batches}",
            end="",
            file=sys.stderr,
        )
        if run["status"] in TERMINAL:
            print(file=sys.stderr)
            print(json.dumps(run, indent=2))
            return 0
        time.sleep(1)


@_cli_errors
def status(args: argparse.Namespace) -> int:
    response = httpx.get(f"{args.api}/v1/runs/{args.run_id}", timeout=30)
    if response.status_code != 200:
        return _fail(response)
    print(json.dumps(response.json(), indent=2))
    return 0


@_cli_errors
def results(args: argparse.Namespace) -> int:
    url = f"{args.api}/v1/runs/{args.run_id}/results"
    with httpx.stream("GET", url, params={"format": args.format}, timeout=None) as response:
        if response.status_code != 200:
            response.read()
            return _fail(response)
        out = args.out.open("wb") if args.out else sys.stdout.buffer
        try:
            for chunk in response.iter_bytes():
                out.write(chunk)
            out.flush()  # here, where a closed pipe is caught, not at interpreter exit
        finally:
            if args.out:
                out.close()
    return 0


@_cli_errors
def post_action(args: argparse.Namespace, action: str) -> int:
    response = httpx.post(f"{args.api}/v1/runs/{args.run_id}/{action}", timeout=60)
    if response.status_code not in (200, 202):
        return _fail(response)
    print(json.dumps(response.json(), indent=2))
    return 0
