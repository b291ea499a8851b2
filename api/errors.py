"""Every client error leaves as {"error": {"code", "message"}} with a 4xx status; anything
else as a 500 of the same shape that says nothing about the request or the server.

Failed requests are logged without their bodies (nothing here reads one), and every log line
is redacted where it is made (recallq.core.redact.install_log_redaction).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallq.core.groups import UnknownField
from recallq.runs.ingest import SubmissionError
from recallq.runs.quotas import QuotaExceeded
from recallq.runs.service import RunConflict
from recallq.state.runs import RunNotFound

log = logging.getLogger(__name__)

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


def install(app: FastAPI) -> None:
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
