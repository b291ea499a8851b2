"""The CLI's client commands: submit, runs, status, results, compare, gate, cancel, retry and
resume.

They talk to the API when one is configured (`--api URL` or RECALLQ_API_URL, with
RECALLQ_API_KEY as its bearer key) and otherwise to the local database (RECALLQ_DATABASE_URL,
by default the SQLite file `recallq run` writes), so runs scored locally can be listed,
compared and gated the same way. `submit` always needs an API (by default on 127.0.0.1:8000).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from recallq import display, gates
from recallq.api_client import Client
from recallq.display import database_label
from recallq.gates import CommandError, Exit
from recallq.settings import Settings

if TYPE_CHECKING:
    from recallq.db import Database

DEFAULT_API_URL = "http://127.0.0.1:8000"
PROJECT = "default"  # the local database's one project


class Backend(Protocol):
    """Where the client commands find runs: the API, or the local database."""

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]: ...

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]: ...

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]: ...

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]: ...

    def item(self, run_id: str, item_id: str) -> dict[str, Any]: ...

    def cancel(self, run_id: str) -> dict[str, Any]: ...

    def agreement(self, run_id: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ApiBackend:
    def __init__(self, client: Client) -> None:
        self.client = client

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]:
        return [run.view for run in self.client.runs(status=status, name=name, limit=limit)]

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]:
        return self.client.get(f"/v1/runs/{run_id}", {"by": by})

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]:
        params = {"format": format, "item_data": "true" if item_data else "false"}
        return self.client.stream(f"/v1/runs/{run_id}/results", params)

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]:
        return self.client.compare(base, candidate, by=by)

    def item(self, run_id: str, item_id: str) -> dict[str, Any]:
        return self.client.get(f"/v1/runs/{run_id}/items/{quote(item_id, safe='')}")

    def cancel(self, run_id: str) -> dict[str, Any]:
        return self.client.post(f"/v1/runs/{run_id}/cancel")

    def agreement(self, run_id: str) -> dict[str, Any]:
        return self.client.get(f"/v1/runs/{run_id}/agreement")

    def close(self) -> None:
        self.client.close()


class LocalBackend:
    def __init__(self, settings: Settings, database: Database | None = None) -> None:
        from recallq.local_commands import open_local_database

        self.settings = settings
        self.database = database or open_local_database(settings)

    def _run(self, session: Any, run_id: str) -> Any:
        from recallq.tables import Run

        run = session.get(Run, run_id)
        if run is None or run.project != PROJECT:
            raise CommandError(
                f"run {run_id} not found in the local database "
                f"{database_label(self.settings.database_url)} (a run of a service: pass "
                "--api URL or set RECALLQ_API_URL)"
            )
        return run

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]:
        from recallq import queries

        with self.database.session() as session:
            views, _ = queries.list_runs(session, PROJECT, status=status, name=name, limit=limit)
        return views

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]:
        from recallq import queries

        with self.database.session() as session:
            view = queries.run_view(session, self._run(session, run_id))
            if by is not None:
                view["by_group"] = queries.group_summary(session, run_id, by)
        return view

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]:
        from recallq import export, queries

        with self.database.session() as session:
            self._run(session, run_id)
        with self.database.session() as session:
            results = queries.iter_results(session, run_id, item_data=item_data)
            for line in export.lines(results, format):
                yield line.encode()

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]:
        from recallq import queries

        with self.database.session() as session:
            base_run, candidate_run = self._run(session, base), self._run(session, candidate)
            try:
                return queries.compare_runs(session, base_run, candidate_run, by)
            except queries.IncomparableRuns as exc:
                raise CommandError(str(exc)) from None

    def item(self, run_id: str, item_id: str) -> dict[str, Any]:
        from recallq import queries

        with self.database.session() as session:
            self._run(session, run_id)
            found = queries.get_item(session, run_id, item_id)
        if found is None:
            raise CommandError(f"item {item_id} not found in run {run_id}")
        return found

    def cancel(self, run_id: str) -> dict[str, Any]:
        from recallq.store import stores_for

        _, runs = stores_for(self.database, self.settings)
        runs.cancel(run_id, PROJECT)
        return self.view(run_id)

    def agreement(self, run_id: str) -> dict[str, Any]:
        from recallq import labels

        with self.database.session() as session:
            return labels.agreement_view(session, self._run(session, run_id))

    def close(self) -> None:
        self.database.dispose()


def api_url(args: argparse.Namespace, settings: Settings) -> str | None:
    """The API these commands talk to: --api, else RECALLQ_API_URL, else none (local)."""
    url: str | None = getattr(args, "api", None) or settings.api_url
    return url


def open_backend(args: argparse.Namespace) -> Backend:
    settings = Settings()
    url = api_url(args, settings)
    if url:
        return ApiBackend(Client(url, settings.api_key))
    return LocalBackend(settings)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


# --- commands --------------------------------------------------------------------------------


def submit(args: argparse.Namespace) -> int:
    """Send a file to the API as a new run; with --wait, poll until it ends and exit as
    `recallq run` does (run id on stderr, the final run object on stdout)."""
    from recallq import dataset

    if not args.file.exists():
        raise CommandError(f"no such file: {args.file}")
    if args.file.is_dir():
        raise CommandError(f"{args.file} is a directory, not a dataset file")
    mapping = dataset.parse_mapping(args.map or [])
    settings = Settings()
    with Client(api_url(args, settings) or DEFAULT_API_URL, settings.api_key) as client:
        run = client.submit(
            args.file,
            model=args.model,
            name=args.name,
            scale=args.scale,
            context=args.context,
            context_extractor=args.context_extractor,
            mapping=mapping,
            progress=not args.quiet,
            mode="batch" if args.batch else None,
        )
        if not args.wait:
            print(run.id)
            return Exit.OK
        print(f"recallq: run {run.id}", file=sys.stderr)
        try:
            view = run.wait(progress=not args.quiet)
        except KeyboardInterrupt:
            print(
                f"\nrecallq: stopped waiting; run {run.id} goes on on the service "
                f"(recallq status {run.id})",
                file=sys.stderr,
            )
            return Exit.INTERRUPTED
    _print_json(view)
    thresholds = gates.Gate.of(args)
    code, reasons = gates.exit_code(view, thresholds)
    for reason in reasons:
        print(f"recallq: {reason}", file=sys.stderr)
    if code == Exit.OK and (thresholds.min_score is not None or thresholds.max_failed is not None):
        print(gates.passed_line(view, thresholds), file=sys.stderr)
    return code


def runs(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    try:
        views = backend.runs(args.status, args.name, args.limit)
    finally:
        backend.close()
    if args.json:
        _print_json(views)
    else:
        for line in display.runs_table(views):
            print(line)
    return Exit.OK


def status(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    try:
        view = backend.view(args.run_id, args.by)
    finally:
        backend.close()
    if args.json:
        _print_json(view)
        return Exit.OK
    lines = display.summary_lines(
        view, title="recallq status", by=args.by, groups=view.get("by_group")
    )
    for line in lines:
        print(line)
    return Exit.OK


def results(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    out = args.out.open("wb") if args.out else sys.stdout.buffer
    try:
        for chunk in backend.results(args.run_id, args.format, not args.no_item_data):
            out.write(chunk)
        out.flush()  # here, where a closed pipe is caught, not at interpreter exit
    finally:
        backend.close()
        if args.out:
            out.close()
    return Exit.OK


def compare(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    try:
        result = backend.compare(args.base, args.candidate, args.by)
    finally:
        backend.close()
    if args.json:
        _print_json(result)
    else:
        for line in display.compare_lines(result):
            print(line)
    return Exit.OK


def report(args: argparse.Namespace) -> int:
    """Write a run's self-contained HTML report (with --compare, against that run as base)."""
    backend = open_backend(args)
    try:
        path = write_report(backend, args.run_id, args.out, base=args.compare, lowest=args.lowest)
    finally:
        backend.close()
    print(f"recallq: report written to {path} (one file; open it in a browser, no server needed)")
    return Exit.OK


