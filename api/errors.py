"""Every client error leaves as {"error": {"code", "message"}} with a 4xx status; a request
the database could not answer (an outage) as a 503 with Retry-After, the outage logged once
when it starts and once when the database answers again; anything else as a 500 of the same
shape that says nothing about the request or the server.

Failed requests are logged without their bodies (nothing here reads one), and every log line
is redacted where it is made (recallq.core.redact.install_log_redaction).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallq.core.groups import UnknownField
from recallq.runs.ingest import SubmissionError
from recallq.runs.quotas import QuotaExceeded
from recallq.runs.service import RunConflict
from recallq.state.runs import RunNotFound

log = logging.getLogger(__name__)

#: Seconds a client is asked to wait (Retry-After) when the database is out, and between two
#: pings of it while it is.
OUTAGE_RETRY_AFTER = 5

STATUS_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    421: "misdirected_request",
    422: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


class HttpError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def not_found(what: str) -> HttpError:
    return HttpError(404, "not_found", f"{what} not found")


def _closing(request: Request, headers: dict[str, str] | None) -> dict[str, str] | None:
    """An error answering a request that came with a body ends the connection: the body may
    not have been read (a refusal comes before it is), and the server does not read on after
    its answer, so a client cannot make it drain gigabytes it has already refused."""
    has_body = request.headers.get("content-length", "0") != "0" or (
        "transfer-encoding" in request.headers
    )
    if has_body:
        return {**(headers or {}), "Connection": "close"}
    return headers


class DatabaseOutage:
    """The API's view of a database outage: the first request that fails on it logs one line
    and starts a ping every OUTAGE_RETRY_AFTER seconds; the ping that answers logs one line
    (how long, how many requests answered 503). Requests meanwhile are answered 503."""

    def __init__(self, ping: Callable[[], object]) -> None:
        self._ping = ping
        self.since: float | None = None
        self.refused = 0

    def failed(self, exc: Exception) -> None:
        self.refused += 1
        if self.since is not None:
            return
        self.since = time.monotonic()
        orig = getattr(exc, "orig", None)
        reason = " ".join(str(orig if orig is not None else exc).split())[:200]
        log.warning(
            "the database is unavailable (%s: %s): requests answer 503 until it is back",
            type(orig or exc).__name__,
            reason,
        )
        asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(OUTAGE_RETRY_AFTER)
            try:
                await run_in_threadpool(self._ping)
            except Exception:  # not yet
                continue
            since, self.since = self.since or time.monotonic(), None
            log.warning(
                "the database is back after %.0f s (%d request(s) answered 503)",
                time.monotonic() - since,
                self.refused,
            )
            self.refused = 0
            return


def install(app: FastAPI, ping: Callable[[], object] | None = None) -> None:
    """The error handlers; `ping` asks the database whether it answers (the runtime's)."""
    outage = DatabaseOutage(ping or (lambda: None))

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        outage.failed(exc)
        return error_response(
            503,
            "unavailable",
            "the database cannot be reached now; retry soon",
            _closing(request, {"Retry-After": str(OUTAGE_RETRY_AFTER)}),
        )

    @app.exception_handler(HttpError)
    async def _api_error(request: Request, exc: HttpError) -> JSONResponse:
        headers = _closing(request, exc.headers)
        return error_response(exc.status, exc.code, exc.message, headers)

    @app.exception_handler(SubmissionError)
    async def _submission_error(request: Request, exc: SubmissionError) -> JSONResponse:
        headers = None
        if isinstance(exc, QuotaExceeded):
            headers = {"Retry-After": str(exc.retry_after)}
        return error_response(exc.status, exc.code, exc.message, _closing(request, headers))

    @app.exception_handler(RunNotFound)
    async def _run_not_found(request: Request, exc: RunNotFound) -> JSONResponse:
        return error_response(404, "not_found", str(exc))

    @app.exception_handler(UnknownField)
    async def _unknown_field(request: Request, exc: UnknownField) -> JSONResponse:
        # the field a request names (`by=`) is not there, as a run another project holds is
        # not: which fields a run's items have is data, not something the schema can state
        return error_response(404, "unknown_field", str(exc))

    @app.exception_handler(RunConflict)
    async def _run_conflict(request: Request, exc: RunConflict) -> JSONResponse:
        return error_response(409, exc.code, exc.message, _closing(request, None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid')}"
        return error_response(422, "invalid_request", message, _closing(request, None))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = STATUS_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # what failed and where, never the request's body or parameters
        log.error(
            "%s %s failed: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc
        )
        return error_response(500, "internal_error", "the server failed; it has been logged")
