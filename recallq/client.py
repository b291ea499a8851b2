"""`recallq.Client`: the HTTP API from Python (scripts, notebooks, the CLI's client commands).

Synchronous (httpx), so it runs the same in a script, a worker thread or a Jupyter cell, where
an event loop is already running. Every request carries `Authorization: Bearer <api_key>`
when a key is given (by default RECALLQ_API_KEY).

    client = recallq.Client("http://127.0.0.1:8000")
    run = client.submit("data.jsonl", model="gpt-4o-mini")
    run.wait()
    frame = run.to_pandas()
"""

from __future__ import annotations

import json
import sys
import time
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any
from urllib.parse import quote

import httpx

from recallq.core.status import RUN_ENDED
from recallq.results import claims_frame, items_frame
from recallq.viewer import text as display

NDJSON = "application/x-ndjson"
#: Run statuses after which nothing changes by itself.
ENDED = RUN_ENDED

#: How long a refused connection is tried again: an API started a moment ago in the same
#: script (`recallq api &` and then `recallq submit`) takes a second or two to listen.
CONNECT_PATIENCE_S = 10.0


class _PatientTransport(httpx.HTTPTransport):
    """Tries a refused connection again until CONNECT_PATIENCE_S has passed. Nothing of the
    request has been sent when the connection is refused, so even a streamed body is safe."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + CONNECT_PATIENCE_S
        while True:
            try:
                return super().handle_request(request)
            except httpx.ConnectError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.25)


class ApiError(Exception):
    """An error answer of the API: its HTTP status and the body's error code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def base_url(url: str) -> str:
    """The API's root: a trailing slash or `/v1` (as people copy it from the routes) is
    dropped, so `http://host:8000/v1/` and `http://host:8000` are the same API."""
    url = url.strip().rstrip("/")
    return url.removesuffix("/v1").rstrip("/")


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    response.read()
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:300].strip() or response.reason_phrase
    raise ApiError(response.status_code, code, message)