def write_report(
    backend: Backend, run_id: str, out: Path | None, *, base: str | None, lowest: int
) -> Path:
    """Gather what a report shows through `backend` (the API or the local database: the same
    answers as `recallq status` and `recallq compare`) and write it to `out`."""
    import heapq

    from recallq.viewer import report as html_report

    target = out or Path(f"recallq-report-{run_id}.html")
    if not target.parent.is_dir():
        raise CommandError(f"cannot write {target}: {target.parent} is not a directory")
    view = backend.view(run_id)
    comparison = backend.compare(base, run_id, None) if base is not None else None
    # Scores come from the results stream without item data (one pass, even over a 100k-item
    # run); only the items shown are then read in full.
    scores = _scores(backend, run_id)
    picked = heapq.nsmallest(lowest, ((s, i, key) for key, (i, s) in scores.items()))
    items = [backend.item(run_id, key) for _, _, key in picked]
    pairs: list[tuple[str, float, float]] = []
    if base is not None:
        base_scores = _scores(backend, base)
        pairs = [
            (key, base_scores[key][1], score)
            for key, (_, score) in scores.items()
            if key in base_scores
        ]
    agreement = backend.agreement(run_id)
    page = html_report.render(view, items, comparison, pairs, agreement=agreement)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)
    return target


def _scores(backend: Backend, run_id: str) -> dict[str, tuple[int, float]]:
    """Item id -> (index, score) of a run's scored items."""
    scores = {}
    for line in _lines(backend.results(run_id, "jsonl", item_data=False)):
        item = json.loads(line)
        if item["score"] is not None:
            scores[item["id"]] = (item["index"], item["score"])
    return scores


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The non-blank lines of a stream whose chunks end anywhere."""
    rest = b""
    for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


def gate(args: argparse.Namespace) -> int:
    """Exit 0 when the run passes, 1 (saying which threshold it missed) when it does not."""
    backend = open_backend(args)
    try:
        view = backend.view(args.run_id)
    finally:
        backend.close()
    thresholds = gates.Gate.of(args)
    code, reasons = gates.exit_code(view, thresholds)
    for reason in reasons:
        print(f"recallq: gate failed: {reason}", file=sys.stderr)
    if code == Exit.OK:
        print(gates.passed_line(view, thresholds))
    return code


def cancel(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    try:
        _print_json(backend.cancel(args.run_id))
    finally:
        backend.close()
    return Exit.OK


def retry(args: argparse.Namespace) -> int:
    """Re-queue failed items: on the service, or scored here for a local run."""
    settings = Settings()
    url = api_url(args, settings)
    if url is None:
        from recallq.local_commands import continue_run

        return continue_run(args, settings, "retry")
    with Client(url, settings.api_key) as client:
        _print_json(client.post(f"/v1/runs/{args.run_id}/retry"))
    return Exit.OK


def resume(args: argparse.Namespace) -> int:
    """Continue a local run that was interrupted (the same as running its command again)."""
    settings = Settings()
    if api_url(args, settings) is not None:
        raise CommandError(
            "resume continues an interrupted local run; a service run goes on by itself "
            "(its workers pick up lost work), and `recallq retry RUN` re-queues failed items"
        )
    from recallq.local_commands import continue_run

    return continue_run(args, settings, "resume")


def quiet_broken_pipe() -> None:
    """stdout went away (`| head`): end quietly."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
