"""Where the CLI's client commands find runs: the API (`--api URL` or RECALLQ_API_URL, with
RECALLQ_API_KEY as its bearer key), or else the local database (RECALLQ_DATABASE_URL, by
default the SQLite file `recallq run` writes), so runs scored locally can be listed,
compared and gated the same way."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from recallq import export, labels, local, queries
from recallq.client import Client
from recallq.db import Database, is_sqlite
from recallq.display import database_label
from recallq.gates import CommandError
from recallq.groups import UnknownField
from recallq.runs import RunService, compare_with_labels
from recallq.settings import Settings
from recallq.tables import Run

DEFAULT_API_URL = "http://127.0.0.1:8000"
PROJECT = local.PROJECT


class Backend(Protocol):
    """Where the client commands find runs: the API, or the local database."""

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]: ...

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]: ...

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]: ...

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]: ...

    def item(self, run_id: str, item_id: str) -> dict[str, Any]: ...

    def cancel(self, run_id: str) -> dict[str, Any]: ...

    #: Where the runs were looked for, for people: "the API at URL", "the local database F".
    where: str

    def agreement(self, run_id: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ApiBackend:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.where = f"the API at {client.api_url}"

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
        self.settings = settings
        self.database = database or open_local_database(settings)
        self.where = local_database(settings)

    def _run(self, session: Any, run_id: str) -> Any:
        run = session.get(Run, run_id)
        if run is None or run.project != PROJECT:
            raise CommandError(not_found(run_id, self.settings))
        return run

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]:
        with self.database.session() as session:
            views, _ = queries.list_runs(session, PROJECT, status=status, name=name, limit=limit)
            local.mark_interrupted(session, views)
        return views

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]:
        with self.database.session() as session:
            view = queries.run_view(session, self._run(session, run_id))
            local.mark_interrupted(session, [view])
            if by is not None:
                try:
                    view["by_group"] = queries.group_summary(session, run_id, by)
                except UnknownField as exc:
                    raise CommandError(str(exc)) from None
        return view

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]:
        with self.database.session() as session:
            self._run(session, run_id)
        with self.database.session() as session:
            results = queries.iter_results(session, run_id, item_data=item_data)
            for line in export.lines(results, format):
                yield line.encode()

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]:
        with self.database.session() as session:
            base_run, candidate_run = self._run(session, base), self._run(session, candidate)
            try:
                return compare_with_labels(session, base_run, candidate_run, by=by)
            except queries.IncomparableRuns as exc:
                raise CommandError(str(exc)) from None

    def item(self, run_id: str, item_id: str) -> dict[str, Any]:
        with self.database.session() as session:
            self._run(session, run_id)
            found = queries.get_item(session, run_id, item_id)
        if found is None:
            raise CommandError(f"item {item_id} not found in run {run_id}")
        return found

    def cancel(self, run_id: str) -> dict[str, Any]:
        with self.database.session() as session:
            self._run(session, run_id)
        runtime, runner = local.local_runtime(self.settings, 1)
        try:
            return RunService(runtime, local=True).cancel(run_id, PROJECT).view
        finally:
            runner.stop(wait=False)
            runtime.close()

    def agreement(self, run_id: str) -> dict[str, Any]:
        with self.database.session() as session:
            return labels.agreement_view(session, self._run(session, run_id))

    def close(self) -> None:
        self.database.dispose()


def add_api_option(parser: argparse.ArgumentParser, local: bool = True) -> None:
    """--api URL, and (for commands that can read the local database) --local."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--api",
        metavar="URL",
        help="the API to ask (default RECALLQ_API_URL; without either, the local database)",
    )
    if local:
        where.add_argument(
            "--local",
            action="store_true",
            help="read the local database, even when RECALLQ_API_URL is set",
        )


def api_url(args: argparse.Namespace, settings: Settings) -> str | None:
    """The API these commands talk to: --api, else RECALLQ_API_URL, else none (local); none
    with --local."""
    if getattr(args, "local", False):
        return None
    url: str | None = getattr(args, "api", None) or settings.api_url
    return url


@contextmanager
def open_backend(args: argparse.Namespace) -> Iterator[Backend]:
    """The API or the local database, closed when the command is done with it."""
    settings: Settings = args.settings
    url = api_url(args, settings)
    backend: Backend = ApiBackend(Client(url, settings.api_key)) if url else LocalBackend(settings)
    try:
        yield backend
    finally:
        backend.close()


#: What a client command says when it read the local database: how to ask a service.
ASK_THE_SERVICE = "(a run of a service: pass --api URL or set RECALLQ_API_URL)"


def local_database(settings: Settings) -> str:
    return f"the local database {database_label(settings.database_url)}"


def not_found(run_id: str, settings: Settings) -> str:
    return f"run {run_id} not found in {local_database(settings)} {ASK_THE_SERVICE}"


def nothing_found(backend: Backend, what: str = "runs") -> str:
    """What a listing that found nothing says: where it looked, and how to look elsewhere."""
    hint = f" {ASK_THE_SERVICE}" if isinstance(backend, LocalBackend) else ""
    return f"no {what} in {backend.where}{hint}"


def open_local_database(settings: Settings) -> Database:
    """The local database the client commands read when no API is configured. A missing SQLite
    file is an error (reading must not create one); a SQLite file from an older recallq is
    upgraded, as `recallq run` would (a Postgres database is left to `recallq migrate`)."""
    from recallq import migrate  # here: alembic costs start-up only this path needs

    url = settings.database_url
    if is_sqlite(url):
        path = url.removeprefix("sqlite:///")
        if url.startswith("sqlite:///") and not Path(path).exists():
            raise CommandError(
                f"no local runs: {Path(path).resolve()} does not exist (`recallq run FILE` "
                "makes it; for a service pass --api URL or set RECALLQ_API_URL)"
            )
        migrate.upgrade(url)
    return Database(url)
