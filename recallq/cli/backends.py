"""Where the CLI's client commands find runs: the API (`--api URL` or RECALLQ_API_URL, with
RECALLQ_API_KEY as its bearer key), or else the local database (RECALLQ_DATABASE_URL, by
default the SQLite file `recallq run` writes), so runs scored locally can be listed,
compared and gated the same way. What only one of them or one command needs (the HTTP
client, the run service, exports) is imported where it is used."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from recallq.core.exits import CommandError
from recallq.core.groups import UnknownField
from recallq.labels.store import LabelError
from recallq.runs import comparisons, local
from recallq.runs.reads import RunReads
from recallq.settings import Settings
from recallq.state.db import Database, is_sqlite
from recallq.state.runs import RunNotFound
from recallq.viewer.text import database_label

if TYPE_CHECKING:
    from recallq.client import Client, Run

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
    """The local database, read through the same run and label services as the API."""

    def __init__(self, settings: Settings, database: Database | None = None) -> None:
        self.settings = settings
        self.database = database or open_local_database(settings)
        self.where = local_database(settings)
        self.reads = RunReads(self.database, local=True)

    @contextmanager
    def _answering(self) -> Iterator[None]:
        """The services' errors as the CLI's one line."""
        try:
            yield
        except RunNotFound as exc:
            raise CommandError(not_found(exc.run_id, self.settings)) from None
        except (UnknownField, comparisons.IncomparableRuns, LabelError) as exc:
            raise CommandError(str(exc)) from None

    def runs(self, status: str | None, name: str | None, limit: int) -> list[dict[str, Any]]:
        views, _ = self.reads.list_runs(PROJECT, status=status, name=name, limit=limit)
        return views

    def view(self, run_id: str, by: str | None = None) -> dict[str, Any]:
        with self._answering():
            return self.reads.view(run_id, PROJECT, by=by)

    def results(self, run_id: str, format: str, item_data: bool) -> Iterator[bytes]:
        from recallq.core import export

        with self._answering():
            self.reads.run(run_id, PROJECT)
        csv_fields = format == "csv" and item_data
        fields = self.reads.metadata_fields(run_id, PROJECT, every=True) if csv_fields else []
        after: int | None = None
        first = True
        while True:
            page, after = self.reads.results(run_id, after, 500, item_data)
            for line in export.lines(page, format, header=first, metadata_fields=fields):
                yield line.encode()
            first = False
            if after is None:
                return

    def compare(self, base: str, candidate: str, by: str | None) -> dict[str, Any]:
        with self._answering():
            return self.reads.compare(base, candidate, PROJECT, by=by)

    def item(self, run_id: str, item_id: str) -> dict[str, Any]:
        with self._answering():
            found = self.reads.item(run_id, PROJECT, item_id)
        if found is None:
            raise CommandError(f"item {item_id} not found in run {run_id}")
        return found

    def cancel(self, run_id: str) -> dict[str, Any]:
        from recallq.runs.service import RunService

        with self._answering():
            self.reads.run(run_id, PROJECT)
        runtime, runner = local.local_runtime(self.settings, 1)
        try:
            return RunService(runtime, local=True).cancel(run_id, PROJECT).view
        finally:
            runner.stop(wait=False)
            runtime.close()

    def agreement(self, run_id: str) -> dict[str, Any]:
        from recallq.labels.service import LabelService

        with self._answering():
            return LabelService(self.database).agreement(run_id, PROJECT)

    def close(self) -> None:
        self.database.dispose()


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
    backend: Backend
    if url:
        from recallq.client import Client

        backend = ApiBackend(Client(url, settings.api_key))
    else:
        backend = LocalBackend(settings)
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
    from recallq.state import migrate  # here: alembic costs start-up only this path needs

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


#: A whole run id's length (a UUID): no look-up for it.
RUN_ID_LENGTH = 36


def expand_run_ids(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Run ids given as the unique start of one (`recallq status e59e79be`) made whole, on
    the local database. An API is asked for whole ids only: the contract's routes take a
    run's id, and listing a project's runs to match a prefix is not a read to make per
    command. An id that matches nothing is left as given, for the command to report.
    `names`: the arguments that name runs (recallq.cli.parser.RUN_ID_ARGUMENTS)."""
    from recallq.runs.reads import AmbiguousRunId

    settings: Settings = args.settings
    if api_url(args, settings) is not None:
        return
    short = [
        name
        for name in names
        if isinstance(getattr(args, name, None), str) and len(getattr(args, name)) < RUN_ID_LENGTH
    ]
    url = settings.database_url
    if not short or (is_sqlite(url) and not Path(url.removeprefix("sqlite:///")).exists()):
        return
    database = Database(url)
    try:
        reads = RunReads(database, local=True)
        for name in short:
            setattr(args, name, reads.expand_id(getattr(args, name), PROJECT))
    except AmbiguousRunId as exc:
        raise CommandError(f"{exc}: give more of it") from None
    finally:
        database.dispose()


def wait_for_service_run(run: Run, quiet: bool) -> dict[str, Any] | None:
    """Poll a run the service scores until it ends; its final view, or None when the user
    stopped waiting (Ctrl-C: the run goes on on the service, and the command says so)."""
    print(f"recallq: run {run.id}", file=sys.stderr)
    try:
        return run.wait(progress=not quiet)
    except KeyboardInterrupt:
        print(
            f"\nrecallq: stopped waiting; run {run.id} goes on on the service "
            f"(recallq status {run.id})",
            file=sys.stderr,
        )
        return None