class Client:
    """The recallq HTTP API at `api_url` (e.g. `http://127.0.0.1:8000`)."""

    def __init__(self, api_url: str, api_key: str | None = None, *, timeout: float = 60.0) -> None:
        if api_key is None:
            from recallq.settings import read_client_settings  # pydantic-settings when needed

            api_key = read_client_settings().api_key  # the documented default
        self.api_url = base_url(api_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.api_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, read=max(timeout, 600.0)),
            transport=_PatientTransport(),
        )
        # a client dropped without close() (a notebook's `client = Client(...)`) closes its
        # pooled connections when it is collected, not as a ResourceWarning: unclosed socket
        self._closer = weakref.finalize(self, self._http.close)

    # --- runs ---------------------------------------------------------------------------------

    def submit(
        self,
        data: Any,
        model: str | None = None,
        *,
        name: str | None = None,
        scale: float | None = None,
        context: list[str] | str | None = None,
        context_extractor: dict[str, Any] | None = None,
        mapping: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        progress: bool = False,
        mode: str | None = None,
        retry_deadline_s: float | None = None,
        claims_from: str | None = None,
        precision: str | None = None,
    ) -> Run:
        """Send a dataset as a new run; returns it as soon as the API stored it.

        `data` is what `recallq.evaluate` takes (a path, a list of dicts, a DataFrame); it is
        read here, field aliases and `mapping` applied, and streamed as NDJSON, so a file of
        any size is sent in constant memory. `claims_from`: an earlier run whose items'
        claims this run's items take (by id) and only attribute. An error in the data raises
        recallq.runs.dataset.DatasetError, naming the file and line.
        """
        from os import PathLike
        from pathlib import Path

        from recallq.runs import dataset

        if name is None and isinstance(data, str | PathLike):
            name = Path(data).name
        params: dict[str, Any] = {
            "model": model,
            "name": name,
            "scale": scale,
            "mode": mode,
            "retry_deadline_s": retry_deadline_s,
            "claims_from": claims_from,
            "precision": precision,
        }
        if context is not None:
            params["context"] = json.dumps(context)
        if context_extractor is not None:
            params["context_extractor"] = json.dumps(context_extractor)
        params = {key: value for key, value in params.items() if value is not None}
        items = dataset.items_from(data, mapping=mapping)
        headers = {"Content-Type": NDJSON}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        response = self._http.post(
            "/v1/runs", params=params, content=_ndjson(items, progress), headers=headers
        )
        _raise_for(response)
        view = response.json()
        return Run(self, view["id"], view)

    def run(self, run_id: str) -> Run:
        """A run by id (fetched now: an unknown id raises ApiError 404)."""
        run = Run(self, run_id)
        run.status()
        return run

    def runs(
        self, status: str | None = None, name: str | None = None, limit: int | None = None
    ) -> list[Run]:
        """The project's runs, newest first (all of them, or the first `limit`)."""
        found: list[Run] = []
        cursor: str | None = None
        while limit is None or len(found) < limit:
            page_size = 100 if limit is None else min(100, limit - len(found))
            params = {"status": status, "name": name, "limit": page_size, "cursor": cursor}
            page = self.get("/v1/runs", params)
            found += [Run(self, view["id"], view) for view in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        return found

    def compare(
        self, base: Run | str, candidate: Run | str, by: str | None = None, top: int = 10
    ) -> dict[str, Any]:
        """`candidate` against `base`, items paired by id (the body of GET /v1/compare)."""
        params = {"base": _run_id(base), "candidate": _run_id(candidate), "by": by, "top": top}
        return self.get("/v1/compare", params)

    # --- plumbing -------------------------------------------------------------------------

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JSON object a GET answers (every route answers an object)."""
        response = self._http.get(path, params=_present(params))
        _raise_for(response)
        body: dict[str, Any] = response.json()
        return body

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self._http.post(path, json=body) if body else self._http.post(path)
        _raise_for(response)
        answer: dict[str, Any] = response.json()
        return answer

    def send(self, method: str, path: str, **request: Any) -> httpx.Response:
        """Any request (a body, another method), its error answer raised as ApiError."""
        response = self._http.request(method, path, **request)
        _raise_for(response)
        return response

    def delete_run(self, run_id: str) -> None:
        """Remove an ended run with its items and claims (an admin key)."""
        _raise_for(self._http.delete(f"/v1/runs/{quote(run_id, safe='')}"))

    def stream(self, path: str, params: dict[str, Any] | None = None) -> Iterator[bytes]:
        """The body of a GET, chunk by chunk (results of any size)."""
        with self._http.stream("GET", path, params=_present(params)) as response:
            _raise_for(response)
            yield from response.iter_bytes()

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.api_url!r})"


class Run:
    """A run on the service. `view` is the run object as last fetched."""

    def __init__(self, client: Client, run_id: str, view: dict[str, Any] | None = None) -> None:
        self.client, self.id = client, run_id
        self.view: dict[str, Any] = view or {}

    def status(self) -> dict[str, Any]:
        """The run object now (status, counts, summary, usage, ...)."""
        self.view = self.client.get(f"/v1/runs/{self.id}")
        return self.view

    def wait(
        self,
        progress: bool = True,
        poll: float = 1.0,
        timeout: float | None = None,
        stream: IO[str] | None = None,
    ) -> dict[str, Any]:
        """Poll until the run has ended (completed or cancelled); returns its run object. With
        `progress`, a line on stderr says how far it is (and when it is paused, why)."""
        shown = display.ProgressLine(stream or sys.stderr) if progress else None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            view = self.status()
            ended = view["status"] in ENDED
            if shown is not None:
                shown.show(display.progress_line(view), last=ended)
            if ended:
                return view
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} has not ended: {display.progress_line(view)}")
            time.sleep(poll)

    def items(
        self, status: str | None = None, item_data: bool = True, page_size: int = 100
    ) -> list[dict[str, Any]]:
        """The run's items with their claims, in index order, as a list (iter_items streams
        them a page at a time; results() in one response)."""
        return list(self.iter_items(status, item_data, page_size))

    def iter_items(
        self, status: str | None = None, item_data: bool = True, page_size: int = 100
    ) -> Iterator[dict[str, Any]]:
        """The run's items with their claims, in index order, fetched a page at a time."""
        cursor: str | None = None
        while True:
            params = {"status": status, "limit": page_size, "cursor": cursor}
            params["item_data"] = "true" if item_data else "false"
            page = self.client.get(f"/v1/runs/{self.id}/items", params)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def results(self, item_data: bool = True) -> Iterator[dict[str, Any]]:
        """Every item with its claims, streamed in one response (faster than items())."""
        params = {"format": "jsonl", "item_data": "true" if item_data else "false"}
        buffer = b""
        for chunk in self.client.stream(f"/v1/runs/{self.id}/results", params):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
        if buffer.strip():
            yield json.loads(buffer)

    def to_pandas(self, item_data: bool = True) -> Any:
        """A DataFrame with one row per item (the columns of Result.to_pandas)."""
        return items_frame(self.results(item_data), item_data)

    def claims_to_pandas(self) -> Any:
        """A DataFrame with one row per claim."""
        return claims_frame(self.results(item_data=False))

    def cancel(self) -> dict[str, Any]:
        self.view = self.client.post(f"/v1/runs/{self.id}/cancel")
        return self.view

    def retry(self) -> dict[str, Any]:
        """Re-queue the run's failed items."""
        self.view = self.client.post(f"/v1/runs/{self.id}/retry")
        return self.view

    def __repr__(self) -> str:
        status = self.view.get("status", "?")
        return f"Run(id={self.id!r}, status={status!r})"


def _run_id(run: Run | str) -> str:
    return run.id if isinstance(run, Run) else run


def _present(params: dict[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (params or {}).items() if value is not None}


def _ndjson(items: Iterator[dict[str, Any]], progress: bool) -> Iterator[bytes]:
    """Items as NDJSON, a batch of lines per chunk."""
    from tqdm import tqdm

    # a bar on a terminal only: in a log file its carriage returns run into one line
    shown = progress and display.redraws(sys.stderr)
    with tqdm(unit="item", desc="upload", file=sys.stderr, disable=not shown) as bar:
        batch: list[str] = []
        for item in items:
            batch.append(json.dumps(item, ensure_ascii=False))
            if len(batch) >= 500:
                bar.update(len(batch))
                yield ("\n".join(batch) + "\n").encode()
                batch = []
        if batch:
            bar.update(len(batch))
            yield ("\n".join(batch) + "\n").encode()
